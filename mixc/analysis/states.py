"""Per-state analysis: expand a state's update, find its transition class and its writes."""

from __future__ import annotations

from dataclasses import replace

from mixc.algebra.canon import Canon
from mixc.algebra.expand import Expander, NotAffine, Term, inline, product, transpose_atom
from mixc.analysis.facts import StateFacts, WriteTerm
from mixc.analysis.outputs import ReadoutTable, lift, readout_name, reads_of
from mixc.analysis.steps import split_steps
from mixc.errors import NotYetImplemented, Span
from mixc.frontend.constants import constant
from mixc.frontend.ir import Binary, Expr, Mixer, Number, Timed, Transpose, walk
from mixc.frontend.limits import SpecSizeError
from mixc.frontend.shapes import Shape, show
from mixc.transitions import DENSE, NOT_AFFINE, classify
from mixc.transitions.base import NO_ARGS, RuleContext, Transition
from mixc.transitions.gates import LogGate

__all__ = ["analyze_state"]


def _state_position(t: Term, state: str) -> list[int]:
    return [i for i, a in enumerate(t.chain) if _is_state(a, state)]


def _is_state(a: Expr, state: str) -> bool:
    return (isinstance(a, Timed) and a.name == state) or (
        isinstance(a, Transpose) and isinstance(a.operand, Timed) and a.operand.name == state
    )


def _row_form(t: Term, ex: Expander) -> Term:
    """A vector state s[K] is treated as the row s^T (one value channel): transpose its terms."""
    return replace(
        t,
        chain=tuple(transpose_atom(a, ex.shape(a)) for a in reversed(t.chain)),
        gates=tuple(transpose_atom(g, ex.shape(g)) for g in t.gates),
    )


def _at(span: Span | None) -> str:
    return f" at line {span.line}, column {span.column}" if span else ""


def analyze_state(
    mixer: Mixer,
    name: str,
    ex: Expander,
    params,
    canon: Canon,
    column: bool = False,
    table: ReadoutTable | None = None,
) -> StateFacts:
    """The facts of one state: its class (by the registry's rules), its writes, and its update
    expanded into terms (kept for the recurrent form). A vector state is analysed as a row (its
    entries as key channels), or, when `column` (an output reads it entry by entry), as a
    column (its entries as value channels, one key channel of 1). An expression the analysis
    builds that grows too large is reported at the update. With a `table`, the update's reads
    of other states through readouts (`o_t = H1_t q_t`, `exp(Ks_t q_t)`) become readouts of
    that table: inputs of this state's update like any other (a pipeline of states)."""
    try:
        return _analyze_state(mixer, name, ex, params, canon, column, table)
    except SpecSizeError as exc:
        raise exc.at(mixer.update(name).value.span) from None


def _lifted(mixer: Mixer, name: str, ex: Expander, canon: Canon, table) -> tuple[Expr, tuple]:
    """The update of `name` inlined, other states' readouts in it by name, and those names."""
    value = inline(mixer, mixer.update(name).value)
    others = {s.name for s in mixer.states} - {name}
    if table is None or not any(isinstance(n, Timed) and n.name in others for n in walk(value)):
        return value, ()
    value = lift(value, others, ex, canon, table)
    return value, tuple(readout_name(r.index) for r in reads_of(value, table))


