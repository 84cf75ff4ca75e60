"""`mixc explain`: the facts of one spec as a report, for people (rich text) and tools (JSON).

`explain(spec, sizes)` turns `mixc.analysis.plan.Plan` into an `Explanation`, a pydantic model with stable
snake_case field names; `--json` prints it and `--json-schema` prints its schema. `render` prints
the same model as a readable report. Nothing here analyses the spec: every claim comes from the
facts, so the report and the compiled code cannot disagree.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from mixc.analysis.cost import Costs, FormCost, Formula, costs
from mixc.analysis.facts import OutputFacts, Readout, StateFacts
from mixc.analysis.plan import GroupPlan, Plan, analyze
from mixc.errors import Span
from mixc.frontend.ir import Binary, Expr, Name, Timed, walk
from mixc.frontend.spec import Spec

__all__ = ["SCHEMA_VERSION", "Explanation", "explain", "parallel_form", "render"]

#: Bumped when a field is renamed or removed or changes meaning (adding a field does not).
SCHEMA_VERSION = 1


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Location(_Model):
    """Where something is in the spec (1-based, inclusive)."""

    line: int = Field(description="Line of the first character.")
    column: int = Field(description="Column of the first character.")
    end_line: int = Field(description="Line of the last character.")
    end_column: int = Field(description="Column of the last character.")


class InputInfo(_Model):
    name: str = Field(description="Name as declared in `in`.")
    shape: list[str] = Field(description="Declared sizes; empty for a scalar.")
    kind: Literal["scalar", "vector", "matrix"] = Field(
        description="Scalar, vector or matrix per token."
    )
    layout: str = Field(
        description="The tensor a compiled module takes: B batch, T tokens, NH heads."
    )
    roles: list[str] = Field(
        description="What the analysis uses it for (query of H, key of H, ...)."
    )


class ParamInfo(_Model):
    name: str = Field(description="Name as declared in `param`.")
    shape: list[str] = Field(description="Declared sizes per head; empty for a scalar.")
    default: str | None = Field(
        description="Default as spec text (h is the head index), or null: the caller supplies it."
    )
    layout: str = Field(description="The tensor a compiled module takes: NH heads.")


class ValueInfo(_Model):
    name: str = Field(
        description="A derived per-token value (an equation that is not a state update)."
    )
    shape: list[str] = Field(
        description="Its sizes: [] for a scalar, [K] for a vector, [V, K] for a matrix."
    )
    expr: str = Field(description="Its definition as spec text.")
    is_output: bool = Field(description="True when no other equation reads it (it is returned).")


class GateInfo(_Model):
    side: Literal["scalar", "key", "value"] = Field(
        description="What the decay scales: the whole state, its key (column) side or its value "
        "(row) side."
    )
    decay: str = Field(description="The decay as written in the spec.")
    log: str = Field(
        description="Its logarithm in a numerically safe form (logsigmoid(a), dt A, log(gamma)): "
        "the per-token log-gate g_t."
    )
    proven: bool = Field(description="True when the decay is provably in (0, 1].")
    note: str = Field(description="Why it is, or is not, proven in (0, 1].")
    location: Location | None = Field(description="Where the decay is written.")


class WriteInfo(_Model):
    value: str | None = Field(
        description="The value vector v_t (null for a vector state: a column of ones)."
    )
    key: str = Field(description="The key vector k_t.")
    scale: str | None = Field(description="Scalar scale of the outer product, or null.")


class StateInfo(_Model):
    name: str = Field(description="State name.")
    shape: list[str] = Field(
        description="Declared sizes ([V, K] for a matrix state, [K] for a vector)."
    )
    update: str = Field(description="The update equation as spec text.")
    affine: bool = Field(
        description="True when the update is affine in the state's previous value (S_t = "
        "G_t(S_{t-1}) + W_t)."
    )
    transition_class: str = Field(description="Transition class of G_t (a variant of a class in mixc.transitions).")
    rule: str = Field(
        description="Name of the rule of the rule table that fired (first match wins)."
    )
    rule_description: str = Field(description="What that rule matched.")
    chunkable: bool = Field(description="True when this state has a chunked parallel form.")
    reason: str | None = Field(description="Why it has none (NYI or not affine), or null.")
    gates: list[GateInfo] = Field(description="The decays of G_t with their safe logs.")
    beta: str | None = Field(description="Delta rule: beta of I - beta k k^T.")
    erase_key: str | None = Field(description="Delta rule: k of I - beta k k^T.")
    stability: str | None = Field(
        description="Delta rule: whether |k| = 1 and beta in [0, 2] are proven."
    )
    write_form: str = Field(description="Form of the write term W_t.")
    write_rank: int = Field(description="Number of rank-1 outer products in the write.")
    writes: list[WriteInfo] = Field(description="The rank-1 writes scale * value key^T.")


class ReadoutInfo(_Model):
    index: int = Field(description="Readout number: _r<index> in the output expression.")
    state: str = Field(description="The state read.")
    query: str = Field(description="The query vector (readout = state_t query).")
    expr: str = Field(
        description="The readout as spec text (H_t q_t, or z_t . q_t for a vector state)."
    )


class OutputInfo(_Model):
    name: str = Field(description="Output name.")
    shape: list[str] = Field(
        description="Its sizes: [] for a scalar, [K] for a vector, [V, K] for a matrix."
    )
    equation: str = Field(description="The output equation as spec text.")
    form: str = Field(
        description="linear | linear + skip | ratio | function of readouts | no state."
    )
    expr: str = Field(description="The output with each readout replaced by _r<index>.")
    readouts: list[ReadoutInfo] = Field(description="Linear reads of states.")
    skip: str | None = Field(description="For linear + skip: the term that does not touch a state.")


class GroupInfo(_Model):
    states: list[str] = Field(
        description="States that share one chunked pass (same transition and key; values "
        "concatenated)."
    )
    transition_class: str = Field(description="Their transition class.")
    algorithm: str = Field(description="The algorithm of this class (docs/algorithms.md).")
    legend: str = Field(
        description="How the matrices of the parallel form map to the spec's names."
    )
    parallel_form: list[str] = Field(
        description="The chunked form as math, one formula a line (S = H^T, tokens are rows)."
    )
    quadratic_form: str | None = Field(
        description="The whole-sequence (quadratic, attention-like) form, when the class has one."
    )


class WarningInfo(_Model):
    message: str = Field(description="What is probably wrong.")
    hint: str | None = Field(description="How to fix it.")
    location: Location | None = Field(description="Where.")
    rendered: str = Field(
        description="The warning as mixc prints it: file:line:col, the line and a caret."
    )


class Quantity(_Model):
    formula: str = Field(
        description="Per token and head, in the size symbols (C: chunk size, T: sequence length)."
    )
    value: float | None = Field(
        description="The number for the given sizes, or null if a size is missing."
    )


class FormCostInfo(_Model):
    flops: Quantity = Field(
        description="Floating-point operations per token and head (a multiply-add is 2)."
    )
    bytes: Quantity = Field(
        description="Bytes moved per token and head (inputs/outputs 2 bytes, states and "
        "intermediates fp32)."
    )


class GroupCostInfo(_Model):
    states: list[str] = Field(description="The states of this group.")
    transition_class: str = Field(description="Their transition class.")
    recurrent: FormCostInfo = Field(description="Token by token.")
    chunked: FormCostInfo | None = Field(
        description="Chunked with chunk size C; null when there is no chunked form."
    )
    quadratic: FormCostInfo | None = Field(
        description="Whole-sequence masked form; null when there is none."
    )
    note: str = Field(description="What the formulas assume for this class.")


class TotalCostInfo(_Model):
    recurrent: FormCostInfo = Field(
        description="All groups, token by token, plus input/output bytes."
    )
    chunked: FormCostInfo | None = Field(
        description="All groups chunked, plus input/output bytes; null if some group has no "
        "chunked form."
    )
    quadratic: FormCostInfo | None = Field(
        description="All groups in the quadratic form; null if some group has none."
    )


class CostInfo(_Model):
    sizes: dict[str, int] = Field(description="The sizes given (--sizes).")
    symbols: list[str] = Field(description="Every size symbol the formulas use.")
    missing: list[str] = Field(
        description="Symbols without a size: formulas using them have no value."
    )
    chunk_symbol: str = Field(description="The chunk-size symbol.")
    sequence_symbol: str = Field(description="The sequence-length symbol.")
    io_bytes: Quantity = Field(description="Bytes of per-token inputs read and outputs written.")
    groups: list[GroupCostInfo] = Field(description="Cost of each group of states.")
    total: TotalCostInfo = Field(description="Cost of the whole mixer.")
    conventions: str = Field(description="How FLOPs and bytes are counted.")


class Explanation(_Model):
    """Everything `mixc explain` reports about one spec."""

    schema_version: Literal[1] = Field(SCHEMA_VERSION, description="Version of this schema.")
    mixer: str = Field(description="Mixer name.")
    description: str | None = Field(description="The mixer's description string.")
    source: str = Field(description="Where the spec came from (a path, or <string>).")
    inputs: list[InputInfo] = Field(description="Per-token inputs.")
    params: list[ParamInfo] = Field(description="Per-head parameters.")
    values: list[ValueInfo] = Field(description="Derived per-token values, outputs included.")
    states: list[StateInfo] = Field(description="Each state: class, rule, gates, write.")
    outputs: list[OutputInfo] = Field(description="Each output: readout form.")
    order: list[str] = Field(description="Evaluation order within one time step.")
    groups: list[GroupInfo] = Field(
        description="States that share one chunked pass, with the derived parallel form."
    )
    chunkable: bool = Field(description="True when the whole mixer has a chunked parallel form.")
    algorithm: str = Field(description="The algorithm chosen.")
    why: list[str] = Field(description="Why that algorithm: one line per state.")
    not_supported: list[str] = Field(
        description="What has no chunked form, and why (NYI or not affine)."
    )
    parallel_form: list[str] = Field(
        description="The derived parallel form of the whole mixer, as math."
    )
    warnings: list[WarningInfo] = Field(
        description="Located warnings (unproven decays, unread states)."
    )
    costs: CostInfo = Field(
        description="Cost per token and head of the recurrent, chunked and quadratic forms."
    )


# ----------------------------------------------------------------------------- facts -> model


def _location(span: Span | None) -> Location | None:
    if span is None:
        return None
    return Location(
        line=span.line, column=span.column, end_line=span.end_line, end_column=span.end_column
    )


def _text(e: Expr | None) -> str | None:
    return None if e is None else str(e)


def _names(e: Expr | None) -> set[str]:
    if e is None:
        return set()
    return {n.name for n in walk(e) if isinstance(n, Timed | Name)}


def _roles(facts: Plan) -> dict[str, list[str]]:
    roles: dict[str, list[str]] = {}

    def add(e: Expr | None, role: str) -> None:
        for n in sorted(_names(e)):
            if role not in roles.setdefault(n, []):
                roles[n].append(role)

    for o in facts.outputs:
        for r in o.readouts:
            add(r.query, f"query of {r.state}")
        add(o.skip, f"skip of {o.name}")
    for s in facts.states:
        for w in s.writes:
            add(w.key, f"key of {s.name}")
            add(w.value, f"value of {s.name}")
            add(w.scale, f"write scale of {s.name}")
        for g in s.transition.gates:
            add(g.decay, f"decay of {s.name}")
        add(s.transition.beta, f"beta of {s.name}")
        add(s.transition.gate, f"gate of {s.name}")
    return roles


def _readout_text(facts: Plan, r: Readout) -> str:
    op = "." if facts.state(r.state).vector else "@"
    return str(Binary(op, Timed(r.state, 0), r.query))


def _kind(shape: tuple[str, ...]) -> Literal["scalar", "vector", "matrix"]:
    return "scalar" if not shape else "vector" if len(shape) == 1 else "matrix"


def _dims(shape: tuple[str, str]) -> list[str]:
    """A verifier shape as declared sizes: [] for a scalar, [K] for a vector, [V, K] a matrix."""
    if shape == ("1", "1"):
        return []
    if "1" in shape:
        return [shape[0] if shape[1] == "1" else shape[1]]
    return list(shape)


def _quantity(f: Formula, sizes: dict[str, int]) -> Quantity:
    return Quantity(formula=str(f), value=f.value(sizes))


def _form(c: FormCost | None, sizes: dict[str, int]) -> FormCostInfo | None:
    if c is None:
        return None
    return FormCostInfo(flops=_quantity(c.flops, sizes), bytes=_quantity(c.bytes, sizes))


def _cost_info(c: Costs, sizes: dict[str, int]) -> CostInfo:
    groups = [
        GroupCostInfo(
            states=list(g.states),
            transition_class=g.cls,
            recurrent=_form(g.recurrent, sizes),
            chunked=_form(g.chunked, sizes),
            quadratic=_form(g.quadratic, sizes),
            note=g.note,
        )
        for g in c.groups
    ]
    doc = (costs.__doc__ or "").strip()
    return CostInfo(
        sizes=dict(sizes),
        symbols=list(c.symbols),
        missing=[s for s in c.symbols if s not in sizes],
        chunk_symbol=c.chunk,
        sequence_symbol=c.seq,
        io_bytes=_quantity(c.io, sizes),
        groups=groups,
        total=TotalCostInfo(
            recurrent=_form(c.recurrent, sizes),
            chunked=_form(c.chunked, sizes),
            quadratic=_form(c.quadratic, sizes),
        ),
        conventions=" ".join(doc.split("\n\n", 1)[-1].split()),
    )


def _state_info(s: StateFacts, facts: Plan) -> StateInfo:
    tr = s.transition
    eq = facts.mixer.update(s.name)
    rule, _, what = tr.rule.partition(":")
    return StateInfo(
        name=s.name,
        shape=[d for d in s.shape if not (s.vector and d == "1")],
        update=str(eq),
        affine=s.affine,
        transition_class=tr.cls,
        rule=rule,
        rule_description=what.strip(),
        chunkable=tr.chunkable,
        reason=tr.reason,
        gates=[
            GateInfo(
                side=g.side,
                decay=str(g.decay),
                log=str(g.log),
                proven=g.proven,
                note=g.note,
                location=_location(g.decay.span),
            )
            for g in tr.gates
        ],
        beta=_text(tr.beta),
        erase_key=_text(tr.key),
        stability=s.stability,
        write_form=s.write_form,
        write_rank=s.rank,
        writes=[
            WriteInfo(value=_text(w.value), key=str(w.key), scale=_text(w.scale)) for w in s.writes
        ],
    )


def _input_infos(facts: Plan) -> list[InputInfo]:
    roles = _roles(facts)
    return [
        InputInfo(
            name=d.name,
            shape=list(d.shape),
            kind=_kind(d.shape),
            layout="[B, T, NH" + "".join(f", {x}" for x in d.shape) + "]",
            roles=roles.get(d.name, []),
        )
        for d in facts.mixer.inputs
    ]


def _param_infos(facts: Plan) -> list[ParamInfo]:
    return [
        ParamInfo(
            name=p.name,
            shape=list(p.shape),
            default=_text(p.default),
            layout="[NH" + "".join(f", {x}" for x in p.shape) + "]",
        )
        for p in facts.mixer.params
    ]


def _value_infos(facts: Plan) -> list[ValueInfo]:
    """Every equation that is not a state update: derived values and outputs."""
    states = {s.name for s in facts.mixer.states}
    outputs = {o.name for o in facts.outputs}
    return [
        ValueInfo(
            name=eq.target,
            shape=_dims(facts.spec.shapes[eq.target]),
            expr=str(eq.value),
            is_output=eq.target in outputs,
        )
        for eq in facts.mixer.equations
        if eq.target not in states
    ]


def _output_info(facts: Plan, o: OutputFacts) -> OutputInfo:
    return OutputInfo(
        name=o.name,
        shape=_dims(o.shape),
        equation=str(facts.mixer.update(o.name)),
        form=o.form,
        expr=str(o.expr),
        readouts=[
            ReadoutInfo(
                index=r.index,
                state=r.state,
                query=str(r.query),
                expr=_readout_text(facts, r),
            )
            for r in o.readouts
        ],
        skip=_text(o.skip),
    )


def _why(facts: Plan) -> list[str]:
    """One line per state: its class, the rule that fired, and the algorithm it gets."""
    why = []
    for s in facts.states:
        tr = s.transition
        line = f"{s.name}: {tr.cls} (rule {tr.rule_name})"
        line += f" -> {tr.kind.algorithm}" if tr.chunkable else f" -> recurrent only: {tr.reason}"
        why.append(line)
    return why


def _not_supported(facts: Plan) -> list[str]:
    out = [f"{s.name}: {s.transition.reason}" for s in facts.states if s.transition.reason]
    if not facts.states:
        out.append("the mixer has no state")
    return out


def explain(
    spec: Spec, sizes: dict[str, int] | None = None, facts: Plan | None = None
) -> Explanation:
    """The report of one verified spec. `sizes` (e.g. {"K": 64, "T": 4096, "C": 64}) fill in the
    cost formulas."""
    facts = facts or analyze(spec)
    sizes = dict(sizes or {})
    mixer = facts.mixer
    groups = [_group_info(facts, g) for g in facts.groups]
    return Explanation(
        mixer=mixer.name,
        description=mixer.description,
        source=facts.spec.source.filename,
        inputs=_input_infos(facts),
        params=_param_infos(facts),
        values=_value_infos(facts),
        states=[_state_info(s, facts) for s in facts.states],
        outputs=[_output_info(facts, o) for o in facts.outputs],
        order=list(facts.order),
        groups=groups,
        chunkable=facts.chunkable,
        algorithm=facts.algorithm,
        why=_why(facts),
        not_supported=_not_supported(facts),
        parallel_form=parallel_form(facts, groups),
        warnings=[
            WarningInfo(
                message=w.message,
                hint=w.hint,
                location=_location(w.span),
                rendered=w.render(),
            )
            for w in facts.warnings
        ],
        costs=_cost_info(costs(facts), sizes),
    )


# ----------------------------------------------------------------------------- parallel forms


def _sequential_group(lead: StateFacts, group: tuple[str, ...]) -> GroupInfo:
    """A group without a chunked form: the recurrence, and why it has none."""
    tr = lead.transition
    if not lead.affine:
        form = [
            f"none: {lead.name}_t is not an affine function of {lead.name}_{{t-1}}, so a chunk "
            "has no summary (transition, contribution) to compose; it runs token by token",
        ]
    else:
        form = [f"none: {tr.reason}"]
    return GroupInfo(
        states=list(group),
        transition_class=tr.cls,
        algorithm=tr.kind.algorithm,
        legend=f"S_t = G_t(S_{{t-1}}) + W_t, evaluated for t = 1..T in order ({lead.name} = S^T)",
        parallel_form=form,
        quadratic_form=None,
    )


def _rows_legend(facts: Plan, plan: GroupPlan) -> list[str]:
    """What the rows of Q, K and V are in the spec's names (values concatenated over a group)."""
    group = plan.states
    states = [facts.state(n) for n in group]
    tr = states[0].transition
    queries = [str(q.expr) for q in plan.queries]
    values = []
    for s in states:
        sw = s.writes[0]
        v = "1" if sw.value is None else str(sw.value)
        if sw.scale is not None and tr.beta is None:
            v = f"{sw.scale} {v}" if v != "1" else str(sw.scale)
        values.append(v)
    value = values[0] if len(values) == 1 else "[" + ", ".join(values) + "]"
    legend = [
        f"Q rows = {' | '.join(queries) or '(unread)'}",
        f"K rows = {states[0].writes[0].key}",
        f"V rows = {value}",
    ]
    if len(group) > 1:
        legend.append(f"one pass for {', '.join(group)} (values concatenated)")
    return legend


