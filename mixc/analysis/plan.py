"""The plan: everything the backends and tools need about one spec, built once.

`analyze(spec)` runs every analysis and ends in one immutable `Plan`: the facts of each state
and output, the groups of states that share one chunked pass (each with its transition class,
the kernel it runs and that kernel's arguments as spec expressions, and its distinct readout
queries), and the forms the spec has (chunk, parallel, summary, step), each missing one with
its reason. The emitter, `explain`, `check`, `fuzz`, `bench`, `mixc.nn` and
`mixc.distributed` read the plan and derive nothing again.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import networkx as nx

from mixc.algebra.canon import Canon
from mixc.algebra.expand import Expander
from mixc.analysis.facts import OutputFacts, Readout, SpecWarning, StateFacts, WriteTerm
from mixc.analysis.folds import LagFold, lag_fold
from mixc.analysis.graph import dependency_graph
from mixc.analysis.outputs import Key, ReadoutTable, analyze_output, readout_name
from mixc.analysis.passes import passes
from mixc.analysis.scales import log_write_scale, scaled_output
from mixc.analysis.states import analyze_state
from mixc.errors import NotYetImplemented, SpecError
from mixc.frontend.ir import CHANNEL, Binary, Call, Expr, Mixer, Name, Number, Timed, Transpose
from mixc.frontend.limits import with_recursion_room
from mixc.frontend.shapes import SCALAR, Symbol, Typer
from mixc.frontend.spec import Spec
from mixc.transitions.base import ChunkSize, KernelArg, Transition, TransitionClass

__all__ = ["Forms", "GroupPlan", "Missing", "Plan", "Query", "SignCheck", "SubToken", "analyze"]


@dataclass(frozen=True)
class Missing:
    """Why a form is missing. `kind`: "sequential" (some state has no chunked form), "class" (the
    transition class's kernel cannot do it), "sign" (a decay the chunked forms take the log of
    can be negative), "lagged" (a summary of a spec that reads inputs at t-1), "noncausal" (a
    step or summary of a mixer with a backward state), or "no state"."""

    kind: str
    text: str


@dataclass(frozen=True)
class Forms:
    """The forms of the compiled module; None where the form exists, else why it is missing."""

    chunk: Missing | None
    parallel: Missing | None
    summary: Missing | None
    step: Missing | None = None  # every causal spec can be run token by token

    def names(self) -> tuple[str, ...]:
        """The forms that compute, in the order the module lists them."""
        have = [("chunk", self.chunk), ("parallel", self.parallel)]
        step = ("step",) if self.step is None else ()
        return (*(n for n, m in have if m is None), "recurrent", *step)


@dataclass(frozen=True)
class SignCheck:
    """A decay factor that is an input or a parameter as the caller passes it (`a_t`, `G_t`,
    `diag(a_t)`, `lam` without a default), whose sign the spec cannot prove: the chunked forms
    take its log, so chunk, parallel and summary check at run time that it has no negative
    entry (recurrent and step, which multiply by it, do not need to)."""

    name: str  # the input or parameter
    decay: Expr  # the decay as written
    state: str

    def describe(self) -> str:
        return f"{self.name} (the decay {self.decay} of {self.state})"


@dataclass(frozen=True)
class Query:
    """One distinct readout query of a group, and the readouts (`S_t query`) it serves; offset
    -1 when they read the states before the token's update (`S_{t-1} query`)."""

    expr: Expr
    readouts: tuple[Readout, ...]
    offset: int = 0


@dataclass(frozen=True)
class SubToken:
    """One of several steps a token applies (DeltaProduct), run as a sub-token of the group's
    kernel: its write and the kernel's arguments for it."""

    write: WriteTerm
    args: tuple[KernelArg, ...]


