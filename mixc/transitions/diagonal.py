"""Diagonal gates: `G_t(S) = diag(a_t) S diag(b_t)` (times a scalar decay), a per-channel decay on
the key side (GLA), the value side, or both as an outer-product gate `(a_t b_t^T) ⊙ S`.

Chunked form: the kernel `diagonal`, over aligned blocks of 2, 4, ..., C tokens whose decays are
measured from each block's middle, so that no factor exp(-b) can overflow.
"""

from __future__ import annotations

from mixc.frontend.ir import Call, Expr
from mixc.frontend.shapes import SCALAR
from mixc.transitions.base import (
    CHUNK_MEASURED_ON,
    ChunkSize,
    KernelArg,
    Maths,
    Rule,
    RuleContext,
    StateTerms,
    Transition,
    TransitionClass,
    plain,
    scalar_gates,
    sum_of,
)
from mixc.transitions.cost import ACC_BYTES, ClassCost, FormCost, GroupDims
from mixc.transitions.gates import LogGate
from mixc.transitions.writing import Core, RandomForm, Update, Writer, decayed_update


def gates_of(terms: StateTerms, ctx: RuleContext) -> tuple[list[LogGate], Expr | None] | None:
    """For one term `diag(..) S_{t-1} diag(..)` with elementwise gates: the log-gates of every
    scalar, vector and outer-product factor, and a full matrix gate if there is one (else None).
    None when the term has another shape."""
    p = plain(terms)
    if not p:
        return None
    t, left, right = p
    if not all(isinstance(a, Call) and a.func == "diag" for a in left + right):
        return None
    ex = ctx.expander
    gates = list(scalar_gates(t, ctx))
    gates += [ctx.gate(a, "value") for a in left]
    gates += [ctx.gate(a, "key") for a in right]
    full = None
    for g in t.gates:
        shape = ex.shape(g)
        if shape == SCALAR:
            gates.append(ctx.gate(g, "scalar"))
            continue
        if shape[0] == "1" or shape[1] == "1":
            gates.append(ctx.gate(g, "key" if shape[0] == "1" else "value"))
            continue
        outer = ex.expand(g)
        if len(outer) == 1 and len(outer[0].chain) == 2 and not outer[0].gates:
            u, w = outer[0].chain
            gates += scalar_gates(outer[0], ctx)
            gates.append(ctx.gate(u, "value"))
            gates.append(ctx.gate(w, "key"))
        else:
            full = g
    return gates, full


NO_SPLIT = (
    "exp(b_i - b_j) is never split into exp(b_i) exp(-b_j): "
    "sub-chunks, factors measured from their boundary"
)


# ----------------------------------------------------------------------------- random specs


def _vector_gate(w: Writer, size: str) -> str:
    """A vector input of decays in (0, 1), for a diagonal or outer-product gate."""
    a = w.fresh(("a", "g", "f", "r"))
    kind = w.pick("sigmoid", "softplus", "log")
    w.inputs.append(f"{a}[{size}]")
    return {
        "sigmoid": f"sigmoid({a}_t)",
        "softplus": f"exp(-softplus({a}_t))",
        "log": f"exp({a}_t)",
    }[kind]


def _diag_key(w: Writer, c: Core, forms: tuple[str, ...]) -> Update:
    """S diag(g), g^T ⊙ S or S ⊙ g^T; a normaliser z[K] decays by the same gate."""
    gk = _vector_gate(w, c.K)
    T, had = w.T, w.had
    decayed = w.pick(f"{c.prev} diag({gk})", f"{gk}{T} {had} {c.prev}", f"{c.prev} {had} {gk}{T}")
    return decayed_update(
        w, c, decayed, z=lambda w, zprev: w.pick(f"diag({gk}) {zprev}", f"{gk} {w.had} {zprev}")
    )


def _diag_value(w: Writer, c: Core, forms: tuple[str, ...]) -> Update:
    """diag(g) S or g ⊙ S."""
    gv = _vector_gate(w, c.V)
    return decayed_update(w, c, w.pick(f"diag({gv}) {c.prev}", f"{gv} {w.had} {c.prev}"))


def _outer(w: Writer, c: Core, forms: tuple[str, ...]) -> Update:
    """An outer product of gates: (g_v g_k^T) ⊙ S."""
    gv, gk = _vector_gate(w, c.V), _vector_gate(w, c.K)
    return decayed_update(w, c, f"({gv} {gk}{w.T}) {w.had} {c.prev}")


KEY_SIDE = Rule("diagonal_key", "diagonal key-side", "S_{t-1} diag(a_t)")
VALUE_SIDE = Rule("diagonal_value", "diagonal value-side", "diag(a_t) S_{t-1}")
OUTER = Rule("outer_product_gate", "elementwise gate", "(a_t b_t^T) ⊙ S_{t-1}")


