"""`mixc explain`: the plan of one spec as a report (`mixc.tools.report.Explanation`), for
people (`mixc.tools.render`) and tools (JSON).

Nothing here analyses the spec: every claim comes from the plan, so the report and the compiled
code cannot disagree.
"""

from __future__ import annotations

from typing import Literal

from mixc.algebra.formula import Formula
from mixc.analysis.cost import Costs, costs
from mixc.analysis.facts import OutputFacts, Readout, StateFacts
from mixc.analysis.plan import GroupPlan, Plan, analyze
from mixc.analysis.roles import read_roles
from mixc.errors import Span
from mixc.frontend.builtins import ROTATIONS
from mixc.frontend.ir import Binary, Call, Expr, walk
from mixc.frontend.spec import Spec
from mixc.tools.report import (
    ChunkSizeInfo,
    CostInfo,
    Explanation,
    FormCostInfo,
    FormInfo,
    GateInfo,
    GroupCostInfo,
    GroupInfo,
    InputInfo,
    Location,
    OutputInfo,
    ParamInfo,
    Quantity,
    ReadoutInfo,
    StateInfo,
    TotalCostInfo,
    ValueInfo,
    WarningInfo,
    WriteInfo,
)
from mixc.transitions.base import Maths
from mixc.transitions.cost import FormCost

__all__ = ["explain", "parallel_form"]


# ----------------------------------------------------------------------------- plan -> model


def _transposed(s) -> str | None:
    """How a value-side (transposed) state's chunked form runs, or None for any other."""
    cls = s.transition.transition_class
    if not cls.transposed:
        return None
    how = f"chunk_{cls.kernel}" if s.transition.chunkable else "no kernel (recurrent only)"
    return (
        f"a value-side (transposed) transition: it acts on {s.name} from the left (its rows), "
        f"the transpose of a key-side one; the key-side kernel runs on {s.name} as its state "
        f"and the output reads that state along its other axis; kernel: {how}, which takes "
        f"each write v k^T as k v^T"
    )


def _location(span: Span | None) -> Location | None:
    if span is None:
        return None
    return Location(
        line=span.line, column=span.column, end_line=span.end_line, end_column=span.end_column
    )


def _text(e: Expr | None) -> str | None:
    return None if e is None else str(e)


def _roles(plan: Plan) -> dict[str, list[str]]:
    """Each name's roles, as "key of H" (`mixc.analysis.roles.read_roles`)."""
    roles: dict[str, list[str]] = {}
    for (name, _), found in read_roles(plan).items():
        roles.setdefault(name, []).extend(str(r) for r in found if r.role != "read")
    return roles


def _readout_text(plan: Plan, r: Readout) -> str:
    op = "." if plan.state(r.state).vector else "@"
    return str(Binary(op, r.read, r.query))


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
            transition_class=g.label,
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


def _state_info(s: StateFacts, plan: Plan) -> StateInfo:
    tr = s.transition
    eq = plan.mixer.update(s.name)
    erase = tr.args.erase()
    return StateInfo(
        name=s.name,
        shape=[d for d in s.shape if not (s.shape[1] == "1" and d == "1")],
        update=str(eq),
        affine=s.affine,
        transition_class=tr.label,
        rule=tr.rule.name,
        rule_description=tr.rule.matched,
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
        beta=None if erase is None else str(erase.beta),
        erase_key=None if erase is None else str(erase.key),
        stability=s.stability,
        write_form=s.write_form,
        write_rank=s.rank,
        writes=[
            WriteInfo(value=_text(w.value), key=str(w.key), scale=_text(w.scale)) for w in s.writes
        ],
        backward=s.backward,
        transposed=_transposed(s),
    )


def _input_infos(plan: Plan) -> list[InputInfo]:
    roles = _roles(plan)
    return [
        InputInfo(
            name=d.name,
            shape=list(d.shape),
            kind=_kind(d.shape),
            layout="[B, T, NH" + "".join(f", {x}" for x in d.shape) + "]",
            roles=roles.get(d.name, []),
        )
        for d in plan.mixer.inputs
    ]


def _param_infos(plan: Plan) -> list[ParamInfo]:
    return [
        ParamInfo(
            name=p.name,
            shape=list(p.shape),
            default=_text(p.default),
            layout="[NH" + "".join(f", {x}" for x in p.shape) + "]",
        )
        for p in plan.mixer.params
    ]