@dataclass(frozen=True)
class GroupPlan:
    """States with the same transition and write key: one kernel pass (their values side by
    side). `kernel` is None when the group has no chunked form."""

    states: tuple[str, ...]
    transition: Transition
    kernel: str | None
    args: tuple[KernelArg, ...]
    queries: tuple[Query, ...]
    summary: Missing | None
    #: s_t where the kernel carries the writes' scale exp(s_t) in log space (the class's
    #: stable_kernel, xLSTM's max-stabiliser); its outputs come scaled by `unscale`.
    log_scale: Expr | None = None
    #: Several steps per token, in order: the kernel runs len(sub_tokens) sub-tokens a token
    #: (each step's k, v and arguments interleaved along time, an argument a step lacks as 0),
    #: and the queries read at each token's last sub-token. Empty: one step a token.
    sub_tokens: tuple[SubToken, ...] = ()
    #: Its states run backward in time: the kernel runs on the time-reversed sequence (each
    #: packed sequence within its own bounds), its outputs reversed back.
    backward: bool = False
    #: Its state's two writes, this token's and the previous token's under this token's decay,
    #: folded into one write a token for the chunked form (`mixc.analysis.folds`); None: not so.
    lag: LagFold | None = None

    @property
    def joined(self) -> bool:
        """Several writes a token after one transition (the steps after the first only write),
        which the class's joined kernel takes side by side along the key and value axes, one
        step a token, in the chunked form."""
        steps = self.transition.steps
        return (
            len(steps) > 1
            and self.transition_class.joined_kernel is not None
            and all(s.writes_only for s in steps[1:])
        )

    @property
    def stacked(self) -> bool:
        """Its several queries read in one pass of the class's queries kernel in the chunked
        form (the state passed from chunk to chunk once for all): each at t (the state after
        the token's update), forward in time, one step a token or writes joined, no
        stabiliser and no fold."""
        return (
            self.transition_class.queries_kernel is not None
            and len(self.queries) > 1
            and all(q.offset == 0 for q in self.queries)
            and not self.backward
            and self.log_scale is None
            and self.lag is None
            and (len(self.transition.steps) <= 1 or self.joined)
        )

    @property
    def unscale(self) -> Name:
        """exp(-m_t), the factor the kernel's outputs carry, as a name in output expressions."""
        return Name(f"_unscale_{self.name}")

    @property
    def transition_class(self) -> TransitionClass:
        return self.transition.transition_class

    @property
    def algorithm(self) -> str:
        """The chunked pass's algorithm (a stabilised group's its own)."""
        return (
            self.transition_class.stable_algorithm
            if self.log_scale is not None
            else self.transition_class.algorithm
        )

    @property
    def name(self) -> str:
        """The group's name in generated code: its first state."""
        return self.states[0]


@dataclass(frozen=True)
class Plan:
    spec: Spec
    graph: nx.DiGraph = field(repr=False)
    order: tuple[str, ...]
    states: tuple[StateFacts, ...]
    outputs: tuple[OutputFacts, ...]
    groups: tuple[GroupPlan, ...]
    forms: Forms
    algorithm: str
    warnings: tuple[SpecError, ...]
    chunk_size: ChunkSize  # the compiled chunk's default, and why
    #: Shapes of every name, readouts (`_r0`, ...) included, and the algebra over them: built
    #: once here, read (never changed) by the backends.
    typer: Typer = field(repr=False, compare=False)
    expander: Expander = field(repr=False, compare=False)
    #: Decays passed in by the caller whose sign is not proven: checked at run time by the
    #: chunked forms (one comparison over the input, and a device sync, per call).
    sign_checks: tuple[SignCheck, ...] = ()

    @property
    def mixer(self) -> Mixer:
        return self.spec.mixer

    @property
    def chunkable(self) -> bool:
        return self.forms.chunk is None

    @property
    def reason(self) -> str | None:
        """Why there is no chunked form (None when there is one)."""
        return None if self.forms.chunk is None else self.forms.chunk.text

    def state(self, name: str) -> StateFacts:
        return next(s for s in self.states if s.name == name)


@with_recursion_room
def analyze(spec: Spec) -> Plan:
    """The plan of one verified spec. Raises located SpecErrors (a non-causal spec, an output
    that does not read its states linearly)."""
    try:
        return _analyze(spec)
    except SpecError as exc:
        raise exc.located(spec.source) from None


#: How the bounds of a gate see a size read as a number: as 1 + idx, in [1, inf).
SIZE_BOUND = Binary("+", Number("1"), Name(CHANNEL))


