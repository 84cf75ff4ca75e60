"""`mixc graph`: a picture of a spec's dependency graph (PNG or SVG, chosen by the file suffix).

Columns from left to right: inputs and parameters, derived values, states, outputs. Each kind has
its own shape and colour; a read of the previous token (a lag-1 edge, always a state reading its
own previous value) is a dashed loop labelled "t-1". Each read is labelled with its role (key,
value, decay, erase, query, skip, ...: `edge_roles`), and a node shows its shape inside it, where
no arrow ends. Drawn with matplotlib, a dependency of mixc.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import networkx as nx

from mixc.analysis.plan import Plan
from mixc.analysis.roles import read_roles
from mixc.driver import output_file, write_atomically
from mixc.errors import MixcError

__all__ = ["FORMATS", "MAX_EDGES", "MAX_NODES", "draw", "edge_roles", "write_graph"]

#: File suffixes mixc graph writes.
FORMATS = (".png", ".svg")

#: kind -> (column, marker, face colour, legend label)
STYLES = {
    "input": (0, "s", "#cfe2ff", "input (per token)"),
    "param": (0, "D", "#e2e3e5", "parameter (per head)"),
    "value": (1, "o", "#ffffff", "derived value"),
    "state": (2, "h", "#ffd8a8", "state"),
    "output": (3, "o", "#c3e6cb", "output"),
}


#: The most nodes and edges a picture holds: a column of nodes is SPACING * 1.2 inches a node,
#: so a spec of thousands of names would be a picture of gigabytes, drawn for minutes. A real
#: spec has a few dozen of each; a larger one is refused before anything is drawn.
MAX_NODES = 100
MAX_EDGES = 300

#: The most characters of a name or shape in a node, of an edge's label and of the title: a
#: longer one is cut, and ends in "…" (a name may be 63,000 characters, a picture as wide).
NAME_WIDTH = 32
LABEL_WIDTH = 60
TITLE_WIDTH = 120

#: Vertical distance between nodes of one column (room for a t-1 loop and a shape label).
SPACING = 1.5

#: Colour of the reads of the previous token (t-1), and of the same token (t).
LAG_COLOUR = "#b35900"
SAME_COLOUR = "#555555"
#: Where a node's self-loop starts and ends, above its centre.
LOOP_HEIGHT = 0.16 * 0.9
#: How far (points) an arrow's ends stay from the centres of its nodes, and the bend of a read
#: of another node's previous value.
NODE_CLEARANCE = 24
LAG_BEND = 0.3
#: Where along its arc (0: source, 1: end) an edge's label sits.
LABEL_AT = 0.35


def _matplotlib():
    try:
        import matplotlib
        from matplotlib.figure import Figure
    except ImportError:
        raise MixcError(
            "mixc graph needs matplotlib, a dependency of mixc missing here: pip install matplotlib"
        ) from None
    return matplotlib, Figure


def edge_roles(plan: Plan) -> dict[tuple[str, str], tuple[str, ...]]:
    """The roles of each edge's read (`mixc.analysis.roles.read_roles`), as its label says
    them: "key" for a role for the edge's end, "query of H, z" for roles for other nodes."""
    out = {}
    for edge, roles in read_roles(plan).items():
        if plan.graph.has_edge(*edge):
            of: dict[str, list[str]] = {}
            for r in roles:
                of.setdefault(r.role, []).append(r.of)
            out[edge] = tuple(
                role if nodes == [edge[1]] else f"{role} of {', '.join(nodes)}"
                for role, nodes in of.items()
            )
    return out


def _positions(g: nx.DiGraph) -> dict[str, tuple[float, float]]:
    columns: dict[int, list[str]] = {}
    for node, data in g.nodes(data=True):
        columns.setdefault(STYLES[data["kind"]][0], []).append(node)
    used = sorted(columns)
    pos = {}
    for x, col in enumerate(used):
        nodes = columns[col]
        for i, node in enumerate(nodes):
            pos[node] = (float(x), SPACING * ((len(nodes) - 1) / 2 - i))
    return pos


