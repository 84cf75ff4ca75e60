"""Plan -> program: each form of a mixer as the kernel calls it makes (`mixc.lowering.program`).

Every choice of how a form runs is made here, once for every backend: the kernel and its
variant (chunked, quadratic, stabilised), the values side by side in a group's call, the write
scale multiplied in or passed as its log, several steps a token as interleaved sub-tokens, a
query read a token early, the summary's probes, and each recurrent update's shape (decayed from
its log-gates, a sum of products, or as written).
"""

from __future__ import annotations

from mixc.algebra.expand import Term, inline
from mixc.analysis.facts import Readout as ReadoutFacts
from mixc.analysis.outputs import readout_name
from mixc.analysis.plan import GroupPlan, Plan
from mixc.frontend.ir import Binary, Call, Expr, Name, Neg, Timed, Transpose, walk
from mixc.frontend.names import called
from mixc.lowering.program import (
    BackwardLoop,
    Decay,
    Output,
    Product,
    Program,
    QueryRead,
    Readout,
    Recurrence,
    SequenceForm,
    Slot,
    StateNote,
    Step,
    Summary,
    SummaryCall,
    Update,
    Value,
)
from mixc.lowering.program import (
    Call as KernelCall,
)

__all__ = ["lower"]


def lower(plan: Plan) -> Program:
    """The program of every form of `plan`."""
    groups = plan.groups if plan.chunkable else ()
    return Program(
        spec=plan.spec,
        typer=plan.typer,
        states=tuple(
            StateNote(s.name, s.transition.label, s.transition.rule.name, _summary_action(s))
            for s in plan.states
        ),
        forms=plan.forms.names(),
        chunk=_sequence_form(plan, groups, "chunk") if plan.chunkable else None,
        parallel=_sequence_form(plan, groups, "parallel") if plan.forms.parallel is None else None,
        summary=_summary(plan, groups),
        recurrence=_recurrence(plan),
        chunk_size=plan.chunk_size,
        no_chunk=plan.reason,
        names=tuple(_spec_names(plan.mixer).items()),
        readouts=tuple(
            (readout_name(r.index), readout_local(r, readouts_of(plan))) for r in readouts_of(plan)
        ),
        no_step=plan.forms.step.text if plan.forms.step is not None else None,
    )


# ----------------------------------------------------------------------------- sequence forms


def _sequence_form(plan: Plan, groups: tuple[GroupPlan, ...], form: str) -> SequenceForm:
    """`chunk` (from the carried states, packed sequences allowed, a write scale that would
    overflow carried in log space) or `parallel` (from zero, the quadratic kernels)."""
    chunked = form == "chunk"
    calls = tuple(_call(plan, g, chunked) for g in groups)
    o = plan.outputs[0]
    expr = o.scaled if chunked and o.scaled is not None else o.expr
    shown = plan.mixer.outputs[0].value
    if isinstance(expr, Name):  # the output is one readout, held in its local
        (read,) = (r for r in o.readouts if readout_name(r.index) == expr.name)
        output = Output(readout_local(read, o.readouts), None, shown)
    else:
        output = Output(o.name, expr, shown)
    return SequenceForm(form, calls, output, packed=chunked, sign_checks=plan.sign_checks)