def _analyze(spec: Spec, numbers: dict[Key, int] | None = None) -> Plan:
    mixer = spec.mixer
    graph = dependency_graph(mixer)
    order = tuple(eq.target for eq in spec.order)
    typer = Typer(mixer, dict(spec.symbols))  # a copy: the readouts' symbols join it below
    ex = Expander(mixer, typer, {s.name for s in mixer.states})
    canon = Canon(ex)
    # what the bounds of gates read a name by: a parameter's default, and a size (a whole
    # number >= 1) bounded as 1 + idx is, by [1, inf)
    params = {p.name: p.default for p in mixer.params}
    params |= {n: SIZE_BOUND for n, s in spec.symbols.items() if s.kind == "size"}
    table = ReadoutTable(typer, numbers)  # every readout, typed as it is found
    states = tuple(
        analyze_state(mixer, s.name, ex, params, canon, table=table) for s in mixer.states
    )
    outputs = tuple(
        analyze_output(mixer, eq, ex, spec.shapes[eq.target], canon, table) for eq in mixer.outputs
    )
    readouts = tuple(table.items)
    # the output lists every readout (those the states' updates read too), by number
    outputs = tuple(replace(o, readouts=readouts) for o in outputs)
    columns = _columns(mixer, outputs)
    if columns:
        states = tuple(
            analyze_state(mixer, s.name, ex, params, canon, column=True, table=table)
            if s.name in columns
            else s
            for s in states
        )
    canonical = None if numbers is not None else table.canonical()
    if canonical is not None:  # found in another order: analysed again, numbered canonically
        return _analyze(spec, canonical)
    levels, cycle = passes(states, readouts)
    groups, outputs = _stabilised(_groups(states, outputs, levels), outputs, states)
    groups = tuple(_folded(g, states, readouts, canon) for g in groups)
    for g in groups:
        if g.log_scale is not None:
            typer.symbols[g.unscale.name] = Symbol("readout", SCALAR)
    forms = _non_causal(mixer, _forms(mixer, states, groups, cycle))
    # the plan is read, never changed: its Typer first types what the backends will ask about
    ex.freeze(mixer.params, mixer.equations, states, outputs, groups)
    return Plan(
        spec,
        graph,
        order,
        states,
        outputs,
        groups,
        forms,
        _algorithm(groups, forms),
        _warnings(spec, graph, states, outputs),
        _chunk_size(groups),
        typer,
        ex,
        _sign_checks(mixer, states) if forms.chunk is None else (),
    )


def _caller_value(mixer: Mixer, e: Expr) -> str | None:
    """The input or parameter (without a default) that `e` is, as the caller passes it (through
    a transpose or a diag), or None for anything the spec computes."""
    while isinstance(e, Transpose) or (isinstance(e, Call) and e.func == "diag"):
        e = e.operand if isinstance(e, Transpose) else e.args[0]
    if isinstance(e, Timed) and any(d.name == e.name for d in mixer.inputs):
        return e.name
    if isinstance(e, Name) and any(p.name == e.name and p.default is None for p in mixer.params):
        return e.name
    return None


def _sign_checks(mixer: Mixer, states) -> tuple[SignCheck, ...]:
    """The decay factors the caller passes whose sign is not proven, one check per name."""
    checks: dict[str, SignCheck] = {}
    for s in states:
        for g in s.transition.gates:
            for factor in g.unsigned:
                name = _caller_value(mixer, factor)
                if name is not None and name not in checks:
                    checks[name] = SignCheck(name, g.decay, s.name)
    return tuple(checks.values())


def _unsigned(mixer: Mixer, states) -> Missing | None:
    """Why there is no chunked form when a decay the spec computes can be negative (its sign
    not proven by interval arithmetic): the chunked forms take its log, NaN at a negative
    decay, where the recurrence multiplies by it."""
    for s in states:
        for g in s.transition.gates:
            computed = [f for f in g.unsigned if _caller_value(mixer, f) is None]
            if computed:
                inner = g.decay.operand if isinstance(g.decay, Transpose) else g.decay
                product = isinstance(inner, Binary) and inner.op in ("*", "@")
                factor = f" (its factor {computed[0]})" if product else ""
                return Missing(
                    "sign",
                    f"{s.name}: the decay {g.decay}{factor} can be negative (its sign is not "
                    "proven) and the chunked forms work with log(decay); for them, write it "
                    "provably positive: sigmoid(x), exp(-softplus(x)), exp(dt A)",
                )
    return None


def _chunk_size(groups: tuple[GroupPlan, ...]) -> ChunkSize:
    """The default chunk size of the groups' classes; with several, the smallest."""
    sizes = [g.transition_class.chunk_size(g.transition) for g in groups if g.kernel]
    if not sizes:
        return ChunkSize(64, "no chunked form: unused")
    best = min(sizes, key=lambda c: c.size)
    if any(c.size != best.size for c in sizes):
        return ChunkSize(best.size, f"the smallest of the groups' defaults ({best.why})")
    return best


def _columns(mixer: Mixer, outputs) -> set[str]:
    """The vector states that outputs read entry by entry, which therefore run as columns (one
    key channel, their entries as values). Raises NYI for one also read by a dot product."""
    readouts = [r for o in outputs for r in o.readouts]
    columns = {r.state for r in readouts if r.entrywise}
    both = sorted(columns & {r.state for r in readouts if not r.entrywise})
    if both:
        raise NotYetImplemented(
            f"the vector state {both[0]} is read both entry by entry and by a dot product",
            mixer.state(both[0]).span,
            hint=f"read {both[0]} one way, or give each read its own state",
        )
    return columns