def draw(plan: Plan, fmt: str) -> bytes:
    """The dependency graph of `plan` as PNG or SVG bytes (deterministic for SVG)."""
    _check_drawable(plan)
    matplotlib, Figure = _matplotlib()
    g = plan.graph
    pos = _positions(g)
    roles = edge_roles(plan)
    with matplotlib.rc_context({"svg.hashsalt": "mixc", "svg.fonttype": "none"}):
        fig = Figure(figsize=_figure_size(pos))
        ax = fig.add_subplot()
        ax.set_axis_off()
        _fit(ax, plan, pos)  # first: the edge labels are placed in display coordinates
        for a, b, data in g.edges(data=True):
            if a == b:
                _draw_loop(ax, pos[a])
                continue
            lag = data["lag"] == 1
            bend = LAG_BEND if lag else 0.08 if abs(pos[b][0] - pos[a][0]) <= 1 else 0.3
            _draw_arrow(ax, pos[a], pos[b], bend, lag)
            label = ", ".join((("t-1",) if lag else ()) + roles.get((a, b), ()))
            if label:
                _draw_edge_label(
                    ax,
                    pos[a],
                    pos[b],
                    bend,
                    _clip(label, LABEL_WIDTH),
                    LAG_COLOUR if lag else SAME_COLOUR,
                )
        _draw_nodes(ax, plan, pos)
        _draw_legend(ax, g)
        buf = io.BytesIO()
        meta = {"Date": None} if fmt == "svg" else {}
        fig.savefig(buf, format=fmt, bbox_inches="tight", metadata=meta or None, dpi=120)
    return buf.getvalue()


def _figure_size(pos: dict[str, tuple[float, float]]) -> tuple[float, float]:
    """Inches: room for the tallest column and for every column side by side, and the legend."""
    columns = {p[0] for p in pos.values()}
    tallest = max(sum(1 for p in pos.values() if p[0] == x) for x in columns)
    height = max(3.0, 1.2 * SPACING * tallest)
    width = max(5.0, 2.6 * (1 + max(p[0] for p in pos.values())))
    return width, height + 1.2


def _draw_loop(ax, at: tuple[float, float]) -> None:
    """A state reading its own previous value: a dashed loop over the node, labelled t-1."""
    from matplotlib.patches import FancyArrowPatch

    x, y = at
    arrow = FancyArrowPatch(
        (x - 0.08, y + LOOP_HEIGHT),
        (x + 0.08, y + LOOP_HEIGHT),
        connectionstyle="arc3,rad=-2.2",
        arrowstyle="-|>",
        mutation_scale=12,
        linestyle="--",
        color=LAG_COLOUR,
        linewidth=1.4,
    )
    ax.text(x, y + 0.5, "t-1", ha="center", va="bottom", fontsize=9, color=LAG_COLOUR)
    ax.add_patch(arrow)


def _draw_arrow(ax, start, end, bend: float, lag: bool) -> None:
    """A read: solid at the same token, dashed for the previous token, bent by `bend` (more
    when it skips a column), its ends kept off the nodes."""
    from matplotlib.patches import FancyArrowPatch

    arrow = FancyArrowPatch(
        start,
        end,
        connectionstyle=f"arc3,rad={bend}",
        arrowstyle="-|>",
        mutation_scale=12,
        linestyle="--" if lag else "-",
        color=LAG_COLOUR if lag else SAME_COLOUR,
        shrinkA=NODE_CLEARANCE,
        shrinkB=NODE_CLEARANCE,
        linewidth=1.0,
    )
    ax.add_patch(arrow)


def _draw_edge_label(ax, start, end, bend: float, label: str, colour: str) -> None:
    """The roles of a read, on a white patch on its arc, nearer its source (LABEL_AT of the
    way: edges that cross at their middles keep their labels apart). An `arc3` curve is a
    quadratic Bezier whose control point sits `bend` times the chord off its middle, in display
    coordinates."""
    (x0, y0), (x1, y1) = ax.transData.transform([start, end])
    cx, cy = (x0 + x1) / 2 + bend * (y1 - y0), (y0 + y1) / 2 - bend * (x1 - x0)
    t = LABEL_AT
    at = [
        (1 - t) ** 2 * a + 2 * t * (1 - t) * c + t**2 * b
        for a, c, b in ((x0, cx, x1), (y0, cy, y1))
    ]
    x, y = ax.transData.inverted().transform(at)
    ax.text(
        x,
        y,
        label,
        ha="center",
        va="center",
        fontsize=7,
        color=colour,
        zorder=5,
        bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none"},
    )