def _call(plan: Plan, group: GroupPlan, chunked: bool) -> KernelCall:
    stable = chunked and group.log_scale is not None
    lag = group.lag if chunked and not stable else None
    joined = chunked and not stable and group.joined and lag is None
    steps = _steps(plan, group, scaled=not stable)
    if lag is not None:  # one write a token (mixc.analysis.folds), the class's rank-1 kernel
        kernel = f"chunk_{group.kernel}"
        write = lag.write
        steps = (Step(write.key, (Value(group.name, write.value, write.scale),), steps[0].args),)
    elif stable:
        kernel = f"chunk_{group.transition_class.stable_kernel}"
    elif joined:
        kernel = f"chunk_{group.transition_class.joined_kernel}"
    else:
        kernel = f"{'chunk' if chunked else 'parallel'}_{group.kernel}"
    queries = [_query(plan, q.expr, q.offset, q.readouts) for q in group.queries]
    if not queries and chunked:  # no readout: the pass still runs for the final states
        queries = [QueryRead(None, False, ())]
    stacked = chunked and group.stacked
    kernel = f"chunk_{group.transition_class.queries_kernel}" if stacked else kernel
    return KernelCall(
        group=group.name,
        label=group.transition.label,
        slots=_slots(plan, group),
        kernel=kernel,
        steps=steps,
        queries=tuple(queries),
        initial=chunked,
        log_scale=group.log_scale if stable else None,
        unscale=group.unscale.name if stable else None,
        joined=joined,
        stacked=stacked,
        reads=_reads(plan, group),
        reverse=group.backward,
        lag=lag,
    )


def _reads(plan: Plan, group: GroupPlan, queries: bool = True) -> tuple[str, ...]:
    """The locals of other groups' readouts that `group`'s pass reads (its states' updates, or
    its queries unless not `queries`), in the order of the readouts."""
    names = {n for s in group.states for n in plan.state(s).reads}
    for q in group.queries if queries else ():
        names |= {n.name for n in walk(q.expr) if isinstance(n, Name)}
    every = readouts_of(plan)
    return tuple(
        readout_local(r, every)
        for r in every
        if readout_name(r.index) in names and r.state not in group.states
    )


def _slots(plan: Plan, group: GroupPlan) -> tuple[Slot, ...]:
    states = [plan.state(s) for s in group.states]
    return tuple(Slot(s.name, tuple(s.shape), s.width, s.vector) for s in states)


def _steps(plan: Plan, group: GroupPlan, scaled: bool) -> tuple[Step, ...]:
    """The group's steps a token. One: its first write's key, every state's value (times its
    write scale where `scaled`) and the class's arguments. Several (sub-tokens): each step's
    write, its scale multiplied in, and its arguments but the proven bounds, which hold for
    that step only."""
    if group.sub_tokens:
        (state,) = group.states
        return tuple(
            Step(
                sub.write.key,
                (Value(state, sub.write.value, sub.write.scale),),
                tuple(a for a in sub.args if a.layout != "bound"),
            )
            for sub in group.sub_tokens
        )
    states = [plan.state(s) for s in group.states]
    values = tuple(
        Value(s.name, s.kernel_writes[0].value, s.writes[0].scale if scaled else None)
        for s in states
    )
    return (Step(states[0].kernel_writes[0].key, values, group.args),)


def _query(plan: Plan, query: Expr, offset: int, readouts) -> QueryRead:
    found = []
    for r in readouts:
        op = "." if plan.state(r.state).vector else "@"
        found.append(
            Readout(readout_local(r, readouts_of(plan)), r.state, Binary(op, r.read, r.query))
        )
    # S_{t-1} q_t forward, or a backward state's G_{t+1} q_t: the state before the token's update
    return QueryRead(query, offset != 0, tuple(found))


def _summary(plan: Plan, groups: tuple[GroupPlan, ...]) -> Summary:
    missing = plan.forms.summary
    if missing is not None:
        return Summary((), (), missing.text)
    calls = tuple(
        SummaryCall(
            g.name,
            _slots(plan, g),
            f"chunk_{g.kernel}",
            _steps(plan, g, scaled=True),
            "matmul" if g.transition_class.summary_probe(g.transition) else "elementwise",
            g.transition_class.summary_probe(g.transition) or ("v", "columns"),
        )
        for g in groups
    )
    # a summary reads no query: only the readouts that a later state's update reads
    read = {name for g in groups for name in _reads(plan, g, queries=False)}
    chunk_calls = (_call(plan, g, True) for g in groups)
    runs = tuple(
        c for c in chunk_calls if any(r.name in read for q in c.queries for r in q.readouts)
    )
    return Summary(calls, plan.sign_checks, runs=runs)