class Diagonal(TransitionClass):
    name = "diagonal"
    rules = (KEY_SIDE, VALUE_SIDE, OUTER)
    kernel = "diagonal"
    sub_tokens = True  # zero log-gates are a step that changes nothing
    algorithm = "chunked diagonal gate (sub-chunks, factors measured from a boundary)"

    def match(self, terms, ctx):
        found = gates_of(terms, ctx)
        if found is None or found[1] is not None:
            return None
        gates = tuple(found[0])
        sides = {g.side for g in gates} - {"scalar"}
        if not sides:
            return None
        if sides == {"key"}:
            return Transition(KEY_SIDE, self, gates)
        if sides == {"value"}:
            if ctx.shape[1] == "1":
                return None  # a vector state read entry by entry (a column): the elementwise class
            return Transition(VALUE_SIDE, self, gates)
        return Transition(OUTER, self, gates)

    def kernel_args(self, tr):
        scalar, key, value = tr.log("scalar"), tr.log("key"), tr.log("value")
        if key is not None or value is None:
            key = sum_of(key, scalar)
        else:
            value = sum_of(value, scalar)
        return (KernelArg("gk", key, "vector"), KernelArg("gv", value, "vector"))

    def maths(self, tr: Transition) -> Maths:
        """One log-gate per channel on each gated side (a scalar decay rides on one side)."""
        key, val, scalar = tr.log("key"), tr.log("value"), tr.log("scalar")
        if scalar is not None:
            if key is not None or val is None:
                key = scalar if key is None else f"{key} + {scalar}"
            else:
                val = f"{val} + {scalar}"
        if val is None:
            return Maths(
                (f"g = {key} (one log-gate per key channel)",),
                (
                    "y_i = Σ_{j<=i} ((q_i ⊙ exp(b_i - b_j)) · k_j) v_j + S_0^T (q_i ⊙ exp(b_i)),  "
                    "b = cumsum(g)",
                    "S_C = diag(exp(b_C)) S_0 + (K ⊙ exp(b_C - b))^T V",
                    NO_SPLIT,
                ),
            )
        if key is None:
            return Maths(
                (f"g = {val} (one log-gate per value channel)",),
                (
                    "y_i = Σ_{j<=i} (q_i · k_j) (exp(b_i - b_j) ⊙ v_j) + exp(b_i) ⊙ (S_0^T q_i),  "
                    "b = cumsum(g)",
                    "S_C = S_0 diag(exp(b_C)) + K^T (V ⊙ exp(b_C - b))",
                    NO_SPLIT,
                ),
            )
        return Maths(
            (f"g = {key} (key channels), h = {val} (value channels)",),
            (
                "y_i = Σ_{j<=i} ((q_i ⊙ exp(a_i - a_j)) · k_j) (exp(c_i - c_j) ⊙ v_j) "
                "+ exp(c_i) ⊙ (S_0^T (q_i ⊙ exp(a_i))),  a = cumsum(g), c = cumsum(h)",
                "S_C = diag(exp(a_C)) S_0 diag(exp(c_C)) + (K ⊙ exp(a_C - a))^T (V ⊙ exp(c_C - c))",
            ),
        )

    def chunk_size(self, tr):
        return ChunkSize(32, f"32 ran 1.08x faster than 64 for GLA, {CHUNK_MEASURED_ON}")

    def random_forms(self) -> dict[str, RandomForm]:
        return {"diag key": _diag_key, "diag value": _diag_value, "outer": _outer}

    def summary_probe(self, tr):
        """A value-side gate acts on the kernel state's columns: probed beside its keys. Gates
        on both sides act entry by entry: diag(a) S_0 diag(b) = (a b^T) ⊙ S_0."""
        if tr.log("value") is None:
            return ("v", "columns")
        return ("k", "rows") if tr.log("key") is None else None

    def step_decays(self, tr):
        return not {"key", "value"} <= tr.sides

    def cost(self, tr: Transition, d: GroupDims) -> ClassCost:
        # aligned blocks of 2, 4, ..., C tokens: each query-key pair of a chunk once (a corner
        # matmul per block), C (C + 1) / 2 products of d_k per chunk; the values once per block
        # with value-side gates, else in one C x C product
        C, T, nq = d.C, d.T, d.nq
        values = (C + 1) * d.dv if "value" in tr.sides else 2 * C * d.dv
        intra = nq * ((C + 1) * d.dk + values)
        chunked = FormCost(
            intra + 2 * nq * d.kv + 2 * d.kv + d.kv / C,
            d.state_bytes / C + ACC_BYTES * nq * C + 2 * ACC_BYTES * d.dg,
        )
        quadratic = FormCost(nq * (2 * T * (d.dk + d.dv) + 3 * T * d.dg), ACC_BYTES * nq * T * d.dg)
        note = (
            "diagonal gate: aligned blocks of 2, 4, ..., C tokens, decays measured from each "
            "block's middle; their elementwise products (about 3 d_g per token at each of the "
            "log2(C) levels) are not counted; the quadratic form needs a decay per channel and pair"
        )
        return ClassCost(chunked, quadratic, note)


DIAGONAL = Diagonal()