def _draw_nodes(ax, plan: Plan, pos: dict[str, tuple[float, float]]) -> None:
    """Each kind's nodes in its shape and colour (states larger, with a thicker edge), each
    labelled with its name and, below it, its shape."""
    g = plan.graph
    for kind, (_, marker, face, _label) in STYLES.items():
        nodes = [n for n, d in g.nodes(data=True) if d["kind"] == kind]
        if not nodes:
            continue
        ax.scatter(
            [pos[n][0] for n in nodes],
            [pos[n][1] for n in nodes],
            s=1500 if kind == "state" else 1100,
            marker=marker,
            c=face,
            edgecolors="#333333",
            linewidths=2.0 if kind == "state" else 1.0,
            zorder=3,
        )
        for n in nodes:
            x, y = pos[n]
            shape = _clip(_shape_text(plan, n), NAME_WIDTH)  # inside the node, under its name
            ax.text(
                x,
                y,
                _clip(n, NAME_WIDTH),
                ha="center",
                va="bottom" if shape else "center",
                fontsize=10,
                zorder=4,
            )
            if shape:
                ax.text(x, y, shape, ha="center", va="top", fontsize=7, color="#444444", zorder=4)


def _draw_legend(ax, g: nx.DiGraph) -> None:
    """Below the picture: the node kinds present, then the two kinds of edge."""
    from matplotlib.lines import Line2D

    handles = [
        Line2D(
            [],
            [],
            marker=m,
            linestyle="",
            markerfacecolor=f,
            markeredgecolor="#333333",
            markersize=10,
            label=lab,
        )
        for kind, (_, m, f, lab) in STYLES.items()
        if any(d["kind"] == kind for _, d in g.nodes(data=True))
    ]
    handles.append(Line2D([], [], color=SAME_COLOUR, label="same token (t)"))
    handles.append(Line2D([], [], color=LAG_COLOUR, linestyle="--", label="previous token (t-1)"))
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.02),
        ncol=4,
        fontsize=8,
        frameon=False,
    )


def _fit(ax, plan: Plan, pos: dict[str, tuple[float, float]]) -> None:
    """Limits with room for the loops and labels around the nodes, and the mixer as title."""
    xs = [p[0] for p in pos.values()]
    ys = [p[1] for p in pos.values()]
    ax.set_xlim(min(xs) - 0.6, max(xs) + 0.6)
    ax.set_ylim(min(ys) - 0.8, max(ys) + 1.0)
    title = plan.mixer.name + (f": {plan.mixer.description}" if plan.mixer.description else "")
    ax.set_title(_clip(title, TITLE_WIDTH), fontsize=11)


def _clip(text: str, width: int) -> str:
    """`text`, cut to `width` characters where it is longer (the last one then "…")."""
    return text if len(text) <= width else text[: width - 1] + "…"


def _shape_text(plan: Plan, name: str) -> str:
    m = plan.mixer
    for decl in (*m.inputs, *m.params, *m.states):
        if decl.name == name:
            return "[" + ", ".join(decl.shape) + "]" if decl.shape else ""
    shape = plan.spec.shapes.get(name)
    if shape is None or shape == ("1", "1"):
        return ""
    return "[" + ", ".join(d for d in shape if d != "1") + "]"


def _check_drawable(plan: Plan) -> None:
    """Refuses a graph with more than MAX_NODES nodes or MAX_EDGES edges, in one line."""
    g = plan.graph
    for what, count, most in (
        ("nodes", g.number_of_nodes(), MAX_NODES),
        ("edges", g.number_of_edges(), MAX_EDGES),
    ):
        if count > most:
            raise MixcError(
                f"{plan.spec.source.filename}: the dependency graph has {count:,} {what}, too "
                f"many to draw (at most {most}); `mixc explain` describes the spec in text"
            )


def write_graph(plan: Plan, path: str | os.PathLike) -> None:
    """Draw the graph into `path` (.png or .svg), atomically: never a partial file, and never
    over the spec it draws (`write_atomically`, whose refusals come before the drawing)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise MixcError(f"{path}: unknown picture format {suffix or '(none)'}; use .png or .svg")
    _check_drawable(plan)
    keep = [plan.spec.source.filename]
    output_file(path, keep)
    write_atomically(path, draw(plan, suffix[1:]), keep)