def _group_key(s: StateFacts) -> tuple:
    tr = s.transition
    if not tr.chunkable or len(s.writes) != 1 or tr.steps or tr.transition_class.transposed:
        return ("alone", s.name)  # a transposed state's values are not the kernel's columns
    return (
        s.backward,
        tr.transition_class.name,
        tr.label,
        tuple((g.side, str(g.log)) for g in tr.gates),
        tr.args.signature(),
        str(s.writes[0].key),
    )


def _groups(states, outputs, levels: dict[str, int]) -> tuple[GroupPlan, ...]:
    """States with the same transition and one write of the same key share one chunked pass
    (their values are concatenated), as the normaliser z shares H's pass; only states of one
    level of a pipeline do (`mixc.analysis.passes`), and the passes run level by level."""
    members: dict[tuple, list[StateFacts]] = {}
    for s in sorted(states, key=lambda s: levels[s.name]):
        members.setdefault((levels[s.name], *_group_key(s)), []).append(s)
    readouts = [r for o in outputs for r in o.readouts]
    out = []
    for group in members.values():
        names = tuple(s.name for s in group)
        tr = group[0].transition
        chunked = tr.chunkable and tr.transition_class.kernel is not None
        summary = tr.transition_class.summary_reason(tr) if chunked else None
        queries = _queries([r for r in readouts if r.state in names])
        sub_tokens = ()
        if chunked and tr.steps:
            sub_tokens = _sub_tokens(group[0], queries)
        out.append(
            GroupPlan(
                names,
                tr,
                tr.transition_class.kernel if chunked else None,
                tr.transition_class.kernel_args(tr) if chunked and not tr.steps else (),
                queries,
                None if summary is None else Missing("class", f"{names[0]} {summary}"),
                sub_tokens=sub_tokens,
                backward=group[0].backward,
            )
        )
    return tuple(out)


def _folded(group: GroupPlan, states, readouts, canon: Canon) -> GroupPlan:
    """`group` with its lagged write folded into its token's own (`lag_fold`) where it is one
    state of joined writes that its chunked kernel runs unstabilised."""
    if len(group.states) != 1 or not group.joined or group.log_scale is not None:
        return group
    state = next(s for s in states if s.name == group.name)
    return replace(group, lag=lag_fold(state, readouts, group.queries, canon))


def _sub_tokens(state: StateFacts, queries: tuple[Query, ...]) -> tuple[SubToken, ...]:
    """The sub-tokens of a state that applies several steps a token. Raises NYI for a readout
    of the state before the token's update, which would read at the first sub-token."""
    previous = next((q for q in queries if q.offset), None)
    if previous is not None:
        raise NotYetImplemented(
            f"{state.name} applies {len(state.transition.steps)} steps a token and an output "
            f"reads {state.name}_{{t-1}}; the chunked form reads each token's last sub-token only",
            previous.readouts[0].query.span or state.span,
            hint=f"read {state.name}_t",
        )
    return tuple(
        SubToken(w, tr.transition_class.kernel_args(tr))
        for tr, w in zip(state.transition.steps, state.writes, strict=True)
    )


def _stabilised(groups, outputs, states):
    """Groups whose writes share a scale exp(s_t) that their kernel can carry in log space, with
    every output that reads them a ratio the scale cancels from (`scaled_output`): those groups
    with their log scale, those outputs with their scaled form. Others stay as they were."""
    groups, outputs = list(groups), list(outputs)
    for n, g in enumerate(groups):
        members = [next(s for s in states if s.name == name) for name in g.states]
        scale = log_write_scale(members)
        if g.kernel is None or g.transition_class.stable_kernel is None or scale is None:
            continue
        if any(q.offset for q in g.queries):
            continue
        if any(r.state in g.states for s in states for r in _named(outputs, s.reads)):
            continue  # a later pass reads its readouts, which would come scaled
        readers = [o for o in outputs if any(r.state in g.states for r in o.readouts)]
        scaled = {o.name: scaled_output(o, g.unscale) for o in readers}
        if not readers or any(
            e is None or any(r.state not in g.states for r in o.readouts)
            for o, e in zip(readers, scaled.values(), strict=True)
        ):
            continue
        groups[n] = replace(g, log_scale=scale)
        outputs = [replace(o, scaled=scaled.get(o.name, o.scaled)) for o in outputs]
    return tuple(groups), tuple(outputs)


def _named(outputs, names: tuple[str, ...]) -> list[Readout]:
    """The readouts called `names` (`_r0`, ...)."""
    return [r for r in outputs[0].readouts if readout_name(r.index) in names] if outputs else []


