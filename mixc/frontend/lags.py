"""Per-token values read at t-1: `b_{t-1}` for a value `b_t = ...` (a token shift of a value,
as Mamba-3's trapezoid reads the previous token's key).

A value at t-1 is its equation with every time index one token earlier: the value computed
from the previous token's inputs (`x_t` becomes `x_{t-1}`), the previous token's readouts
(`H_t q_t` becomes `H_{t-1} q_{t-1}`) and position (`pos_t - 1`). `lower_lags` writes each
such read out that way once the spec is verified, so every later stage sees inputs and states
at t-1 only, which every form already carries: `chunk` shifts the inputs by a token, `step` and
the final state carry the last token's inputs, and each packed sequence starts from its own
(zeros unless given). Before the first token a value at t-1 is thus its equation on the
carried inputs, as an input at t-1 is the carried input. The value is computed twice (at t and,
shifted, at t-1): the cost of an elementwise function of the inputs, for carrying inputs the
forms already know how to carry.

A value whose equation already reads a token back (an input or a state at t-1) would need t-2,
which no form carries: refused, where the value is read at t-1, naming what it reads.
"""

from __future__ import annotations

from dataclasses import replace

from mixc.errors import NotYetImplemented
from mixc.frontend.ir import (
    POSITION,
    Binary,
    Call,
    Expr,
    Mixer,
    Neg,
    Number,
    Timed,
    Transpose,
    walk,
)

__all__ = ["lower_lags"]


def lower_lags(mixer: Mixer) -> Mixer:
    """`mixer` with every per-token value read at t-1 written out as its equation one token
    earlier; `mixer` itself when it reads none. Raises NotYetImplemented, located at the read,
    for a value that cannot be read at t-1."""
    states = {s.name for s in mixer.states}
    values = {e.target: e.value for e in mixer.equations if e.target not in states}
    if not any(
        isinstance(n, Timed) and n.offset == -1 and n.name in values
        for e in mixer.equations
        for n in walk(e.value)
    ):
        return mixer

    def go(e: Expr, within: tuple[str, ...]) -> Expr:
        if isinstance(e, Timed) and e.offset == -1 and e.name in values:
            return _earlier(mixer, e, values, within, go)
        if isinstance(e, Call):
            return Call(e.func, tuple(go(a, within) for a in e.args), span=e.span)
        if isinstance(e, Neg):
            return Neg(go(e.operand, within), span=e.span)
        if isinstance(e, Transpose):
            return Transpose(go(e.operand, within), span=e.span)
        if isinstance(e, Binary):
            return Binary(e.op, go(e.left, within), go(e.right, within), span=e.span)
        return e

    equations = [replace(eq, value=go(eq.value, ())) for eq in mixer.equations]
    # a value read only at t-1 is now read nowhere: dropped, lest it become an output
    outputs = {e.target for e in mixer.outputs}
    while True:
        read = {n.name for e in equations for n in walk(e.value) if isinstance(n, Timed)}
        unread = [e for e in equations if e.target in values and e.target not in read | outputs]
        if not unread:
            return replace(mixer, equations=tuple(equations))
        equations = [e for e in equations if e not in unread]


def _earlier(mixer: Mixer, read: Timed, values: dict[str, Expr], within, go) -> Expr:
    """The value `read` (at t-1) as its equation one token earlier."""
    if read.name in within:  # a value that reads itself: the verifier says so at t
        return read
    if mixer.backward:
        raise NotYetImplemented(
            f"{read}: a non-causal mixer (with the backward state {mixer.backward[0]}) reads "
            "its per-token values at t only",
            read.span,
            hint=f"keep {read.name}_{{t-1}} in a forward state",
        )
    definition = values[read.name]
    for n in walk(definition):
        if isinstance(n, Timed) and n.offset != 0 and n.name not in values:
            where = f" (line {n.span.line})" if n.span else ""
            raise NotYetImplemented(
                f"{read}: {read.name}_t reads {n}{where}, which one token earlier is "
                f"{n.name} at t{n.offset - 1:+d}: no form carries two tokens back",
                read.span,
                hint=f"keep {read.name} in a state",
            )

    def shift(e: Expr) -> Expr:
        if isinstance(e, Timed) and e.offset == 0:
            if e.name == POSITION:
                return Binary("-", e, Number("1"), span=e.span)
            earlier = Timed(e.name, -1, span=e.span)
            return go(earlier, (*within, read.name)) if e.name in values else earlier
        if isinstance(e, Timed):  # a value at t-1 inside: two tokens back
            raise NotYetImplemented(
                f"{read}: {read.name}_t reads {e}, which one token earlier is {e.name} at "
                f"t{e.offset - 1:+d}: no form carries two tokens back",
                read.span,
                hint=f"keep {e.name} in a state",
            )
        if isinstance(e, Call):
            return Call(e.func, tuple(shift(a) for a in e.args), span=e.span)
        if isinstance(e, Neg):
            return Neg(shift(e.operand), span=e.span)
        if isinstance(e, Transpose):
            return Transpose(shift(e.operand), span=e.span)
        if isinstance(e, Binary):
            return Binary(e.op, shift(e.left), shift(e.right), span=e.span)
        return e

    return shift(definition)
