"""Transitions with no chunked form: any other linear map of the state (the last rule of the
table), an update that reads another state or none, and an update that is not affine in the
state at all (`tanh(H_{t-1})`). They run in the recurrent form and step only."""

from __future__ import annotations

from mixc.errors import Span
from mixc.frontend.ir import Call, Expr
from mixc.transitions.base import Rule, StateTerms, Transition, TransitionClass

GENERAL = Rule("general_dense", "general dense", "any other linear map of S_{t-1}")
COUPLED = Rule("coupled_states", "general dense", "the update reads another state")
NO_RECURRENCE = Rule("no_recurrence", "general dense", "S_t does not read S_{t-1}")
NOT_AFFINE_RULE = Rule("not_affine", "not affine", "the update is not affine in S_{t-1}")


class Dense(TransitionClass):
    name = "dense"
    rules = (GENERAL, COUPLED, NO_RECURRENCE)
    modelled = False

    def match(self, terms, ctx):
        return Transition(GENERAL, self, reason="NYI: " + _blocking(terms, ctx.state))

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


def _blocking(terms: StateTerms, state: str) -> str:
    """Why a linear transition has no chunked form, naming the factor that blocks it: factors on
    both sides of the state, or a value-side factor that is no diagonal gate."""
    for t, at in terms:
        left, right = t.chain[:at], t.chain[at + 1 :]
        if left and right:
            return (
                f"the term {_show(t.chain)} multiplies {state}_{{t-1}} on both sides: "
                f"{_show(left)} on the value side (rows) and {_show(right)} on the key side "
                "(columns); the chunked forms need every term's factors on one side (a vector "
                "erase strength on the value side makes each row of the state its own delta "
                "rule)"
            )
    for t, at in terms:
        if at > 0 and not (at == 1 and _is_diag(t.chain[0])):
            return (
                f"the transition acts on the value side (from the left) with "
                f"{_show(t.chain[:at])}: of the value-side transitions a diagonal gate and "
                "the transpose of a diagonal plus low rank (D_t + b_t a_t^T) S_{t-1} that writes "
                "along b_t have a chunked form"
            )
    return (
        "this transition is linear but in no class with a chunked form (scalar, diagonal, "
        "outer-product gate, identity minus rank-1, diagonal plus rank-1, or those times a "
        "scalar decay)"
    )


def _show(factors) -> str:
    return " ".join(str(f) for f in factors)


def _is_diag(e: Expr) -> bool:
    return isinstance(e, Call) and e.func == "diag"


class NotAffine(TransitionClass):
    name = "not_affine"
    rules = (NOT_AFFINE_RULE,)
    algorithm = "recurrent only (the update is not affine in the state: no chunked form exists)"
    modelled = False

    def transition(self, why: str, span: Span | None) -> Transition:
        return Transition(NOT_AFFINE_RULE, self, reason=f"not affine: {why}", span=span)


DENSE = Dense()
NOT_AFFINE = NotAffine()