def _analyze_state(
    mixer: Mixer, name: str, ex: Expander, params, canon: Canon, column: bool, table
) -> StateFacts:
    decl = mixer.state(name)
    eq = mixer.update(name)
    shape = ex.typer.symbols[name].shape
    value, lifted = _lifted(mixer, name, ex, canon, table)
    try:
        expanded = tuple(ex.expand(value))
    except NotAffine as exc:
        why = f"{exc.why} ({exc.node}{_at(exc.node.span)})"
        return StateFacts(
            name, shape, False, NOT_AFFINE.transition(why, exc.node.span), (), "unknown", decl.span
        )
    terms = canon.factor(canon.combine(list(expanded)))
    if shape[1] == "1" and not column:
        terms = [_row_form(t, ex) for t in terms]
    reads, writes = _split_terms(terms, name)
    if any(len(where) > 1 for _, where in reads):
        why = f"{name} appears twice in one product{_at(eq.span)}"
        return StateFacts(
            name, shape, False, NOT_AFFINE.transition(why, eq.span), (), "unknown", decl.span
        )
    coupled = _check_direction(
        mixer, name, _other_state(terms, {s.name for s in mixer.states} - {name})
    )
    if coupled is not None:
        transition = DENSE.coupled(name, coupled, _at(coupled.span))
    elif not reads:
        transition = DENSE.no_recurrence(name, eq.span)
    else:
        ctx = RuleContext(name, shape, ex, params, eq.span, canon)
        read_terms = [(t, w[0]) for t, w in reads]
        transition = _canonical(classify(read_terms, ctx), eq, canon)
    write_terms, form = _writes(writes, shape, ex, canon, column)
    state = StateFacts(
        name, shape, True, transition, write_terms, form, decl.span, terms=expanded, column=column
    )
    state = replace(state, reads=lifted)
    state = _write_steps(state)
    state = replace(state, transition=_with_reason(state.transition, _write_reason(state)))
    if state.transition.reason is None and (chunk := _chunk_reason(state)) is not None:
        # a later, more general class may chunk what this one cannot (the delta rule
        # writing along another key than it erases along is diagonal plus low rank)
        other = _canonical(classify(read_terms, ctx, after=transition.transition_class), eq, canon)
        found = _write_steps(replace(state, transition=other, writes=write_terms))
        if other.reason is None and not _write_reason(found) and not _chunk_reason(found):
            state, chunk = found, None
        state = replace(state, transition=_with_reason(state.transition, chunk))
    if state.transition.reason is not None or state.transition.transition_class.kernel is None:
        if coupled is None and reads:
            state = _as_steps(state, value, eq, ex, params, canon)
    stability = "; ".join(
        note
        for part in state.transition.acting
        if (note := part.transition_class.stability(part, params)) is not None
    )
    return replace(state, stability=stability or None, backward=name in mixer.backward)


def _as_steps(state: StateFacts, value: Expr, eq, ex: Expander, params, canon: Canon):
    """`state` as several steps per token of one sub-token class (`mixc.analysis.steps`), when
    its update composes such steps; else `state` as it is."""
    name, shape = state.name, state.shape
    if shape[1] == "1":
        return state  # a vector state's steps would read it as a row: not needed yet
    ctx = RuleContext(name, shape, ex, params, eq.span, canon)

    def one_step(expr):
        try:
            terms = canon.factor(canon.combine(list(ex.expand(expr))))
        except NotAffine:
            return None
        reads, writes = _split_terms(terms, name)
        if not reads or any(len(where) > 1 for _, where in reads):
            return None
        tr = _canonical(classify([(t, w[0]) for t, w in reads], ctx), eq, canon)
        write_terms, _ = _writes(writes, shape, ex, canon, False)
        if not tr.transition_class.sub_tokens or tr.reason is not None or len(write_terms) != 1:
            return None
        if tr.transition_class.chunk_reason(name, tr, write_terms[0].key) is not None:
            return None
        return tr, write_terms[0]

    steps = split_steps(value, name, ex, one_step)
    if steps is None:
        return state
    transitions = tuple(tr for tr, _ in steps)
    shown = next((tr for tr in transitions if tr.gates), transitions[0])
    matched = list(dict.fromkeys(tr.rule.matched for tr in transitions))
    each = f"each {matched[0]}" if len(matched) == 1 else " then ".join(matched)
    transition = replace(
        shown,
        rule=replace(shown.rule, matched=f"{len(steps)} steps per token as sub-tokens, {each}"),
        gates=tuple(g for tr in transitions for g in tr.gates),
        args=NO_ARGS,  # each step's are its own
        steps=transitions,
        span=eq.value.span,
    )
    return replace(
        state,
        transition=transition,
        writes=tuple(w for _, w in steps),
        write_form="rank-1 outer products",
    )


