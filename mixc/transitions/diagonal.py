"""Diagonal gates: `G_t(S) = diag(a_t) S diag(b_t)` (times a scalar decay), a per-channel decay on
the key side (GLA), the value side, or both as an outer-product gate `(a_t b_t^T) ⊙ S`.

Chunked form: the kernel `diagonal`, over aligned blocks of 2, 4, ..., C tokens whose decays are
measured from each block's middle, so that no factor exp(-b) can overflow.
"""

from __future__ import annotations

from mixc.analysis.cost import ACC_BYTES, ClassCost, FormCost, GroupDims
from mixc.analysis.facts import LogGate, Transition
from mixc.frontend.ir import Call, Expr
from mixc.frontend.shapes import SCALAR
from mixc.transitions.base import (
    KernelArg,
    RuleContext,
    StateTerms,
    TransitionClass,
    plain,
    scalar_gates,
    sum_of,
)


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


class Diagonal(TransitionClass):
    name = "diagonal"
    variants = ("diagonal key-side", "diagonal value-side", "elementwise gate")
    rules = ("diagonal_key", "diagonal_value", "outer_product_gate")
    kernel = "diagonal"
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
            return Transition("diagonal key-side", "diagonal_key: S_{t-1} diag(a_t)", gates)
        if sides == {"value"}:
            if ctx.shape[1] == "1":
                return Transition(
                    "diagonal key-side", "diagonal_key: diag(a_t) s_{t-1} (a vector state)", gates
                )
            return Transition("diagonal value-side", "diagonal_value: diag(a_t) S_{t-1}", gates)
        return Transition(
            "elementwise gate", "outer_product_gate: (a_t b_t^T) ⊙ S_{t-1}", gates
        )

    def kernel_args(self, tr):
        scalar, key, value = tr.log("scalar"), tr.log("key"), tr.log("value")
        if key is not None or value is None:
            key = sum_of(key, scalar)
        else:
            value = sum_of(value, scalar)
        return (KernelArg("gk", key, "vector"), KernelArg("gv", value, "vector"))

    def summary_reason(self, tr):
        if tr.log("value") is not None:
            return "has a value-side gate; the summary covers transitions on the key side"
        return None

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
        quadratic = FormCost(
            nq * (2 * T * (d.dk + d.dv) + 3 * T * d.dg), ACC_BYTES * nq * T * d.dg
        )
        note = (
            "diagonal gate: aligned blocks of 2, 4, ..., C tokens, decays measured from each "
            "block's middle; their elementwise products (about 3 d_g per token at each of the "
            "log2(C) levels) are not counted; the quadratic form needs a decay per channel and pair"
        )
        return ClassCost(chunked, quadratic, note)


DIAGONAL = Diagonal()