def _value_infos(plan: Plan) -> list[ValueInfo]:
    """Every equation that is not a state update: derived values and outputs."""
    states = {s.name for s in plan.mixer.states}
    outputs = {o.name for o in plan.outputs}
    return [
        ValueInfo(
            name=eq.target,
            shape=_dims(plan.spec.shapes[eq.target]),
            expr=str(eq.value),
            is_output=eq.target in outputs,
        )
        for eq in plan.mixer.equations
        if eq.target not in states
    ]


def _output_info(plan: Plan, o: OutputFacts) -> OutputInfo:
    return OutputInfo(
        name=o.name,
        shape=_dims(o.shape),
        equation=str(plan.mixer.update(o.name)),
        form=o.form,
        expr=str(o.expr),
        readouts=[
            ReadoutInfo(
                index=r.index,
                state=r.state,
                query=str(r.query),
                expr=_readout_text(plan, r),
            )
            for r in o.readouts
        ],
        skip=_text(o.skip),
    )


def _why(plan: Plan) -> list[str]:
    """One line per state: its class, the rule that fired, and the algorithm it gets."""
    why = []
    algorithms = {s: g.algorithm for g in plan.groups for s in g.states}
    for s in plan.states:
        tr = s.transition
        line = f"{s.name}: {tr.label} (rule {tr.rule.name})"
        line += (
            f" -> {algorithms.get(s.name, tr.transition_class.algorithm)}"
            if tr.chunkable
            else f" -> recurrent only: {tr.reason}"
        )
        if tr.steps and tr.chunkable:
            joined = any(g.joined for g in plan.groups if s.name in g.states)
            folded = any(g.lag for g in plan.groups if s.name in g.states)
            n = len(tr.steps)
            line += (
                ", the lagged write folded into the token's own (one write a token; the "
                "quadratic form: sub-tokens)"
                if folded
                else f", {n} writes a token joined (one step a token; the quadratic form: "
                "sub-tokens)"
                if joined
                else f", {n} sub-tokens a token (one per step)"
            )
        why.append(line)
    for g in plan.groups if plan.chunkable else ():
        if g.log_scale is not None:
            why.append(_stabiliser(plan, g))
    return why + _rotations(plan)


def _rotations(plan: Plan) -> list[str]:
    """What the forms do with rotations (`rotate`, `rotate_interleaved`, `rotate_halves`) and
    positions."""
    mixer = plan.spec.mixer
    calls = {
        n.func
        for e in (*(eq.value for eq in mixer.equations), *(fn.body for fn in mixer.lets))
        for n in walk(e)
        if isinstance(n, Call)
    }
    out = []
    if plan.chunkable and calls & set(ROTATIONS):
        out.append(
            "rotations: each vector is turned by its own token's angles before the kernel (a "
            "per-token transform): exact for every class, the state kept in the turned "
            "coordinates, a gate acting on the turned channels. A rotation inside the "
            "transition (H_{t-1} R(w_t)) would equal the turn of q and k by the summed angles "
            "only where the gate is equal on both entries of each pair; summed angles are "
            "written as a state of angles read by the turns (Mamba-3's Th_t = Th_{t-1} + "
            "dt_t w_t), whose pass runs first (a pipeline)"
        )
    if mixer.positioned:
        out.append(
            "positions: pos_t counts tokens from the carried state's pos (0 by default; each "
            "packed sequence from its own); angles that read it, and their cos and sin, are "
            "computed in float64"
        )
    return out


def _stabiliser(plan: Plan, g: GroupPlan) -> str:
    """What the chunked form does with a write scale exp(s_t) it carries in log space."""
    states = ", ".join(g.states)
    outputs = "; ".join(f"{o.name} = {o.scaled}" for o in plan.outputs if o.scaled is not None)
    return (
        f"{states}: the write scale exp({g.log_scale}) is carried in log space (xLSTM's "
        f"max-stabiliser, kernel {g.transition_class.stable_kernel}): each output row t is computed scaled "
        f"by {g.unscale.name} = exp(-m_t), m_t the largest exponent it sums, so no exponential "
        f"exceeds 1 and the chunked form stays finite however large {g.log_scale} is; the ratio "
        f"cancels the scale once every term that reads no state is scaled too ({outputs}). The "
        "final states are returned unscaled: in float32 they are inf once they pass its range "
        f"(exp({g.log_scale}) past about 88), and recurrent and step, which scale each write "
        "as written, overflow there"
    )


def _not_supported(plan: Plan) -> list[str]:
    reasons = [f"{s.name}: {s.transition.reason}" for s in plan.states if s.transition.reason]
    sign = plan.forms.chunk
    return reasons + ([sign.text] if sign is not None and sign.kind == "sign" else [])


