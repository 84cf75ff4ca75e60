"""The lowered program: what each form of a compiled mixer computes, as kernel calls.

A plan says what a spec is (its states' classes, groups, readouts, forms); the program says how
each form runs it, in terms every backend shares: the per-token values a kernel call takes (spec
expressions, already inlined), which kernel and variant it calls, the layout of each argument,
where a query is read a token early, how several steps a token are interleaved, which states a
call starts from and returns, and how the output is put together. A backend renders the program
as text and decides nothing of this itself. Everything here is immutable.

`dump(program)` prints it, for debugging a lowering or a backend.
"""

from __future__ import annotations

from dataclasses import dataclass

from mixc.analysis.folds import LagFold
from mixc.analysis.plan import SignCheck
from mixc.frontend.ir import Expr, Mixer
from mixc.frontend.shapes import Typer
from mixc.frontend.spec import Spec
from mixc.transitions.base import ChunkSize, KernelArg

__all__ = [
    "BackwardLoop",
    "Call",
    "Decay",
    "Output",
    "Product",
    "Program",
    "QueryRead",
    "Readout",
    "Recurrence",
    "SequenceForm",
    "SignCheck",
    "Slot",
    "StateNote",
    "Step",
    "Summary",
    "SummaryCall",
    "Update",
    "Value",
]


@dataclass(frozen=True)
class Value:
    """One state's value in a call (the group's values side by side): `expr` None for a vector
    state, whose value is a column of ones; `scale` multiplies it before the call (None: no
    scale, or one the kernel takes as its log)."""

    state: str
    expr: Expr | None
    scale: Expr | None


@dataclass(frozen=True)
class Step:
    """What one step of a token passes a kernel: its key, the values of the group's states and
    the class's arguments (`KernelArg`: a spec expression and its layout)."""

    key: Expr
    values: tuple[Value, ...]
    args: tuple[KernelArg, ...]


@dataclass(frozen=True)
class Slot:
    """A state's place in its group's kernel layout [.., K, width]: `width` value channels (a
    size symbol, or "1" for a vector state, which the kernel holds as its rows). `shape` is the
    state's own; a vector state read entry by entry (a column) is not `vector` but has one
    column."""

    state: str
    shape: tuple[str, str]
    width: str
    vector: bool


@dataclass(frozen=True)
class Readout:
    """A readout the call's output serves: the local `name` that holds it and what it reads
    (`shown`, the spec's `S_t q_t`, for the generated line's comment)."""

    name: str
    state: str
    shown: Expr


@dataclass(frozen=True)
class QueryRead:
    """One query of a call. `query` None: no readout (the chunked form still runs for the final
    states, with a zero query). `previous`: the readouts read the states before the token's
    update, S_{t-1} q_t, which is the kernel's S_s q_{s+1} one token later."""

    query: Expr | None
    previous: bool
    readouts: tuple[Readout, ...]


@dataclass(frozen=True)
class Call:
    """One kernel call of a sequence form: a group of states that share one pass.

    `kernel` is the backend-neutral name of the kernel function (`chunk_delta`,
    `parallel_scalar_decay`, a stabilised `chunk_..._stable`); `steps` holds one step a token,
    or several, interleaved along time as sub-tokens whose last one each query reads;
    `log_scale` is the write scale the kernel takes as its log, its outputs then scaled by the
    readout `unscale`; `initial` says whether it starts from the carried states and returns the
    final ones (the chunked form) or starts from zero (the quadratic form)."""

    group: str
    label: str
    slots: tuple[Slot, ...]
    kernel: str
    steps: tuple[Step, ...]
    queries: tuple[QueryRead, ...]
    initial: bool
    log_scale: Expr | None = None
    unscale: str | None = None
    #: The steps are one transition and writes only, joined along the key and value axes into
    #: one step a token (k [.., n K], v [.., n V]: the class's joined kernel), not sub-tokens.
    joined: bool = False
    #: Its several queries are read in one pass of the class's queries kernel (q a list, the
    #: outputs a list, one a query): the state passes from chunk to chunk once for them all.
    stacked: bool = False
    #: The readouts of earlier calls this call's inputs read (a pipeline of states: `_read_Ks`
    #: in the query of Vs's pass), by their locals; the calls run in an order that makes them.
    reads: tuple[str, ...] = ()
    #: The group's states run backward in time: every per-token argument is reversed along
    #: time (each packed sequence within its own bounds) before the kernel, which then runs
    #: as it does forward, and its outputs are reversed back. The initial state is the one
    #: after the sequence's end, the final state the one at its first token.
    reverse: bool = False
    #: The state's lagged write folded into its token's own (`mixc.analysis.folds`): `steps`
    #: is that one write, its value scaled by d_t + c_{t+1}; the initial state takes the lagged
    #: write at each sequence's first token, and each readout loses c_{t+1} v_t (k_t . q_t).
    lag: LagFold | None = None

    @property
    def states(self) -> tuple[str, ...]:
        return tuple(s.state for s in self.slots)


