"""Interval arithmetic over spec expressions: what values an expression can take.

Used to prove that a decay lies in (0, 1], that a beta lies in [0, 2], or that a constant is
positive, for every head (h >= 0) and for any value of the inputs and parameters.
"""

from __future__ import annotations

import math

from mixc.frontend.builtins import BUILTINS
from mixc.frontend.builtins import bounds as builtin_bounds
from mixc.frontend.ir import Binary, Call, Expr, Name, Neg, Number, Timed, Transpose, walk

__all__ = ["bounds", "constant", "nonpositive", "with_defaults"]


def bounds(e: Expr) -> tuple[float, float]:
    """Interval of values `e` can take, for h >= 0 and unknown inputs and parameters."""
    inf = math.inf
    if isinstance(e, Number):
        v = float(e.text)
        return v, v
    if isinstance(e, Name):
        return (0.0, inf) if e.name == "h" else (-inf, inf)
    if isinstance(e, Neg):
        lo, hi = bounds(e.operand)
        return -hi, -lo
    if isinstance(e, Call) and len(e.args) == 1 and e.func in BUILTINS:
        return builtin_bounds(e.func, *bounds(e.args[0]))
    if isinstance(e, Binary):
        (a, b), (c, d) = bounds(e.left), bounds(e.right)
        if e.op == "+":
            return a + c, b + d
        if e.op == "-":
            return a - d, b - c
        if e.op in ("*", "@"):
            return _mul_bounds(a, b, c, d)
        if e.op == "/" and (c > 0 or d < 0):  # the denominator never crosses 0
            inv = (
                1 / d if d not in (0, inf, -inf) else 0.0,
                1 / c if c not in (0, inf, -inf) else 0.0,
            )
            if c > 0 and math.isinf(d):
                inv = (0.0, 1 / c)
            if d < 0 and math.isinf(c):
                inv = (1 / d, 0.0)
            return _mul_bounds(a, b, *inv)
        if e.op == "^" and a > 0:
            vals = [x**y for x in (a, b) for y in (c, d) if not (math.isinf(x) and y == 0)]
            try:
                return min(vals), max(vals)
            except (OverflowError, ValueError):
                return 0.0, inf
    return -inf, inf


def _mul_bounds(a: float, b: float, c: float, d: float) -> tuple[float, float]:
    if not any(math.isinf(x) for x in (a, b, c, d)):
        ps = [a * c, a * d, b * c, b * d]
        return min(ps), max(ps)
    if a >= 0 and c >= 0:
        return 0.0, math.inf
    if (a >= 0 and d <= 0) or (b <= 0 and c >= 0):
        return -math.inf, 0.0
    if b <= 0 and d <= 0:
        return 0.0, math.inf
    return -math.inf, math.inf


def nonpositive(e: Expr, params: dict[str, Expr]) -> bool:
    return bounds(with_defaults(e, params))[1] <= 0


def with_defaults(e: Expr, params: dict[str, Expr]) -> Expr:
    if isinstance(e, Name) and params.get(e.name) is not None:
        return params[e.name]
    if isinstance(e, Neg):
        return Neg(with_defaults(e.operand, params))
    if isinstance(e, Binary):
        return Binary(e.op, with_defaults(e.left, params), with_defaults(e.right, params))
    if isinstance(e, Call):
        return Call(e.func, tuple(with_defaults(a, params) for a in e.args))
    if isinstance(e, Transpose):
        return with_defaults(e.operand, params)
    return e


def constant(e: Expr) -> float | None:
    """The value of an expression of numbers only (no names, no head index), else None."""
    if any(isinstance(n, Name | Timed) for n in walk(e)):
        return None
    lo, hi = bounds(e)
    return lo if lo == hi else None