def _form_infos(plan: Plan) -> list[FormInfo]:
    """Each form of the compiled module, with the plan's reason where it is missing."""
    forms = plan.forms
    missing = {"chunk": forms.chunk, "parallel": forms.parallel, "summary": forms.summary}
    missing |= {"recurrent": None, "step": forms.step}
    signs = "; ".join(c.describe() for c in plan.sign_checks)
    checks = (
        f"that {signs} has no negative entry (they take the log of the decay; recurrent and "
        "step need not)"
        if signs
        else None
    )
    return [
        FormInfo(
            name=name,
            available=m is None,
            reason=None if m is None else m.text,
            checks=checks if m is None and name in ("chunk", "parallel", "summary") else None,
        )
        for name, m in missing.items()
    ]


def explain(
    spec: Spec,
    sizes: dict[str, int] | None = None,
    plan: Plan | None = None,
    backend: str = "pytorch",
) -> Explanation:
    """The report of one verified spec. `sizes` (e.g. {"K": 64, "T": 4096, "C": 64}) fill in the
    cost formulas; `backend` says which kernels the notes describe."""
    from mixc.backends import get as get_backend
    from mixc.lowering import lower

    plan = plan or analyze(spec)
    sizes = dict(sizes or {})
    mixer = plan.mixer
    groups = [_group_info(plan, g) for g in plan.groups]
    return Explanation(
        mixer=mixer.name,
        description=mixer.description,
        source=plan.spec.source.filename,
        inputs=_input_infos(plan),
        params=_param_infos(plan),
        values=_value_infos(plan),
        states=[_state_info(s, plan) for s in plan.states],
        outputs=[_output_info(plan, o) for o in plan.outputs],
        order=list(plan.order),
        groups=groups,
        chunkable=plan.chunkable,
        forms=_form_infos(plan),
        algorithm=plan.algorithm,
        why=_why(plan),
        chunk_size=(
            ChunkSizeInfo(size=plan.chunk_size.size, why=plan.chunk_size.why)
            if plan.chunkable
            else None
        ),
        not_supported=_not_supported(plan),
        parallel_form=parallel_form(plan, groups),
        warnings=[
            WarningInfo(
                message=w.message,
                hint=w.hint,
                location=_location(w.span),
                rendered=w.render(),
            )
            for w in plan.warnings
        ],
        costs=_cost_info(costs(plan), sizes),
        backend=backend,
        backend_notes=list(get_backend(backend).kernel_notes(lower(plan))),
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
        transition_class=tr.label,
        algorithm=tr.transition_class.algorithm,
        legend=f"S_t = G_t(S_{{t-1}}) + W_t, evaluated for t = 1..T in order ({lead.name} = S^T)",
        parallel_form=form,
        quadratic_form=None,
    )


def _sub_token_line(group: GroupPlan) -> str:
    """How a group that applies several steps a token runs them: as sub-tokens."""
    n = len(group.sub_tokens)
    line = (
        f"{n} sub-tokens a token (the sequence of T tokens is {n} T sub-tokens of the "
        f"{group.kernel} kernel): sub-token {n} t + i - 1 is step i of token t, a decay only "
        f"where its step has one, Q rows zero but at each token's last sub-token, where Y is read"
    )
    if group.lag is not None:
        lag = group.lag
        line = (
            f"chunked: the lagged write folded into each token's own (a scalar decay acts on "
            f"the previous token's write as on a number), G_t = H_t + c_{{t+1}} v_t k_t^T with "
            f"c_t = {lag.coeff} (the lagged write's scale less the decay): one write a token, "
            f"(d_t + c_{{t+1}}) v_t k_t^T, v_t = {lag.write.value}, k_t = {lag.write.key}, "
            f"d_t = {lag.write.scale or 1}, on the {group.kernel} kernel from G_0 = H_0 + c_1 "
            f"v_0 k_0^T, each readout less c_{{t+1}} v_t (k_t . q_t); quadratic and summary: {line}"
        )
    elif group.joined:
        line = (
            f"chunked: the {n} writes joined, K = [K_1 ... K_{n}] and V = [V_1 ... V_{n}] side "
            f"by side, {n} C write rows a chunk against C queries, each row decayed as its token "
            f"(the {group.transition_class.joined_kernel} kernel); quadratic and summary: {line}"
        )
    return line