def _write_steps(state: StateFacts) -> StateFacts:
    """A state that writes rank 1 several times a token, as that many steps of its class run
    as sub-tokens of its kernel (`TransitionClass.sub_tokens`): the first applies the
    transition and one write (for the delta rule, one along its erase key), each other only
    writes (`TransitionClass.identity_step`). Any other state as it is."""
    tr, writes = state.transition, state.writes
    cls = tr.transition_class
    several = len(writes) > 1 and state.write_form == "rank-1 outer products"
    if not several or tr.steps or not cls.sub_tokens or tr.reason is not None:
        return state
    if state.shape[1] == "1":
        return state  # a vector state's sub-tokens would read it as a row: not needed yet
    first = next((w for w in writes if not cls.chunk_reason(state.name, tr, w.key)), writes[0])
    rest = tuple(w for w in writes if w is not first)
    how = "joined, the transition once" if cls.joined_kernel else "as sub-tokens, the first with it"
    matched = f"{tr.rule.matched}; {len(writes)} writes a token {how}"
    transition = replace(
        tr,
        rule=replace(tr.rule, matched=matched),
        steps=(tr, *(cls.identity_step(tr) for _ in rest)),
    )
    return replace(state, transition=transition, writes=(first, *rest))


def _chunk_reason(state: StateFacts) -> str | None:
    """Why the state's class cannot chunk it with its (first) write although it matched."""
    lead = state.transition.parts[0]
    return lead.transition_class.chunk_reason(state.name, lead, state.kernel_writes[0].key)


def _split_terms(terms: list[Term], name: str):
    """The terms that read the state (with the positions of S_{t-1}) and the writes."""
    reads, writes = [], []
    for t in terms:
        where = _state_position(t, name)
        if where:
            reads.append((t, where))
        else:
            writes.append(t)
    return reads, writes


def _other_state(terms: list[Term], others: set[str]) -> Expr | None:
    """The first factor of a term that reads another state, if any (coupled states)."""
    for t in terms:
        for a in t.chain + t.scalars + t.gates:
            if any(isinstance(n, Timed) and n.name in others for n in walk(a)):
                return a
    return None


def _check_direction(mixer: Mixer, name: str, coupled: Expr | None) -> Expr | None:
    """`coupled` (the factor of the update of `name` that reads another state), once checked
    that it reads no state that runs the other way in time (a forward state reading a backward
    one, or the reverse): the two loops of a non-causal mixer run one direction after the
    other."""
    if coupled is None:
        return None
    backward = set(mixer.backward)
    read = next(n.name for n in walk(coupled) if isinstance(n, Timed) and n.name != name)
    if (read in backward) != (name in backward):
        ways = {True: "backward", False: "forward"}
        raise NotYetImplemented(
            f"the update of {name} (run {ways[name in backward]} in time) reads {read}, which "
            f"runs {ways[read in backward]}",
            coupled.span or mixer.update(name).value.span,
            hint="read a state of the other direction in an output only",
        )
    return coupled


def _canonical(transition: Transition, eq, canon: Canon) -> Transition:
    """The transition with canonical expressions, and a reason when a constant decay is not
    positive (log-space chunking needs a decay in (0, 1])."""
    transition = replace(
        transition,
        span=eq.value.span,
        args=transition.args.canonical(canon),
        gates=tuple(_canonical_gate(g, canon) for g in transition.gates),
    )
    negative = [g for g in transition.gates if (v := constant(g.decay)) is not None and v <= 0]
    if negative:
        return _with_reason(
            transition,
            f"NYI: the decay {negative[0].decay} is not positive; log-space chunking needs "
            "a decay in (0, 1]",
        )
    return transition


def _with_reason(tr: Transition, reason: str | None) -> Transition:
    """`tr` with a reason for having no chunked form, unless it has one already."""
    return tr if tr.reason is not None or reason is None else replace(tr, reason=reason)


def _write_reason(state: StateFacts) -> str | None:
    """Why the writes rule out a chunked form: not rank-1 outer products, or more than one."""
    name, form, n = state.name, state.write_form, len(state.writes)
    if form != "rank-1 outer products":
        return (
            f"NYI: the write term is {form}; chunked forms need a sum of rank-1 outer products "
            "v_t k_t^T"
        )
    if n > 1 and not state.transition.steps:
        tr = state.transition
        if state.shape[1] == "1":
            why = "several writes a token run as sub-tokens of a matrix state only"
        else:
            why = f"the {tr.transition_class.name} kernel takes one write a token"
        return (
            f"NYI: the write of {name} has rank {n} ({n} outer products a token) and {why}; "
            "recurrent and step run it"
        )
    return None