def _group_info(facts: Plan, plan: GroupPlan) -> GroupInfo:
    """A group of states that share one chunked pass: its legend and its class's maths."""
    group = plan.states
    lead = facts.state(group[0])
    tr = lead.transition
    if not tr.chunkable:
        return _sequential_group(lead, group)
    maths = tr.kind.maths(tr)
    form = list(maths.form)
    if len(group) == 1:
        state = lead.name
        form.append(f"S = {state}^T" if not lead.vector else f"S = {state} (a single value column)")
    return GroupInfo(
        states=list(group),
        transition_class=tr.cls,
        algorithm=tr.kind.algorithm,
        legend=",  ".join([*_rows_legend(facts, plan), *maths.legend]),
        parallel_form=form,
        quadratic_form=maths.quadratic,
    )


def parallel_form(facts: Plan, groups: list[GroupInfo] | None = None) -> list[str]:
    """The derived parallel form of the whole mixer, as lines of math in the spec's own names."""
    groups = groups if groups is not None else [_group_info(facts, g) for g in facts.groups]
    lines: list[str] = []
    if not facts.chunkable:
        lines.append(f"sequential only: {facts.reason}")
    for g in groups:
        tag = ", ".join(g.states)
        lines.append(f"[{tag}] {g.legend}")
        lines += [f"    {line}" for line in g.parallel_form]
    for o in facts.outputs:
        if not facts.chunkable:
            lines.append(f"{facts.mixer.update(o.name)}   (read token by token)")
            continue
        expr = str(o.expr)
        for r in sorted(o.readouts, key=lambda r: -r.index):  # _r10 before _r1
            label = f"Y[{r.state}]"
            if sum(1 for x in o.readouts if x.state == r.state) > 1:
                label = f"Y[{r.state}; {r.query}]"
            expr = expr.replace(f"_r{r.index}", label)
        if o.form == "ratio" and expr.count(" / ") == 1:
            num, den = (_unwrap(x.strip()) for x in expr.split(" / "))
            lines.append(f"{o.name} = num / den,  num = {num},  den = {den}   (ratio)")
            continue
        lines.append(f"{o.name} = {expr}" + (f"   ({o.form})" if o.readouts else ""))
    return lines


def _unwrap(text: str) -> str:
    if text.startswith("(") and text.endswith(")") and text.count("(") == 1:
        return text[1:-1]
    return text


# ----------------------------------------------------------------------------- rendering


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
    out.line("not supported: nothing" if not report.not_supported else "not supported:")
    for n in report.not_supported:
        out.line(n, style="red", indent=4)
    if not report.chunkable:
        out.line(
            "sequential only: compile gives recurrent() and step(); chunk() raises NYI", style="red"
        )


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
