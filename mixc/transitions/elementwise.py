"""Full elementwise gates: `G_t(S) = G_t ⊙ S` with G_t a full matrix per token (Mamba-1's
selective scan, `exp(dt_t * A)` with A [P, N]), and the gate of a vector state read entry by
entry (HGRN's `sigmoid(f_t) * c_{t-1}`, the state laid out as a column: one key channel).

Chunked form: the kernel `elementwise`, a scan inside every chunk (all chunks of a span at
once) from the running products of the per-token decays, the state passed from chunk to chunk;
no quadratic form (the decay between two tokens is a matrix per pair).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mixc.frontend.ir import Binary, Expr, Timed, Transpose, walk
from mixc.transitions.base import (
    ChunkSize,
    Condition,
    KernelArg,
    Maths,
    Rule,
    Transition,
    TransitionArgs,
    TransitionClass,
    sum_of,
)
from mixc.transitions.cost import ACC_BYTES, ClassCost, FormCost, GroupDims
from mixc.transitions.diagonal import _vector_gate, gates_of
from mixc.transitions.writing import Core, RandomForm, Update, decayed_update


def _full_gate(w, c: Core, forms: tuple[str, ...]) -> Update:
    """A full gate per token: exp(dt_t * A) with dt[V] > 0 and a per-head A[V, K] < 0."""
    dt = w.fresh(("dt", "delta", "s"))
    A = w.fresh(("A", "Aneg"))
    w.inputs.append(f"{dt}[{c.V}]")
    w.params.append(f"{A}[{c.V}, {c.K}]")
    return decayed_update(w, c, f"exp({dt}_t * {A}) {w.had} {c.prev}")


def _gated_full(w, c: Core, forms: tuple[str, ...]) -> Update:
    """A full gate input G[V, K] in [0, 1], on either side of the product, maybe times a vector
    gate on the value side."""
    G = w.fresh(("G", "F", "Gt"), upper=True)
    w.inputs.append(f"{G}[{c.V}, {c.K}]")
    decayed = w.pick(f"{G}_t {w.had} {c.prev}", f"{c.prev} {w.had} {G}_t")
    if w.coin():
        decayed = f"{_vector_gate(w, c.V)} {w.had} {decayed}"
    return decayed_update(w, c, decayed)


def _per_token(e: Expr) -> bool:
    return any(isinstance(n, Timed) for n in walk(e))


FULL = Rule("full_elementwise_gate", "elementwise gate", "G_t ⊙ S_{t-1}, G_t a full matrix")
COLUMN = Rule(
    "column_gate", "elementwise gate", "a_t ⊙ s_{t-1}, a vector state read entry by entry"
)


@dataclass(frozen=True)
class ElementwiseArgs(TransitionArgs):
    """The full gate G_t of `G_t ⊙ S_{t-1}` (its log is among the log-gates, side "full"), which
    must lie in [0, 1]; None for a column's gate, a vector of decays among the log-gates."""

    gate: Expr | None = field(metadata={"role": "gate"})


class Elementwise(TransitionClass):
    name = "elementwise"
    rules = (FULL, COLUMN)
    kernel = "elementwise"
    sub_tokens = True  # a zero log-gate is a step that changes nothing
    algorithm = "chunked elementwise scan (running products of the decays inside each chunk)"
    summary_action = "elementwise"  # a sequence acts on the state as G ⊙ S_0 + F

    def match(self, terms, ctx):
        found = gates_of(terms, ctx)
        if found is None:
            return None
        gates, full = found
        if full is not None:
            return Transition(FULL, self, (*gates, ctx.gate(full, "full")), ElementwiseArgs(full))
        # a vector state read entry by entry is a column (one key channel): its gate is on the
        # value side, one decay per entry
        if ctx.shape[1] == "1" and {g.side for g in gates} - {"scalar"} == {"value"}:
            return Transition(COLUMN, self, tuple(gates), ElementwiseArgs(None))
        return None

    def log_gate(self, tr: Transition) -> Expr:
        """The log-gate of every entry [V, K]: the full gate's, the value side's (columns), the
        key side's (rows) and the scalar decay's, summed (broadcast)."""
        key = tr.log("key")
        return sum_of(
            sum_of(sum_of(tr.log("full"), tr.log("value")), key and Transpose(key)),
            tr.log("scalar"),
        )

    def kernel_args(self, tr):
        """The log-gate, split into two factors when it is a product (dt_t * A): the kernel
        multiplies them a span at a time, so a per-token vector times a per-head matrix is
        never a [T, V, K] tensor."""
        log = self.log_gate(tr)
        if isinstance(log, Binary) and log.op == "*":
            # the factor that reads per-token inputs first: on padding it is 0, so the product
            per_token, other = log.left, log.right
            if _per_token(other) and not _per_token(per_token):
                per_token, other = other, per_token
            return (KernelArg("g", per_token, "matrix"), KernelArg("g_scale", other, "factor"))
        return (KernelArg("g", log, "matrix"), KernelArg("g_scale", None, "factor"))

    def decay_conditions(self, state, tr):
        """The log-gates <= 0, and a full gate G_t in [0, 1]."""
        conditions = super().decay_conditions(state, tr)
        gate = tr.args.gate
        if gate is None:
            return conditions
        why = f"elementwise gate {gate} of {state} in [0, 1]"
        return [*conditions, Condition(gate, 0.0, 1.0, why)]

    def maths(self, tr: Transition) -> Maths:
        return Maths(
            (f"g = {self.log_gate(tr)} (a log-gate per entry of the state)",),
            (
                "S_i = exp(b_i) ⊙ S_0 + Σ_{j<=i} exp(b_i - b_j) ⊙ k_j v_j^T,  y_i = q_i S_i,  "
                "b = cumsum(g) per entry",
                "inside a chunk S_i = exp(g_i) ⊙ S_{i-1} + k_i v_i^T for every chunk at once, "
                "exp(b_i) as running products of the decays (never exp(-b))",
                "S_C = exp(b_C) ⊙ S_0 + (the chunk's own last state)",
            ),
        )

    def chunk_size(self, tr):
        return ChunkSize(
            8,
            "8 and 4 ran alike, 16 1.05x and 64 1.4x slower, for Mamba-1's chunk forward "
            "(benchmarks/elementwise.py: CPU, 1 thread, fp32, B=1, NH=4, P=64, N=16, T=4096)",
        )

    def random_forms(self) -> dict[str, RandomForm]:
        return {"full gate": _full_gate, "gated full": _gated_full}

    def cost(self, tr: Transition, d: GroupDims) -> ClassCost:
        # per token and entry: the write, the decay's exp, a step of the scan and of the running
        # product, the incoming state's term; then the readouts
        chunked = FormCost(5 * d.kv + 2 * d.nq * d.kv, 4 * ACC_BYTES * d.kv)
        note = (
            "elementwise gate: every token's state is made (a span of chunks at a time), so the "
            "chunked form does the recurrence's work in fewer, larger steps"
        )
        return ClassCost(chunked, None, note)


ELEMENTWISE = Elementwise()
