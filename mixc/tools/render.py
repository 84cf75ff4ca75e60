"""`mixc explain` for people: the report (`mixc.tools.report.Explanation`) as rich text."""

from __future__ import annotations

from mixc.tools.report import CostInfo, Explanation, GroupCostInfo, StateInfo, TotalCostInfo

__all__ = ["render"]


class _Printer:
    """The console, and the three shapes the report is printed in: headings, indented lines
    and tables."""

    def __init__(self, console) -> None:
        self.console = console

    def print(self, *args, **kwargs) -> None:
        self.console.print(*args, **kwargs)

    def heading(self, text: str) -> None:
        from rich.text import Text

        self.console.print()
        self.console.print(Text(text, style="bold underline"))

    def line(self, text: str, style: str = "", indent: int = 2) -> None:
        from rich.text import Text

        self.console.print(Text(" " * indent + text, style=style), soft_wrap=True)

    def table(self, *columns: str):
        from rich import box
        from rich.table import Table

        t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1))
        for c in columns:
            t.add_column(c, overflow="fold")
        return t


def render(
    report: Explanation, file=None, color: bool | None = None, width: int | None = None
) -> None:
    """Print the report with rich: tables and colour on a terminal, plain text when piped."""
    from rich.console import Console

    console = Console(
        file=file,
        force_terminal=color,
        no_color=color is False,
        highlight=False,
        emoji=False,
        width=width,
    )
    if not console.is_terminal and width is None:
        console.width = 120
    out = _Printer(console)
    _render_title(out, report)
    _render_arguments(out, report)
    _render_states(out, report)
    _render_outputs(out, report)
    _render_plan(out, report)
    _render_parallel_form(out, report)
    _render_warnings(out, report)
    _render_costs(out, report.costs)


def _render_title(out: _Printer, report: Explanation) -> None:
    from rich.text import Text

    title = Text(report.mixer, style="bold cyan")
    if report.description:
        title.append(f" - {report.description}", style="bold")
    title.append(f"  ({report.source})", style="dim")
    out.print(title, soft_wrap=True)


def _render_arguments(out: _Printer, report: Explanation) -> None:
    """Inputs, parameters and derived per-token values."""
    out.heading("Inputs (per token, per head)")
    t = out.table("name", "shape", "kind", "tensor", "role")
    for i in report.inputs:
        shape = "[" + ", ".join(i.shape) + "]" if i.shape else "scalar"
        kind = {
            "scalar": "scalar per token",
            "vector": "per channel",
            "matrix": "matrix per token",
        }[i.kind]
        t.add_row(i.name, shape, kind, i.layout, ", ".join(i.roles) or "-")
    out.print(t)
    if report.params:
        out.heading("Parameters (per head)")
        t = out.table("name", "shape", "default", "tensor")
        for p in report.params:
            shape = "[" + ", ".join(p.shape) + "]" if p.shape else "scalar"
            t.add_row(p.name, shape, p.default or "none: the caller supplies it", p.layout)
        out.print(t)
    derived = [v for v in report.values if not v.is_output]
    if derived:
        out.heading("Derived per-token values")
        for v in derived:
            out.line(f"{v.name}_t = {v.expr}")


def _render_states(out: _Printer, report: Explanation) -> None:
    out.heading("States")
    for s in report.states:
        _render_state(out, s)


def _render_state(out: _Printer, s: StateInfo) -> None:
    """One state: class and rule, update, write, erase (delta rule), log-gates, NYI reason."""
    from rich.text import Text

    head = Text(f"  {s.name}" + (f" [{', '.join(s.shape)}]" if s.shape else ""), style="bold")
    head.append(f": {s.transition_class}", style="green" if s.chunkable else "red")
    head.append(f"  (rule {s.rule}: {s.rule_description})")
    out.print(head, soft_wrap=True)
    out.line(f"update:   {s.update}", indent=4)
    if s.backward:
        out.line(
            f"runs backward in time: {s.name} starts after the last token (its initial state) "
            "and ends at the first (its final state); the mixer is non-causal",
            indent=4,
        )
    if s.transposed:
        out.line(f"transposed: {s.transposed}", indent=4)
    if s.writes:
        parts = [
            f"value {w.value if w.value is not None else '1 (vector state)'}, key {w.key}, "
            f"scale {w.scale if w.scale is not None else '1'}"
            for w in s.writes
        ]
        out.line(f"write:    rank {s.write_rank}: " + "; ".join(parts), indent=4)
    else:
        out.line(f"write:    {s.write_form}", indent=4)
    if s.beta is not None:
        out.line(f"erase:    I - β k k^T with β = {s.beta}, k = {s.erase_key}", indent=4)
    if s.stability:
        style = "" if s.stability.startswith("stable:") else "yellow"
        out.line(f"          {s.stability}", style=style, indent=4)
    for g in s.gates:
        mark = "proven in (0, 1]" if g.proven else "NOT proven in (0, 1]"
        out.line(
            f"log-gate: {g.side}: {g.decay} -> {g.log}   {mark}: {g.note}",
            style="" if g.proven else "yellow",
            indent=4,
        )
    if s.reason:
        out.line(f"no chunked form: {s.reason}", style="red", indent=4)


