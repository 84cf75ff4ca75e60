"""The facts the analysis finds about one spec: immutable values, printed by `mixc explain` and
read by the plan (`mixc.analysis.plan`), never recomputed by a consumer."""

from __future__ import annotations

from dataclasses import dataclass

from mixc.algebra.expand import Term
from mixc.errors import Span, SpecError
from mixc.frontend.ir import Expr
from mixc.frontend.shapes import Shape
from mixc.transitions.base import Transition

__all__ = ["OutputFacts", "Readout", "SpecWarning", "StateFacts", "WriteTerm"]


class SpecWarning(SpecError):  # noqa: N818 - a warning, not an error
    """A located warning: the spec compiles, but something in it is probably wrong."""

    kind = "warning"


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