def _rows_legend(plan: Plan, group: GroupPlan, maths: Maths) -> list[str]:
    """What the rows of Q, K and V are in the spec's names (values concatenated over a group;
    without their scale where the class's maths apply it)."""
    if group.sub_tokens:
        return _sub_token_legend(group)
    names = group.states
    states = [plan.state(n) for n in names]
    queries = [str(q.expr) for q in group.queries]
    values = []
    for s in states:
        sw = s.kernel_writes[0]
        v = "1" if sw.value is None else str(sw.value)
        if sw.scale is not None and not maths.scales_writes:
            scale = f"({sw.scale})" if " " in str(sw.scale) else str(sw.scale)
            v = f"{scale} {v}" if v != "1" else str(sw.scale)
        values.append(v)
    value = values[0] if len(values) == 1 else "[" + ", ".join(values) + "]"
    legend = [
        f"Q rows = {' | '.join(queries) or '(unread)'}",
        f"K rows = {states[0].kernel_writes[0].key}",
        f"V rows = {value}",
    ]
    if len(names) > 1:
        legend.append(f"one pass for {', '.join(names)} (values concatenated)")
    return legend


def _sub_token_legend(group: GroupPlan) -> list[str]:
    """The rows of Q, K, V and the kernel's arguments for each step (sub-token) of a token."""
    legend = [
        f"Q rows = {' | '.join(str(q.expr) for q in group.queries) or '(unread)'} (last sub-token)"
    ]
    for i, sub in enumerate(group.sub_tokens, 1):
        w = sub.write
        scale = (
            "" if w.scale is None else (f"({w.scale}) " if " " in str(w.scale) else f"{w.scale} ")
        )
        args = "".join(f", {a.name} = {a.expr}" for a in sub.args if a.expr is not None)
        legend.append(f"step {i}: K = {w.key}, V = {scale}{w.value}{args}")
    return legend


def _group_info(plan: Plan, group: GroupPlan) -> GroupInfo:
    """A group of states that share one chunked pass: its legend and its class's maths."""
    names = group.states
    lead = plan.state(names[0])
    tr = lead.transition
    if not tr.chunkable:
        return _sequential_group(lead, names)
    # several steps a token run the same kernel over sub-tokens: the maths of a step, the rows
    # interleaved
    maths = tr.transition_class.maths(tr.lead_step)
    form = [_sub_token_line(group), *maths.form] if tr.steps else list(maths.form)
    if group.stacked:
        n = len(group.queries)
        form.append(
            f"chunked: the {n} queries in one pass of the {tr.transition_class.queries_kernel} "
            f"kernel, Q = [Q_1 ... Q_{n}] as {n} C query rows a chunk, each decayed as its "
            f"token, the state passed from chunk to chunk once for them all; Y_i from rows i"
        )
    if len(names) == 1:
        state = lead.name
        form.append(f"S = {state}^T" if not lead.vector else f"S = {state} (a single value column)")
    return GroupInfo(
        states=list(names),
        transition_class=tr.label,
        algorithm=group.algorithm,
        legend=",  ".join([*_rows_legend(plan, group, maths), *(() if tr.steps else maths.legend)]),
        parallel_form=form,
        quadratic_form=maths.quadratic,
    )


def parallel_form(plan: Plan, groups: list[GroupInfo] | None = None) -> list[str]:
    """The derived parallel form of the whole mixer, as lines of math in the spec's own names."""
    groups = groups if groups is not None else [_group_info(plan, g) for g in plan.groups]
    lines: list[str] = []
    if not plan.chunkable:
        lines.append(f"sequential only: {plan.reason}")
    for g in groups:
        tag = ", ".join(g.states)
        lines.append(f"[{tag}] {g.legend}")
        lines += [f"    {line}" for line in g.parallel_form]
    for o in plan.outputs:
        if not plan.chunkable:
            lines.append(f"{plan.mixer.update(o.name)}   (read token by token)")
            continue
        expr = str(o.expr)
        for r in sorted(o.readouts, key=lambda r: -r.index):  # _r10 before _r1
            label = f"Y[{r.read}]" if r.offset else f"Y[{r.state}]"
            if sum(1 for x in o.readouts if x.state == r.state) > 1:
                label = f"Y[{r.read if r.offset else r.state}; {r.query}]"
            expr = expr.replace(f"_r{r.index}", label)
        for r in o.readouts:
            if r.offset == 1:
                lines.append(
                    f"Y[{r.read}] at token t: {r.state} runs backward in time (its kernel's "
                    "own reverse order, or the time-reversed sequence, each packed sequence "
                    "within its bounds), read before the token's update"
                )
        for r in o.readouts:
            if r.offset == -1:
                lines.append(
                    f"Y[{r.read}] at token t is the kernel's read at t-1 with the query of t: a "
                    "strictly causal mask, the query's decay measured from the previous token; "
                    "the first token reads the initial state"
                )
                break
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
