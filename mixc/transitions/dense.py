"""Transitions with no chunked form: any other linear map of the state (the last rule of the
table), an update that reads another state or none, and an update that is not affine in the
state at all (`tanh(H_{t-1})`). They run in the recurrent form and step only."""

from __future__ import annotations

from mixc.errors import Span
from mixc.transitions.base import Rule, Transition, TransitionClass

GENERAL = Rule("general_dense", "general dense", "any other linear map of S_{t-1}")
COUPLED = Rule("coupled_states", "general dense", "the update reads another state")
NO_RECURRENCE = Rule("no_recurrence", "general dense", "S_t does not read S_{t-1}")
NOT_AFFINE_RULE = Rule("not_affine", "not affine", "the update is not affine in S_{t-1}")


class Dense(TransitionClass):
    name = "dense"
    rules = (GENERAL, COUPLED, NO_RECURRENCE)
    modelled = False

    def match(self, terms, ctx):
        return Transition(
            GENERAL,
            self,
            reason="NYI: this transition is linear but in no class with a chunked form "
            "(scalar, diagonal, outer-product gate, identity minus rank-1, diagonal plus rank-1, "
            "or those times a scalar decay)",
        )

    def coupled(self, state: str, other, where: str) -> Transition:
        """The update of `state` reads another state (`other`, an expression)."""
        return Transition(
            COUPLED,
            self,
            reason=f"NYI: the update of {state} reads another state ({other}{where}); "
            "coupled states run step by step",
            span=other.span,
        )

    def no_recurrence(self, state: str, span: Span | None) -> Transition:
        return Transition(
            NO_RECURRENCE,
            self,
            reason=f"NYI: {state}_t does not depend on {state}_{{t-1}}; write it as a per-token "
            "value instead",
            span=span,
        )


class NotAffine(TransitionClass):
    name = "not_affine"
    rules = (NOT_AFFINE_RULE,)
    algorithm = "recurrent only (the update is not affine in the state: no chunked form exists)"
    modelled = False

    def transition(self, why: str, span: Span | None) -> Transition:
        return Transition(NOT_AFFINE_RULE, self, reason=f"not affine: {why}", span=span)


DENSE = Dense()
NOT_AFFINE = NotAffine()