def _queries(readouts: list[Readout]) -> tuple[Query, ...]:
    """The distinct queries (with the time they read the states at), in the order of their
    first readout."""
    by_text: dict[tuple[str, int], list[Readout]] = {}
    for r in readouts:
        by_text.setdefault((str(r.query), r.offset), []).append(r)
    return tuple(Query(rs[0].query, tuple(rs), rs[0].offset) for rs in by_text.values())


def _forms(mixer: Mixer, states, groups, cycle: str | None) -> Forms:
    reasons = [f"{s.name}: {s.transition.reason}" for s in states if s.transition.reason]
    if cycle is not None and not reasons:
        reasons = [cycle]
    if not states:
        # every token's output reads only that token's values (and inputs at t-1): chunk and
        # parallel compute it over the whole sequence at once; there is no state to summarise
        return Forms(None, None, _lagged(mixer) or Missing("no state", "the mixer has no state"))
    if reasons:
        chunk = Missing("sequential", "; ".join(reasons))
    else:
        chunk = _unsigned(mixer, states)
    if chunk is not None:
        sequential = Missing(chunk.kind, chunk.text.replace("NYI: ", ""))
        return Forms(chunk, chunk, sequential)
    no_parallel = [g for g in groups if not g.transition_class.parallel or g.log_scale is not None]
    parallel = (
        Missing(
            "class",
            f"{no_parallel[0].name}: the {no_parallel[0].transition_class.name} kernel has no "
            "quadratic form"
            + (" with a stabiliser" if no_parallel[0].transition_class.parallel else ""),
        )
        if no_parallel
        else None
    )
    summary = next((g.summary for g in groups if g.summary is not None), None)
    # a pipeline has one too: a later state's, given the earlier states at the slice's start
    return Forms(None, parallel, summary or _lagged(mixer))


def _non_causal(mixer: Mixer, forms: Forms) -> Forms:
    """A mixer with a backward state has no step (its output at t reads the tokens after t) and
    no summary for context parallelism (the summary of a backward state would pass from later
    ranks to earlier ones, which mixc.distributed does not do)."""
    if mixer.causal:
        return forms
    name = mixer.backward[0]
    update = mixer.update(name)
    where = f" (line {update.span.line})" if update.span else ""
    runs = f"{name} runs backward in time: its update{where} reads {name}_{{t+1}}"
    step = Missing(
        "noncausal",
        f"the mixer is non-causal ({runs}), so an output needs the whole sequence; "
        "run chunk or recurrent on whole sequences",
    )
    summary = Missing(
        "noncausal",
        f"{runs}; context parallelism would pass its summary from later ranks to earlier "
        "ones, which mixc.distributed does not do",
    )
    return replace(forms, step=step, summary=forms.summary or summary)


def _lagged(mixer: Mixer) -> Missing | None:
    """Why a spec that reads inputs at t-1, or the position, has no summary (None for one that
    reads neither)."""
    if mixer.positioned:
        return Missing(
            "lagged",
            "the spec reads pos_t: a slice's transition depends on where the slice starts, "
            "which the summary does not know",
        )
    if not mixer.lagged:
        return None
    lagged = ", ".join(f"{d.name}_{{t-1}}" for d in mixer.lagged)
    return Missing(
        "lagged",
        f"the spec reads {lagged}: a slice's first token needs the previous slice's last, "
        "which the summary does not carry",
    )


def _algorithm(groups: tuple[GroupPlan, ...], forms: Forms) -> str:
    """The algorithms of the groups' chunked passes (a stabilised group's its own)."""
    if forms.chunk is not None:
        return "recurrent only"
    if not groups:
        return "no state: the output of every token at once, elementwise"
    return "; ".join(sorted({g.algorithm for g in groups}))


def _warnings(spec, graph, states, outputs) -> tuple[SpecWarning, ...]:
    warnings = []
    for s in states:
        for g in s.transition.gates:
            if not g.proven:
                warnings.append(
                    SpecWarning(
                        f"cannot prove the decay {g.decay} of {s.name} is in (0, 1] ({g.note})",
                        g.decay.span or s.transition.span,
                        spec.source,
                        hint="if it can exceed 1 the state grows without bound; parametrise it "
                        "as exp(-softplus(x)), sigmoid(x), or exp(dt A) with A = -exp(A_log)",
                    )
                )
        if not any(nx.has_path(graph, s.name, o.name) for o in outputs):
            warnings.append(
                SpecWarning(
                    f"state {s.name} is never read by an output",
                    s.span,
                    spec.source,
                    hint=f"read it in an output (y_t = {s.name}_t q_t) or delete it",
                )
            )
    return tuple(warnings)