def _summary_action(s) -> str:
    """How the summary's P acts on state `s` (`SUMMARY_ACTIONS`): entry by entry ("elementwise":
    the class's way, or a column's, whose one key channel makes P a number per entry), else as
    the class probes it, S_0 P ("matmul": the kernel state's rows transformed, S = its
    transpose) or P S_0 ("left": its columns)."""
    probe = s.transition.transition_class.summary_probe(s.transition)
    if probe is None or s.column:
        return "elementwise"
    return "left" if probe[1] == "rows" else "matmul"


# ----------------------------------------------------------------------------- the recurrence


def _recurrence(plan: Plan) -> Recurrence:
    mixer = plan.mixer
    if not mixer.causal:
        return _two_loops(plan)
    used = {
        n.name
        for eq in mixer.equations
        for n in walk(inline(mixer, eq.value))
        if isinstance(n, Timed)
    }
    states = {s.name for s in mixer.states}
    updates = tuple(_update(plan, name) for name in plan.order if name in states)
    output = mixer.outputs[0]
    return Recurrence(
        tuple(d.name for d in mixer.inputs if d.name in used),
        updates,
        inline(mixer, output.value),
        output.value,
    )


def _two_loops(plan: Plan) -> Recurrence:
    """A non-causal mixer's recurrence: its backward states over the tokens from the last,
    keeping each token's readouts of them, then the forward states and the output, which reads
    those readouts by name (`_r1`, held in the local `program.readouts` gives it)."""
    mixer = plan.mixer
    backward = set(mixer.backward)
    states = [n for n in plan.order if mixer.state(n) is not None]
    reads, table = [], {}
    for r in readouts_of(plan):
        read = _readout_expr(plan, r)
        if r.state in backward:  # kept by the backward loop, read by its name
            reads.append((readout_local(r, readouts_of(plan)), read))
            continue
        table[readout_name(r.index)] = read
    output = _substituted(plan.outputs[0].expr, table)
    back = [_update(plan, n) for n in states if n in backward]
    ahead = [_update(plan, n) for n in states if n not in backward]
    reads_of = [read for _, read in reads]
    loop = BackwardLoop(
        _sliced(mixer, [*(inline(mixer, mixer.update(n).value) for n in backward), *reads_of]),
        tuple(back),
        tuple(reads),
    )
    read_forward = [inline(mixer, mixer.update(u.state).value) for u in ahead]
    return Recurrence(
        _sliced(mixer, [*read_forward, output]),
        tuple(ahead),
        output,
        mixer.outputs[0].value,
        loop,
    )


def _sliced(mixer, exprs: list[Expr]) -> tuple[str, ...]:
    """The inputs `exprs` read, in declaration order: those a loop slices at each token."""
    used = {n.name for e in exprs for n in walk(e) if isinstance(n, Timed)}
    return tuple(d.name for d in mixer.inputs if d.name in used)


def _readout_expr(plan: Plan, r: ReadoutFacts) -> Expr:
    """A readout as spec text: `S_t q`, `s_t . q`, or (entry by entry) the vector state."""
    if r.entrywise:
        return r.read
    return Binary("." if plan.state(r.state).vector else "@", r.read, r.query)


def _substituted(e: Expr, table: dict[str, Expr]) -> Expr:
    """`e` with each name of `table` replaced by its expression."""
    if isinstance(e, Name):
        return table.get(e.name, e)
    if isinstance(e, Binary):
        return Binary(e.op, _substituted(e.left, table), _substituted(e.right, table))
    if isinstance(e, Neg):
        return Neg(_substituted(e.operand, table))
    if isinstance(e, Transpose):
        return Transpose(_substituted(e.operand, table))
    if isinstance(e, Call):
        return Call(e.func, tuple(_substituted(a, table) for a in e.args))
    return e


