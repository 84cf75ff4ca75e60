"""Exponential write scales (mLSTM's input gate exp(i_t)): when a chunked pass can carry the
writes' scale in log space instead of multiplying it into the values.

A write scale exp(s_t) overflows a float32 past s_t ~ 88, although an output such as
`H_t q_t / max(|n_t . q_t|, 1)` stays of moderate size: it is a ratio in which the scale cancels.
A kernel with a stabiliser returns each output row scaled by exp(-m_t) (m_t the largest exponent
the row sums); the output is then evaluated from the scaled readouts with every term that does
not read a state scaled by exp(-m_t) too, which leaves a ratio unchanged. `scaled_output` is that
rewrite, refused (None) where the output is not such a ratio.
"""

from __future__ import annotations

from mixc.analysis.facts import OutputFacts, StateFacts
from mixc.analysis.outputs import has_readout
from mixc.frontend.ir import Binary, Call, Expr, Name, Neg, Number

__all__ = ["log_write_scale", "scaled_output"]


def log_write_scale(members: list[StateFacts]) -> Expr | None:
    """s_t when every state of a group writes once with the same scale exp(s_t), else None."""
    if any(len(s.writes) != 1 for s in members):
        return None
    if len({str(s.writes[0].scale) for s in members}) != 1:
        return None
    scale = members[0].writes[0].scale
    return scale.args[0] if isinstance(scale, Call) and scale.func == "exp" else None


def scaled_output(o: OutputFacts, unscale: Name) -> Expr | None:
    """The output from its readouts scaled by `unscale` = exp(-m_t): a ratio of two expressions
    each of degree 1 in the readouts once their other terms are scaled (`r0 / max(|r1|, 1)` ->
    `r0 / max(|r1|, 1 * unscale)`); None for any other output."""
    e = o.expr
    if not (isinstance(e, Binary) and e.op == "/" and has_readout(e.left) and has_readout(e.right)):
        return None
    num, den = _degree_one(e.left, unscale), _degree_one(e.right, unscale)
    return None if num is None or den is None else Binary("/", num, den)


def _degree_one(e: Expr, unscale: Name) -> Expr | None:
    """`e` times exp(-m_t), written over the scaled readouts (which already carry that factor);
    None where `e` is not positively homogeneous of degree 1 in its readouts and other terms."""
    if not has_readout(e):
        return unscale if isinstance(e, Number) and e.text == "1" else Binary("*", e, unscale)
    if isinstance(e, Name):
        return e
    if isinstance(e, Neg):
        inner = _degree_one(e.operand, unscale)
        return None if inner is None else Neg(inner)
    if isinstance(e, Call) and e.func in ("abs", "max", "min"):  # exp(-m_t) > 0 passes through
        args = [_degree_one(a, unscale) for a in e.args]
        return None if None in args else Call(e.func, tuple(args))
    if isinstance(e, Binary) and e.op in "+-":
        left, right = _degree_one(e.left, unscale), _degree_one(e.right, unscale)
        return None if left is None or right is None else Binary(e.op, left, right)
    if isinstance(e, Binary) and e.op in ("*", "@", ".", "/"):
        if not has_readout(e.left) and e.op != "/":
            right = _degree_one(e.right, unscale)
            return None if right is None else Binary(e.op, e.left, right)
        if not has_readout(e.right):
            left = _degree_one(e.left, unscale)
            return None if left is None else Binary(e.op, left, e.right)
    return None