def _canonical_gate(g: LogGate, canon: Canon) -> LogGate:
    log = canon.column(g.log)
    return replace(g, log=log, note=g.note.replace(str(g.log), str(log)))


def _writes(
    terms: list[Term], shape: Shape, ex: Expander, canon: Canon, column: bool
) -> tuple[tuple[WriteTerm, ...], str]:
    out = []
    for t in terms:
        scale = (
            canon.terms([Term(coeff=t.coeff, scalars=t.scalars)])
            if (t.coeff != 1 or t.scalars)
            else None
        )
        if column and len(t.chain) == 1:
            # a column's write is a value (vectors multiplied entry by entry), its key the 1
            value = canon.terms([Term(chain=t.chain, gates=t.gates)])
            out.append(WriteTerm(value, Number("1"), scale))
            continue
        if t.gates:
            return (), "an elementwise product"
        if len(t.chain) == 1 and shape[1] == "1":
            out.append(WriteTerm(None, canon.column(t.chain[0]), scale))
        elif (split := _outer_split(t.chain, ex)) is not None:
            value, key = product(list(t.chain[:split])), product(list(t.chain[split:]))
            out.append(WriteTerm(canon(value), canon.column(key), scale))
        else:
            return (), f"not an outer product ({show(shape)} from {product(list(t.chain))})"
    if not out:
        return (), "empty (no write)"
    # the writes are a sum: in an order of their canonical text, not of their spelling, so that
    # equal updates give equal facts (a write spelled twice, once cancelled, keeps no place)
    out.sort(key=lambda w: (str(w.value), str(w.key), str(w.scale)))
    return _shared_factors(out, canon), "rank-1 outer products"


def _outer_split(chain: tuple[Expr, ...], ex: Expander) -> int | None:
    """Where a chain of factors is a column times a row (`diag(b) v k^T` at 2, `v k^T` at 1),
    None if it is no outer product."""
    for i in range(1, len(chain)):
        if ex.shape(chain[i - 1])[1] == "1" and ex.shape(chain[i])[0] == "1":
            return i
    return None


def _shared_factors(writes: list[WriteTerm], canon: Canon) -> tuple[WriteTerm, ...]:
    """Writes of one value joined into one write of the sum of their (scaled) keys, then writes
    of one key joined into one write of the sum of their (scaled) values: `v (a k + b k')^T`,
    which the expansion split into `a v k^T + b v k'^T`, is one rank-1 write (a token shift
    mixing a key with the previous token's), and so is `((1 - g) ⊙ v) k^T`, split into
    `v k^T - (g ⊙ v) k^T` (an input gate on the values)."""
    by_value = _joined(writes, canon, sum_keys=True)
    # a row-layout vector state's writes have no value (None): only their keys are joined
    if any(w.value is None for w in by_value):
        return by_value
    return _joined(list(by_value), canon, sum_keys=False)


def _joined(writes: list[WriteTerm], canon: Canon, sum_keys: bool) -> tuple[WriteTerm, ...]:
    """The writes that share a value (sum_keys) or a key joined into one write each, whose other
    factor is the sum of theirs times their scales; first appearances keep their order."""
    groups: dict[str, list[WriteTerm]] = {}
    for w in writes:
        groups.setdefault(str(w.value if sum_keys else w.key), []).append(w)
    out = []
    for same in groups.values():
        if len(same) == 1:
            out.append(same[0])
            continue
        summed = [w.key if sum_keys else w.value for w in same]
        scaled = [x if w.scale is None else Binary("*", w.scale, x) for w, x in zip(same, summed)]
        total = scaled[0]
        for x in scaled[1:]:
            total = Binary("+", total, x)
        if sum_keys:
            out.append(WriteTerm(same[0].value, canon.column(total), None))
        else:
            out.append(WriteTerm(canon(total), same[0].key, None))
    return tuple(out)


# ----------------------------------------------------------------------------- outputs