def _update(plan: Plan, name: str) -> Update:
    """A state's update: decayed from its log-gates where the class decays it so (a decay near
    1, sigmoid(10), keeps accurate gradients, as in the chunked form), else its expanded
    products, else (not affine) as written."""
    eq = plan.mixer.update(name)
    s = plan.state(name)
    if s.terms is None:
        return Update(name, eq.value, expr=inline(plan.mixer, eq.value))
    tr = s.transition
    unread = _unreader(plan)
    if not tr.transition_class.step_decays(tr) or not s.writes:
        return Update(name, eq.value, writes=tuple(_product(t, unread) for t in s.terms))
    decays = []
    for g in tr.gates:  # the decay from its log-gate, unless the log is just log(x)
        log = g.log
        plain = isinstance(log, Call) and log.func == "log"
        factor = log.args[0] if plain else Call("exp", (log,), span=log.span)
        side = "key" if g.side == "key" and not s.vector else "left"
        decays.append(Decay(unread(factor), side, from_log=not plain))
    ex = plan.expander
    writes = [t for t in s.terms if not any(ex.has_state(a) for a in t.chain + t.scalars + t.gates)]
    products = tuple(_product(t, unread) for t in writes)
    return Update(name, eq.value, writes=products, decays=tuple(decays))


def _product(t: Term, unread) -> Product:
    return Product(
        t.coeff,
        tuple(map(unread, t.scalars)),
        tuple(map(unread, t.chain)),
        tuple(map(unread, t.gates)),
    )


def _unreader(plan: Plan):
    """A function giving an expression with each readout's name (`_r0`, which a pipeline's
    update reads) replaced by the read it stands for (`H1_t @ q_t`), for the recurrence, which
    holds every state at every token and reads them directly."""
    reads = {}
    for r in readouts_of(plan):
        if r.entrywise:
            reads[readout_name(r.index)] = r.read
        else:
            op = "." if plan.state(r.state).vector else "@"
            reads[readout_name(r.index)] = Binary(op, r.read, r.query)

    def unread(e: Expr) -> Expr:
        if not reads or not any(isinstance(n, Name) and n.name in reads for n in walk(e)):
            return e  # the node itself, whose shape the plan's Typer knows
        if isinstance(e, Name) and e.name in reads:
            return unread(reads[e.name])
        if isinstance(e, Call):
            return Call(e.func, tuple(map(unread, e.args)), span=e.span)
        if isinstance(e, Neg | Transpose):
            return type(e)(unread(e.operand), span=e.span)
        if isinstance(e, Binary):
            return Binary(e.op, unread(e.left), unread(e.right), span=e.span)
        return e

    return unread


# ----------------------------------------------------------------------------- names


def readouts_of(plan: Plan) -> tuple[ReadoutFacts, ...]:
    """The readouts of the output the forms compute."""
    return plan.outputs[0].readouts if plan.outputs else ()


def readout_local(r: ReadoutFacts, readouts: tuple[ReadoutFacts, ...]) -> str:
    """The local that holds a readout in generated code, named after the state it reads:
    `_read_H`, then `_read2_H`, ... for further reads of H (other queries, or H_{t-1})."""
    n = 1 + sum(1 for x in readouts if x.state == r.state and x.index < r.index)
    return f"_read_{r.state}" if n == 1 else f"_read{n}_{r.state}"


def _spec_names(mixer) -> dict[Expr, str]:
    """The names the spec gives computations: each per-token value's (`i_t = exp(...)`: `i`)
    and each call of a let function (`kk(kappa_t)`: `kk_kappa`, its arguments' names after
    the function's where all are names), keyed by the expression they inline to."""
    states = {s.name for s in mixer.states}
    lets = {fn.name for fn in mixer.lets}
    names: dict[Expr, str] = {}
    for eq in mixer.equations:
        if eq.target not in states:
            names.setdefault(inline(mixer, eq.value), eq.target)
    for eq in mixer.equations:
        for node in walk(eq.value):
            if isinstance(node, Call) and node.func in lets:
                names.setdefault(inline(mixer, node), called(node.func, node.args))
    return names
