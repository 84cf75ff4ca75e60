"""Transitions with no chunked form: any other linear map of the state (the last rule of the
table), an update that reads another state or none, and an update that is not affine in the
state at all (`tanh(H_{t-1})`). They run in the recurrent form and step only."""

from __future__ import annotations

from mixc.errors import Span
from mixc.transitions.base import Transition, TransitionClass


class Dense(TransitionClass):
    name = "dense"
    variants = ("general dense",)
    rules = ("general_dense", "coupled_states", "no_recurrence")
    modelled = False

    def match(self, terms, ctx):
        return Transition(
            "general dense",
            "general_dense: any other linear map of S_{t-1}",
            reason="NYI: this transition is linear but in no class with a chunked form "
            "(scalar, diagonal, outer-product gate, identity minus rank-1, diagonal plus rank-1, "
            "or those times a scalar decay)",
        )

    def coupled(self, state: str, other, where: str) -> Transition:
        """The update of `state` reads another state (`other`, an expression)."""
        return Transition(
            "general dense",
            "coupled_states: the update reads another state",
            reason=f"NYI: the update of {state} reads another state ({other}{where}); "
            "coupled states run step by step",
            span=other.span,
            transition_class=self,
        )

    def no_recurrence(self, state: str, span: Span | None) -> Transition:
        return Transition(
            "general dense",
            "no_recurrence: S_t does not read S_{t-1}",
            reason=f"NYI: {state}_t does not depend on {state}_{{t-1}}; write it as a per-token "
            "value instead",
            span=span,
            transition_class=self,
        )


class NotAffine(TransitionClass):
    name = "not_affine"
    variants = ("not affine",)
    rules = ("not_affine",)
    algorithm = "recurrent only (the update is not affine in the state: no chunked form exists)"
    modelled = False

    def transition(self, why: str, span: Span | None) -> Transition:
        return Transition(
            "not affine",
            "not_affine: the update is not affine in S_{t-1}",
            reason=f"not affine: {why}",
            span=span,
            transition_class=self,
        )


DENSE = Dense()
NOT_AFFINE = NotAffine()
