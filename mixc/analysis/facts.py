"""The facts the analysis finds about one spec: immutable values, printed by `mixc explain` and
read by the plan (`mixc.analysis.plan`), never recomputed by a consumer."""

from __future__ import annotations

from dataclasses import dataclass, field

from mixc.algebra.expand import Term
from mixc.errors import Span, SpecError
from mixc.frontend.ir import Expr, Timed
from mixc.frontend.shapes import Shape
from mixc.transitions.base import Transition

__all__ = ["OutputFacts", "Readout", "SpecWarning", "StateFacts", "WriteTerm"]


class SpecWarning(SpecError):  # noqa: N818 - a warning, not an error
    """A located warning: the spec compiles, but something in it is probably wrong."""

    kind = "warning"


@dataclass(frozen=True)
class WriteTerm:
    """`scale value key^T`: a rank-1 write. `value` is None for a vector state in the row layout
    (a column of 1); a column's key is the number 1."""

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
    #: A vector state read entry by entry (`y_t = o_t * c_t`), laid out as a column: one key
    #: channel of 1, its entries as value channels, as a matrix [V, 1] is.
    column: bool = False
    #: The readouts of other states its update reads (a pipeline: `H2_t = H2_{t-1} + o_t u_t^T`
    #: with `o_t = H1_t q_t`), by name (`_r0`), directly or through their queries.
    reads: tuple[str, ...] = ()
    #: Updated from the next token (`G_t = a_t G_{t+1} + ...`): it runs backward in time, from
    #: an initial state at the end of the sequence, as a forward state of the reversed sequence.
    backward: bool = False

    @property
    def vector(self) -> bool:
        """A vector state in the row layout: its entries as key channels, one value channel."""
        return self.shape[1] == "1" and not self.column

    @property
    def kernel_writes(self) -> tuple[WriteTerm, ...]:
        """The writes as the chunked kernel takes them: as written, or for a class that runs on
        the state's transpose (`TransitionClass.transposed`) each `v k^T` as `k v^T`."""
        if not self.transition.transition_class.transposed:
            return self.writes
        return tuple(WriteTerm(w.key, w.value, w.scale) for w in self.writes)

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
    """`state_t query` (`offset` 0) or `state_{t-1} query` (-1: the state before the token's
    update, as RWKV-6 reads it; +1 for a backward state, whose update comes from t+1), times an
    optional scalar scale: a linear read of one state.
    Entrywise: the vector state itself (`c_t`, its query the 1 of its column)."""

    index: int
    state: str
    query: Expr
    scale: Expr | None
    offset: int = 0
    entrywise: bool = False
    #: Where the read is first written (for messages); not part of what the readout is.
    span: Span | None = field(default=None, compare=False)

    @property
    def read(self) -> Expr:
        """The state read, as spec text: `H_t` or `H_{t-1}`."""
        return Timed(self.state, self.offset)


@dataclass(frozen=True)
class OutputFacts:
    name: str
    shape: Shape
    form: str  # "linear", "linear + skip", "ratio", "function of readouts", "no state"
    expr: Expr  # the output with readouts replaced by Name("_r0"), Name("_r1"), ...
    readouts: tuple[Readout, ...]
    skip: Expr | None
    #: The output from readouts scaled by exp(-m_t) (a group with an exponential write scale
    #: carried in log space, see mixc.analysis.scales); None: from the readouts as they are.
    scaled: Expr | None = None