@dataclass(frozen=True)
class Output:
    """The output `name` (the spec's), computed from the readouts as `expr`; `shown` is the
    spec's equation for the comment. `expr` None: the output is a readout itself, `name`."""

    name: str
    expr: Expr | None
    shown: Expr


@dataclass(frozen=True)
class SequenceForm:
    """A form over whole sequences (`chunk`, `parallel`): its kernel calls, then the output.
    `packed`: it takes packed sequences (cu_seqlens)."""

    name: str
    calls: tuple[Call, ...]
    output: Output
    packed: bool
    sign_checks: tuple[SignCheck, ...]


@dataclass(frozen=True)
class SummaryCall:
    """One group's part of the summary (P, F), the sequence's action on a state S_0: `action`
    "matmul" (the kernel run on probes, an identity initial state beside zero writes, along
    the axis `probe` names: `TransitionClass.summary_probe`) or "elementwise" (P ⊙ S_0 + F: F
    from a zero state, P from a state of ones with no writes)."""

    group: str
    slots: tuple[Slot, ...]
    kernel: str
    steps: tuple[Step, ...]
    action: str
    probe: tuple[str, str] = ("v", "columns")


@dataclass(frozen=True)
class Summary:
    """The summary form: its calls in group order, or why it is missing (`missing`). In a
    pipeline, `runs` are the chunked passes (from the states given to the summary) of the
    groups whose readouts a later group's pass reads, each run before its group's probes: a
    later state's summary is then its action given the earlier states' values at the start."""

    calls: tuple[SummaryCall, ...]
    sign_checks: tuple[SignCheck, ...]
    missing: str | None = None
    runs: tuple[Call, ...] = ()


@dataclass(frozen=True)
class Product:
    """One product of an affine update: coeff * scalars * (chain, a matrix product) * gates
    (elementwise factors on the whole chain)."""

    coeff: float
    scalars: tuple[Expr, ...]
    chain: tuple[Expr, ...]
    gates: tuple[Expr, ...]


@dataclass(frozen=True)
class Decay:
    """One factor of a decaying update's gate: `factor` multiplies the state on the left (a
    scalar or the value side) or, transposed, entry by entry on the key side (`side` "key");
    `from_log` says it is exp(log-gate) rather than the decay as written."""

    factor: Expr
    side: str
    from_log: bool


@dataclass(frozen=True)
class Update:
    """One state's update in the recurrence: the state times `decays` plus `writes` (a decaying
    update, its decay from its log-gates); else (`decays` None) `writes` alone, an affine
    update's products; else `expr`, the update as written (not affine)."""

    state: str
    shown: Expr
    expr: Expr | None = None
    writes: tuple[Product, ...] = ()
    decays: tuple[Decay, ...] | None = None


@dataclass(frozen=True)
class BackwardLoop:
    """The loop of a non-causal mixer's backward states, run from the last token to the first
    before the forward loop: the inputs sliced at each token, each backward state's update,
    and the readouts of them the output reads (`reads`: the local that keeps each token's
    value, and the readout as spec text, `G_{t+1} q_t` read before the token's update)."""

    sliced: tuple[str, ...]
    updates: tuple[Update, ...]
    reads: tuple[tuple[str, Expr], ...]


@dataclass(frozen=True)
class Recurrence:
    """The token-by-token loop of `recurrent` and `step`: the inputs sliced at each token, each
    state's update in evaluation order, and the output (inlined). A non-causal mixer runs its
    backward states first (`backward`), and its output reads their readouts by local."""

    sliced: tuple[str, ...]
    updates: tuple[Update, ...]
    output: Expr
    shown: Expr
    backward: BackwardLoop | None = None


