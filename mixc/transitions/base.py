"""What a transition class is: the interface every class module implements.

A transition class is one structure of G_t in `H_t = G_t(H_{t-1}) + writes` (a scalar decay, a
diagonal gate, the delta rule, ...). Its module owns everything about it: the rule that
recognises it in the expanded update, the kernel its chunked form runs and that kernel's
arguments as spec expressions, its cost, the maths `mixc explain` prints, the input ranges that
keep it stable, and the pieces of random specs that exercise it. The registry
(`mixc.transitions.REGISTRY`) lists the classes in match order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import ClassVar, Self

from mixc.algebra.canon import Canon, signed
from mixc.algebra.expand import Expander, Term
from mixc.algebra.formula import Formula
from mixc.errors import Span
from mixc.frontend.ir import Binary, Expr
from mixc.frontend.shapes import Shape
from mixc.transitions.cost import ClassCost, GroupDims
from mixc.transitions.gates import LogGate, log_gate
from mixc.transitions.writing import RandomForm

__all__ = [
    "NO_ARGS",
    "ChunkSize",
    "Condition",
    "Erase",
    "KernelArg",
    "Maths",
    "Rule",
    "RuleContext",
    "Transition",
    "TransitionArgs",
    "TransitionClass",
    "UnitKey",
    "plain",
    "scalar_gates",
]

#: The update's terms that read the state, each with the position of S_{t-1} in its chain.
StateTerms = list[tuple[Term, int]]


@dataclass(frozen=True)
class Rule:
    """One entry of a class's rule table: the rule's name (`explain` and the generated modules
    print it), the label of the variant it finds ("scalar data-dependent") and what it matches.
    A class lists its entries once, in `TransitionClass.rules`, and builds its transitions from
    them, so that no name is written twice."""

    name: str
    label: str
    matched: str


@dataclass(frozen=True)
class Erase:
    """An erase `I - beta k k^T` a transition applies, for the report of `mixc explain`."""

    beta: Expr
    key: Expr


@dataclass(frozen=True)
class TransitionArgs:
    """What a class's rule finds in G_t besides its log-gates (the delta rule's beta and key, a
    full elementwise gate, ...). A class that finds some declares its own record, a frozen
    subclass in its module whose every field is an expression (or None) with the role it plays
    for the state in its metadata (`field(metadata={"role": "erase"})`: `mixc graph` labels the
    edges of the inputs it reads with it), so that a new argument touches that module only: the
    analysis canonicalises, compares and groups the records field by field, never by name. This
    base, with no fields, is the record of a class that finds none."""

    def exprs(self) -> tuple[Expr | None, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))

    def canonical(self, canon: Canon) -> Self:
        """The record with every expression canonical (a vector as a column)."""
        return replace(self, **{f.name: canon.column(getattr(self, f.name)) for f in fields(self)})

    def signature(self) -> tuple[str, ...]:
        """The record as text, field by field: equal signatures are equal arguments (the
        expressions are canonical), so the states that share them can share a kernel pass."""
        return tuple(str(e) for e in self.exprs())

    def roles(self) -> list[tuple[str, Expr]]:
        """Each expression with the role its field declares."""
        return [
            (f.metadata["role"], e)
            for f in fields(self)
            if (e := getattr(self, f.name)) is not None
        ]

    def erase(self) -> Erase | None:
        """The erase the transition applies, or None (`explain` reports it)."""
        return None

    def absent(self) -> Self:
        """The record with every expression absent (None): a step that changes nothing."""
        return replace(self, **{f.name: None for f in fields(self)})


#: The record of a transition whose rule finds nothing besides its log-gates.
NO_ARGS = TransitionArgs()


@dataclass(frozen=True)
class Transition:
    """What a class's rule found in one state's transition G_t: the rule (an entry of its
    class's table), the class, the log-gates and the class's own arguments."""

    rule: Rule
    transition_class: TransitionClass
    gates: tuple[LogGate, ...] = ()
    args: TransitionArgs = NO_ARGS
    reason: str | None = None  # why there is no chunked form
    span: Span | None = None
    #: Several steps per token (DeltaProduct), innermost first, each a transition of its class:
    #: then this transition is their composition, its gates all theirs (mixc.analysis.steps).
    steps: tuple[Transition, ...] = ()
    #: A step that changes nothing and only writes (a token's second write onwards, run as a
    #: sub-token of the class's kernel with every log-gate and argument zero).
    writes_only: bool = False

    @property
    def label(self) -> str:
        """The variant it names in reports ("scalar data-dependent")."""
        return self.rule.label

    def log(self, side: str) -> Expr | None:
        """Sum of the log-gates on one side ("scalar", "key" or "value"), or None."""
        logs = [g.log for g in self.gates if g.side == side]
        out = None
        for lg in logs:
            out = lg if out is None else Binary("+", out, lg)
        return out

    @property
    def sides(self) -> frozenset[str]:
        """The sides that carry a decay ("scalar", "key", "value")."""
        return frozenset(g.side for g in self.gates)

    @property
    def parts(self) -> tuple[Transition, ...]:
        """The transitions a token applies, in order: its steps, or itself."""
        return self.steps or (self,)

    @property
    def acting(self) -> tuple[Transition, ...]:
        """The parts that act on the state (not the steps that only write): their conditions,
        roles and stability are the transition's."""
        return tuple(p for p in self.parts if not p.writes_only)

    @property
    def lead_step(self) -> Transition:
        """The step that stands for all of them where one is shown or costed (the first with a
        decay: every step runs the kernel the decayed one needs), or itself."""
        return next((p for p in self.parts if p.gates), self.parts[0])

    @property
    def chunkable(self) -> bool:
        return self.reason is None


@dataclass(frozen=True)
class RuleContext:
    """What a rule may consult: the state, its shape, the algebra and the parameters' defaults."""

    state: str
    shape: Shape
    expander: Expander
    params: dict[str, Expr]
    span: Span | None
    canon: Canon

    def gate(self, decay: Expr, side: str) -> LogGate:
        """The log-gate of a decay, proved on its canonical form (so `exp(x + y - y)` is `exp(x)`)
        but reported as written."""
        return replace(log_gate(self.canon(decay), side, self.params), decay=decay)


@dataclass(frozen=True)
class KernelArg:
    """One argument of a chunked kernel beyond q, k and v, as a spec expression (None: the
    kernel's default, e.g. no gate). `layout` is "vector", "scalar", "matrix" (one value per
    entry of the state) or "factor" (a matrix multiplying another argument) for a per-token
    tensor, or "bound" for a number the analysis proved about one (a Number, passed as a
    float)."""

    name: str
    expr: Expr | None
    layout: str


@dataclass(frozen=True)
class Condition:
    """A bound a transition needs on an expression of the inputs to stay stable:
    lo <= expr <= hi, and why. The fuzzer, the benchmark, the tests and the examples draw their
    inputs within these bounds (`mixc.check.ranges`)."""

    expr: Expr
    lo: float
    hi: float
    why: str


@dataclass(frozen=True)
class UnitKey:
    """A key whose norm must be at most 1 for stability and that is not normalised: the inputs
    it reads are drawn as keys of norm <= 1 (`mixc.check.ranges`), and why. For a rank-1 term
    a b^T, `sides` holds (a, b): an input read on both sides is a key, one read on one side
    only a gate on it, drawn in [0, 1]."""

    expr: Expr
    why: str
    sides: tuple[Expr, Expr] | None = None


#: Where the classes' default chunk sizes were measured: `benchmarks/run.sh` times each shipped
#: spec's chunk forward at C = 32 and 64 and keeps the faster (benchmarks/RESULTS.md).
CHUNK_MEASURED_ON = (
    "measured on CPU (2 threads, fp32, B=1, NH=4, d=64, T=4096; benchmarks/RESULTS.md)"
)


@dataclass(frozen=True)
class ChunkSize:
    """A class's default chunk size, and why: what it was measured on, or that it was not."""

    size: int
    why: str


#: The default of a class whose chunk size was not measured.
UNMEASURED = ChunkSize(64, "not measured for this class: the kernels' default")


@dataclass(frozen=True)
class Maths:
    """What a class adds to a group's parallel form in `mixc explain`: legend entries, the
    chunked form (one formula a line), and the whole-sequence quadratic form if it has one."""

    legend: tuple[str, ...]
    form: tuple[str, ...]
    quadratic: str | None = None
    #: Whether the form applies the writes' scale itself (the delta rule's T = (...)^{-1}
    #: diag(β)): then the rows of V are the values without it.
    scales_writes: bool = False


def plain(terms: StateTerms) -> tuple[Term, tuple[Expr, ...], tuple[Expr, ...]] | None:
    """A transition of one term `left S_{t-1} right`: (term, left factors, right factors)."""
    if len(terms) != 1:
        return None
    t, at = terms[0]
    return t, t.chain[:at], t.chain[at + 1 :]


def scalar_gates(t: Term, ctx: RuleContext) -> list[LogGate]:
    """The log-gates of a term's scalar factors and of its coefficient."""
    gates = [ctx.gate(s, "scalar") for s in t.scalars]
    if t.coeff != 1:
        gates.append(ctx.gate(signed(t.coeff), "scalar"))
    return gates


def sum_of(a: Expr | None, b: Expr | None) -> Expr | None:
    if a is None:
        return b
    return a if b is None else Binary("+", a, b)


class TransitionClass:
    """One transition class. Subclasses override what their class has; the defaults describe a
    class with no chunked form, and `missing` says what a class must define (the registry
    refuses a class that lacks it)."""

    #: The class's name in the registry (also its module's name).
    name: ClassVar[str] = ""
    #: The backend-neutral kernel its chunked form runs (each backend implements it in its own
    #: kernel file of that name); None: no chunked form.
    kernel: ClassVar[str | None] = None
    #: Whether the kernel also has a quadratic (attention-like) `parallel` form.
    parallel: ClassVar[bool] = False
    #: The kernel that takes the writes' scale exp(s_t) as its log s_t and returns each output
    #: row scaled by its largest exponent (xLSTM's max-stabiliser), for a write scale that would
    #: overflow; None: the class has none (its writes are scaled before the kernel).
    stable_kernel: ClassVar[str | None] = None
    #: How a sequence's summary (P, F) acts on a state S_0, for context parallelism:
    #: "elementwise" (P ⊙ S_0 + F, P the product of the gates), else by a matrix product,
    #: probed as `summary_probe` says.
    summary_action: ClassVar[str] = "matmul"
    #: Whether the kernel runs several steps a token as sub-tokens (DeltaProduct): each step's
    #: k, v and arguments interleaved along time, an argument a step lacks (no decay) as 0, and
    #: the queries read at each token's last sub-token (mixc.analysis.steps).
    sub_tokens: ClassVar[bool] = False
    #: The kernel that takes several writes a token joined along the key and value axes
    #: (k [.., rank K], v [.., rank V]) with the transition applied once, where that measures
    #: faster than as many sub-tokens (benchmarks/RESULTS.md); None: several writes run as
    #: sub-tokens of `kernel`.
    joined_kernel: ClassVar[str | None] = None
    #: The kernel that reads several queries of one state in one pass (q a list of them, the
    #: outputs a list: the state passed from chunk to chunk once for all), taking the class's
    #: and the joined kernel's arguments; None: a pass a query.
    queries_kernel: ClassVar[str | None] = None
    #: Whether a write of the previous token's value and key under this token's transition,
    #: `c_t a_t v_{t-1} k_{t-1}^T`, folds into that token's own write in the chunked form, one
    #: rank-1 write a token (`mixc.analysis.folds`): the transition must act on an outer product
    #: as on a number (a scalar decay).
    folds_lag: ClassVar[bool] = False
    #: Whether the kernel runs on the state's transpose (a transition acting from the left, on
    #: the value side): a write `v k^T` reaches the kernel as `k v^T` (`StateFacts.kernel_writes`),
    #: and the kernel keeps the state as the others do, [K, V], reading it along the other axis.
    transposed: ClassVar[bool] = False
    #: One line: the algorithm of the stabilised kernel (for `explain`).
    stable_algorithm: ClassVar[str | None] = None
    #: The rule table: every rule it fires, each with the variant it finds.
    rules: ClassVar[tuple[Rule, ...]] = ()
    #: One line: the algorithm of the chunked form, or why there is none.
    algorithm: ClassVar[str] = "recurrent only (no chunked form)"
    #: Whether the cost model counts its recurrent step (False: a lower bound only).
    modelled: ClassVar[bool] = True

    def match(self, terms: StateTerms, ctx: RuleContext) -> Transition | None:
        """The transition, if `terms` (the update's terms that read the state) are this class."""
        return None

    def kernel_args(self, tr: Transition) -> tuple[KernelArg, ...]:
        """The kernel's arguments beyond q, k, v, the initial state and the chunk size."""
        return ()

    def chunk_reason(self, state: str, tr: Transition, write_key: Expr) -> str | None:
        """Why this state (with one write along `write_key`) has no chunked form although its
        transition is in the class."""
        return None

    def summary_reason(self, tr: Transition) -> str | None:
        """Why the kernel cannot compute the sequence's action on the state (a summary for
        context parallelism), or None when it can."""
        return None

    def summary_probe(self, tr: Transition) -> tuple[str, str] | None:
        """How the summary probes the kernel for the sequence's action: the kernel's write vector
        ("k" or "v") that runs along the axis of its state the transition leaves alone, and which
        axis of the kernel's state that is ("rows" or "columns"). The probe sets an identity
        beside a zero initial state along that axis and zeros beside that vector, so the final
        state holds the product of the transitions there. None: the sequence acts entry by
        entry (P ⊙ S_0 + F, P from a state of ones). The default: a transition acting on the
        kernel state's rows (the key side of S [K, V]), probed beside its values."""
        return ("v", "columns") if self.summary_action == "matmul" else None

    def chunk_size(self, tr: Transition) -> ChunkSize:
        """The default chunk size of the compiled `chunk`, and why (`CHUNK_MEASURED_ON`)."""
        return UNMEASURED

    def step_decays(self, tr: Transition) -> bool:
        """Whether the recurrent form decays the state by exp(log-gate), as the chunked form does
        (accurate gradients for a decay near 1), instead of the update as written."""
        return False

    def random_forms(self) -> dict[str, RandomForm]:
        """The transition forms of this class that random specs draw, by name, each a function
        that writes one update (`mixc.transitions.writing`)."""
        return {}

    def identity_step(self, tr: Transition) -> Transition:
        """The step of this class that changes nothing (no log-gate, every argument absent,
        which the sub-token lowering passes as zeros): the step a token's second write onwards
        runs as, after `tr`, the step that carries the token's transition and first write."""
        return replace(tr, gates=(), args=tr.args.absent(), steps=(), writes_only=True)

    def decay_conditions(self, state: str, tr: Transition) -> list[Condition]:
        """Every decay in (0, 1]: each log-gate <= 0."""
        return [
            Condition(g.log, -math.inf, 0.0, f"log-gate {g.log} of {state} must be <= 0")
            for g in tr.gates
        ]

    def conditions(self, state: str, tr: Transition) -> list[Condition]:
        """Every bound on the inputs that keeps the transition stable."""
        return self.decay_conditions(state, tr)

    def unit_key(self, state: str, tr: Transition) -> UnitKey | None:
        """A key of `state` whose norm must be at most 1 for stability, if there is one."""
        return None

    def maths(self, tr: Transition) -> Maths:
        """The chunked form as math in the spec's names (a class with a kernel defines it)."""
        raise NotImplementedError(f"{self.name} has no chunked form")

    def roles(self, tr: Transition) -> list[tuple[str, Expr]]:
        """What each expression of the transition does ("decay", "erase", ...), for the edge
        labels of `mixc graph`: the inputs an expression reads play that role for the state."""
        return [("decay", g.log) for g in tr.gates] + tr.args.roles()

    def stability(self, tr: Transition, params: dict[str, Expr]) -> str | None:
        """A note on what keeps the transition stable, for `mixc explain`; None when nothing
        beyond the proven decays."""
        return None

    def cost(self, tr: Transition, d: GroupDims) -> ClassCost:
        """FLOPs and bytes per token of the chunked and quadratic forms (a class with a kernel
        defines it)."""
        raise NotImplementedError(f"{self.name} has no chunked form")

    def decays(self, tr: Transition) -> bool:
        """Whether a recurrent step decays the state (elementwise work on every entry)."""
        return True

    def recurrent_flops(self, tr: Transition, d: GroupDims) -> Formula:
        """FLOPs per token of one recurrent step: the decay, the writes and the readouts."""
        decay = d.kv * (2 if {"key", "value"} <= tr.sides else 1) if self.decays(tr) else 0
        return decay + 2 * d.r * d.kv + 2 * d.nq * d.kv

    def missing(self) -> list[str]:
        """What a class of the rule table must define but inherits: its name, its rule table
        and its rule (`match`); with a kernel, the algorithm, maths and cost of its chunked form
        (`explain` and the cost model describe every chunked form, and the defaults are those of
        a class without one); with a stable kernel, that kernel's algorithm. A class without a
        kernel runs token by token only and needs none of them."""
        needed = ["name", "rules", "match"]
        if self.kernel is not None:
            needed += ["algorithm", "maths", "cost"]
        if self.stable_kernel is not None:
            needed.append("stable_algorithm")
        return [m for m in needed if getattr(type(self), m) is getattr(TransitionClass, m)]

    def __repr__(self) -> str:
        return f"<transition class {self.name}>"
