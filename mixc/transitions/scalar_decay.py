"""Scalar decay: `G_t(S) = a_t S` with a_t a per-token scalar, a per-head constant (RetNet's
gamma) or nothing at all (the identity of linear attention).

Chunked form: the kernel `scalar_decay`, with decay masks exp(b_i - b_j) built as running
products of per-token decays inside each chunk; the same masks give a quadratic `parallel` form.
"""

from __future__ import annotations

from mixc.analysis.cost import ACC_BYTES, ClassCost, FormCost, Formula, GroupDims
from mixc.analysis.facts import Transition
from mixc.frontend.ir import Timed, walk
from mixc.transitions.base import KernelArg, TransitionClass, plain, scalar_gates


class ScalarDecay(TransitionClass):
    name = "scalar_decay"
    variants = ("identity", "scalar constant", "scalar data-dependent")
    rules = ("identity", "scalar_constant", "scalar_data")
    kernel = "scalar_decay"
    parallel = True
    algorithm = "chunked scalar decay (log-space decay masks), or the quadratic masked form"

    def match(self, terms, ctx):
        p = plain(terms)
        if not p or p[1] or p[2] or p[0].gates:
            return None
        t = p[0]
        if not t.scalars and t.coeff == 1:
            return Transition("identity", "identity: S_{t-1} alone")
        gates = tuple(scalar_gates(t, ctx))
        if any(isinstance(n, Timed) for s in t.scalars for n in walk(s)):
            return Transition(
                "scalar data-dependent", "scalar_data: a per-token scalar times S_{t-1}", gates
            )
        return Transition(
            "scalar constant", "scalar_constant: a per-head constant times S_{t-1}", gates
        )

    def kernel_args(self, tr):
        return (KernelArg("g", tr.log("scalar"), "scalar"),)

    def decays(self, tr):
        return bool(tr.gates)

    def step_decays(self, tr):
        return bool(tr.gates)

    def cost(self, tr: Transition, d: GroupDims) -> ClassCost:
        gated = bool(tr.gates)
        mask = 2 if gated else 1
        C, T, nq, r = d.C, d.T, d.nq, d.r
        intra = nq * (2 * r * C * (d.dk + d.dv) + mask * r * C)
        chunked = FormCost(
            intra + 2 * nq * d.kv + 2 * r * d.kv + (d.kv / C if gated else Formula()),
            d.state_bytes / C + ACC_BYTES * mask * nq * C,
        )
        quadratic = FormCost(
            nq * (2 * r * T * (d.dk + d.dv) + mask * r * T), ACC_BYTES * mask * nq * T
        )
        note = "scalar decay: masks exp(b_i - b_j) as running products of per-token decays"
        return ClassCost(chunked, quadratic, note)


SCALAR_DECAY = ScalarDecay()