@dataclass(frozen=True)
class StateNote:
    """What the module's docstring and tables say of a state."""

    name: str
    label: str
    rule: str
    summary_action: str


@dataclass(frozen=True)
class Program:
    """A plan lowered: every form a backend renders, and the spec they compute.

    `chunk` and `parallel` are None where the form is missing (`no_chunk` says why there is no
    chunked form). `names` gives the spec's name of each computation it names (a per-token
    value, a let function's call), so a backend can name a repeated subexpression after it.
    `readouts` pairs each readout's name in the output's expressions (`_r0`) with the local a
    backend holds it in (`_read_H`, after the state it reads).
    `typer` answers the shape of every expression of the program (readouts included)."""

    spec: Spec
    typer: Typer
    states: tuple[StateNote, ...]
    forms: tuple[str, ...]
    chunk: SequenceForm | None
    parallel: SequenceForm | None
    summary: Summary
    recurrence: Recurrence
    chunk_size: ChunkSize
    no_chunk: str | None
    names: tuple[tuple[Expr, str], ...]
    readouts: tuple[tuple[str, str], ...]
    #: Why there is no step form (a non-causal mixer); None: there is one.
    no_step: str | None = None

    @property
    def mixer(self) -> Mixer:
        return self.spec.mixer

    @property
    def calls(self) -> tuple[Call, ...]:
        """The chunked form's kernel calls (none without a chunked form)."""
        return self.chunk.calls if self.chunk is not None else ()


def dump(program: Program) -> str:
    """The program as text, one line per step of each form: for reading a lowering."""
    lines = [f"program {program.mixer.name}: forms {', '.join(program.forms)}"]
    for form in (program.chunk, program.parallel):
        if form is None:
            continue
        lines.append(f"{form.name}{' (packed)' if form.packed else ''}:")
        for c in form.calls:
            steps = f", {len(c.steps)} sub-tokens a token" if len(c.steps) > 1 else ""
            steps = f", {len(c.steps)} writes a token joined" if c.joined else steps
            steps = ", the lagged write folded into the token's own" if c.lag else steps
            steps += f", {len(c.queries)} queries in one pass" if c.stacked else ""
            start = "from the carried states" if c.initial else "from zero"
            lines.append(f"  {' and '.join(c.states)}: {c.kernel} {start}{steps}")
            if c.reads:
                lines.append(f"    after the passes it reads: {', '.join(c.reads)}")
            for i, step in enumerate(c.steps, 1):
                at = f" (step {i})" if len(c.steps) > 1 else ""
                lines.append(f"    k{at} = {step.key}")
                for v in step.values:
                    scale = f" (times {v.scale})" if v.scale is not None else ""
                    lines.append(f"    v[{v.state}]{at} = {v.expr or 'ones'}{scale}")
                lines += [f"    {a.name}{at} = {a.expr} [{a.layout}]" for a in step.args if a.expr]
            if c.lag is not None:
                lines.append(f"    c = {c.lag.coeff} (the lagged write's scale less the decay)")
            if c.log_scale is not None:
                lines.append(f"    log_scale = {c.log_scale} (outputs times {c.unscale})")
            if c.reverse:
                lines.append(
                    "    on the time-reversed sequence (each packed sequence in its bounds)"
                )
            for q in c.queries:
                early = " read a token early (S_{t-1} q_t)" if q.previous else ""
                reads = ", ".join(r.name for r in q.readouts) or "none"
                lines.append(f"    q = {q.query}{early} -> {reads}")
        out = form.output
        value = out.expr if out.expr is not None else out.name
        lines.append(f"  {program.mixer.outputs[0].target} = {value}")
    r = program.recurrence
    if r.backward is not None:
        lines.append("backward loop (from the last token):")
        lines += [f"  {u.state}: {len(u.writes)} products" for u in r.backward.updates]
        lines += [f"  {name} = {read}" for name, read in r.backward.reads]
    lines.append("recurrence:")
    for u in r.updates:
        how = "as written" if u.expr is not None else f"{len(u.writes)} products"
        decays = ""
        if u.decays is not None:
            decays = f", decayed by {', '.join(str(d.factor) for d in u.decays) or 'nothing'}"
        lines.append(f"  {u.state}: {how}{decays}")
    lines.append(f"  output = {r.shown}")
    return "\n".join(lines)
