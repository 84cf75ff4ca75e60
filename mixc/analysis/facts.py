"""The facts the analysis finds about one spec: immutable values, printed by `mixc explain` and
read by the plan (`mixc.analysis.plan`), never recomputed by a consumer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from mixc.algebra.expand import Term
from mixc.errors import Span, SpecError
from mixc.frontend.ir import Binary, Expr
from mixc.frontend.shapes import Shape

if TYPE_CHECKING:
    from mixc.transitions.base import TransitionClass

__all__ = [
    "LogGate",
    "OutputFacts",
    "Readout",
    "SpecWarning",
    "StateFacts",
    "Transition",
    "WriteTerm",
]


class SpecWarning(SpecError):  # noqa: N818 - a warning, not an error
    """A located warning: the spec compiles, but something in it is probably wrong."""

    kind = "warning"


@dataclass(frozen=True)
class LogGate:
    """One decay factor and its logarithm in a numerically safe form."""

    side: str  # "scalar" | "key" | "value"
    decay: Expr  # as written (for a vector gate: the vector of decays)
    log: Expr  # log of the decay, safe to evaluate (logsigmoid(a), dt A, log(gamma)); canonical
    proven: bool  # provably in (0, 1]
    note: str


@dataclass(frozen=True)
class Transition:
    """What a class's rule found in one state's transition G_t.

    `kind` is the transition class (an object of the registry in `mixc.transitions`); `cls` the
    variant it names in reports ("scalar data-dependent"); `rule` the rule that fired and what
    it matched.
    """

    cls: str
    rule: str  # "<rule name>: <what it matched>", e.g. "delta: S_{t-1} (I - beta_t k_t k_t^T)"
    gates: tuple[LogGate, ...] = ()
    beta: Expr | None = None  # identity minus rank-1: I - beta k k^T
    key: Expr | None = None
    gate: Expr | None = None  # a full elementwise gate (recurrent only)
    reason: str | None = None  # why there is no chunked form
    span: Span | None = None
    kind: TransitionClass | None = None

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
    def rule_name(self) -> str:
        """The name of the rule that fired (`scalar_data`, `gated_delta`, `not_affine`, ...)."""
        return self.rule.split(":", 1)[0]

    @property
    def chunkable(self) -> bool:
        return self.reason is None


@dataclass(frozen=True)
class WriteTerm:
    """`scale value key^T`: a rank-1 write. `value` is None for a vector state (a column of 1)."""

    value: Expr | None
    key: Expr
    scale: Expr | None


@dataclass(frozen=True)
class StateFacts:
    """One state: its transition, its writes, and its update expanded into terms (for the
    recurrent form; None when the update is not affine)."""

    name: str
    shape: Shape
    affine: bool
    transition: Transition
    writes: tuple[WriteTerm, ...]
    write_form: str
    span: Span | None = None
    stability: str | None = None  # delta rule: whether |k| = 1 and beta in [0, 2] are proven
    terms: tuple[Term, ...] | None = None  # the update expanded (as written, not canonical)

    @property
    def vector(self) -> bool:
        return self.shape[1] == "1"

    @property
    def rank(self) -> int:
        """Rank of the write term (number of rank-1 outer products)."""
        return len(self.writes)

    @property
    def key_size(self) -> str:
        return self.shape[0] if self.vector else self.shape[1]

    @property
    def width(self) -> str:
        """Value channels in the chunked layout: the row count, or 1 for a vector state."""
        return "1" if self.vector else self.shape[0]


@dataclass(frozen=True)
class Readout:
    """`state_t query`, times an optional scalar scale: a linear read of one state."""

    index: int
    state: str
    query: Expr
    scale: Expr | None


@dataclass(frozen=True)
class OutputFacts:
    name: str
    shape: Shape
    form: str  # "linear", "linear + skip", "ratio", "function of readouts", "no state"
    expr: Expr  # the output with readouts replaced by Name("_r0"), Name("_r1"), ...
    readouts: tuple[Readout, ...]
    skip: Expr | None