def _render_outputs(out: _Printer, report: Explanation) -> None:
    out.heading("Outputs")
    for o in report.outputs:
        out.line(f"{o.equation}", style="bold")
        out.line(f"form: {o.form}   {o.name} = {o.expr}", indent=4)
        for r in o.readouts:
            out.line(f"_r{r.index} = {r.expr}", indent=6)
        if o.skip:
            out.line(f"skip (outside the recurrence): {o.skip}", indent=4)


def _render_plan(out: _Printer, report: Explanation) -> None:
    """Evaluation order, groups, the algorithm and why, what is not supported."""
    out.heading("Plan")
    targets = {v.name for v in report.values} | {s.name for s in report.states}
    order = " -> ".join(n for n in report.order if n in targets)
    out.line(f"evaluation order in a step: {order}")
    out.line(
        "groups (one chunked pass each): "
        + ", ".join("(" + ", ".join(g.states) + ")" for g in report.groups)
    )
    style = "bold green" if report.chunkable else "bold red"
    out.line(f"algorithm: {report.algorithm}", style=style)
    for w in report.why:
        out.line(f"why: {w}", indent=4)
    if report.chunk_size is not None:
        size = report.chunk_size
        out.line(f"chunk size: {size.size} by default ({size.why})")
    out.line("forms: " + ", ".join(f.name for f in report.forms if f.available))
    for f in report.forms:
        if not f.available and report.chunkable:  # else the reason is the one below
            out.line(f"no {f.name}: {f.reason}", indent=4)
    checked = [f.name for f in report.forms if f.checks]
    if checked:
        check = next(f.checks for f in report.forms if f.checks)
        out.line(f"{', '.join(checked)} check at run time {check}", style="yellow", indent=4)
    out.line("not supported: nothing" if not report.not_supported else "not supported:")
    for n in report.not_supported:
        out.line(n, style="red", indent=4)
    if not report.chunkable:
        out.line(
            "sequential only: compile gives recurrent() and step(); chunk() raises NYI", style="red"
        )
    if report.backend_notes:
        out.line(f"kernels on the {report.backend} backend:")
        for note in report.backend_notes:
            out.line(note, indent=4)


def _render_parallel_form(out: _Printer, report: Explanation) -> None:
    out.heading("Parallel form (S = H^T, tokens are rows, S_0 the incoming state)")
    for text in report.parallel_form:
        out.line(text, indent=2)
    for g in report.groups:
        if g.quadratic_form:
            out.line(f"quadratic [{', '.join(g.states)}]: {g.quadratic_form}", indent=2)


def _render_warnings(out: _Printer, report: Explanation) -> None:
    from rich.text import Text

    if report.warnings:
        out.heading(f"Warnings ({len(report.warnings)})")
        for w in report.warnings:
            out.print(Text(w.rendered, style="yellow"), soft_wrap=True)


def _render_costs(out: _Printer, c: CostInfo) -> None:
    """The cost table: each group's and the total FLOPs and bytes per form."""
    example = ",".join(f"{s}={4096 if s == c.sequence_symbol else 64}" for s in c.symbols)
    given = (
        ", ".join(f"{k}={v}" for k, v in c.sizes.items())
        or f"none (fill them with --sizes {example})"
    )
    out.heading("Cost per token and head")
    missing = f";  missing: {', '.join(c.missing)}" if c.missing and c.sizes else ""
    out.line(f"sizes: {given}" + missing)
    t = out.table("states", "form", "FLOPs", "", "bytes", "")
    for g in c.groups:
        _cost_rows(t, ", ".join(g.states), g)
    _cost_rows(t, "total", c.total)
    out.print(t)
    for g in c.groups:
        out.line(f"{', '.join(g.states)}: {g.note}", style="dim")
    out.line(
        f"bytes include inputs and outputs ({c.io_bytes.formula}); a multiply-add is 2 FLOPs",
        style="dim",
    )


def _cost_rows(t, label: str, c: GroupCostInfo | TotalCostInfo) -> None:
    """One row per form (recurrent, chunked, quadratic): formulas and their values."""
    for name, f in (("recurrent", c.recurrent), ("chunked", c.chunked), ("quadratic", c.quadratic)):
        if f is None:
            t.add_row(label, name, "n/a", "", "n/a", "")
        else:
            t.add_row(
                label,
                name,
                f.flops.formula,
                _num(f.flops.value),
                f.bytes.formula,
                _num(f.bytes.value),
            )


def _num(v: float | None) -> str:
    if v is None:
        return ""
    return f"= {v:,.0f}" if v >= 100 else f"= {v:.4g}"
