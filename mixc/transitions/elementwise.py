"""Full elementwise gates: `G_t(S) = G_t ⊙ S` with G_t a full matrix per token (Mamba-1's
selective scan). Recognised, run by the recurrent form and step; no chunked form yet (the decay
between two tokens would be a tensor of the state's shape per pair)."""

from __future__ import annotations

from mixc.frontend.shapes import show
from mixc.transitions.base import Condition, Transition, TransitionClass
from mixc.transitions.diagonal import gates_of


class Elementwise(TransitionClass):
    name = "elementwise"
    variants = ("elementwise gate",)
    rules = ("full_elementwise_gate",)
    algorithm = "recurrent only (a full elementwise gate has no chunked form yet)"

    def match(self, terms, ctx):
        found = gates_of(terms, ctx)
        if found is None or found[1] is None:
            return None
        gates, full = found
        return Transition(
            "elementwise gate",
            "full_elementwise_gate: G_t ⊙ S_{t-1}, G_t a full matrix",
            tuple(gates),
            gate=full,
            reason=f"NYI: the full elementwise gate {full} has no chunked form (the decay between "
            f"two tokens would be a {show(ctx.shape)} tensor per pair); write it as an outer "
            "product a_t b_t^T, or as diag(...) on one side, to get one",
        )

    def decay_conditions(self, state, tr):
        """The scalar and vector decays as log-gates <= 0, the full gate G_t in [0, 1]."""
        why = f"elementwise gate {tr.gate} of {state} in [0, 1]"
        return [*super().decay_conditions(state, tr), Condition(tr.gate, 0.0, 1.0, why)]


ELEMENTWISE = Elementwise()
