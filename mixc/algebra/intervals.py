"""Interval arithmetic over spec expressions: what values an expression can take.

One arithmetic serves two callers. The analysis proves, for every head (h >= 0) and any value
of the inputs and parameters, that a decay lies in (0, 1], that a beta lies in [0, 2], or that
a constant is positive. The fuzzer searches for input ranges under which the same conditions
hold, and so gives some inputs and parameters an interval of their own (`env`).

Every interval holds every value its expression can take (up to rounding at the ends): a
result that is too wide only loses a proof, one that is too narrow would prove something false.
Functions are bounded by the builtins table (`mixc.frontend.builtins.bounds`), so a new built-in
needs no change here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from mixc.frontend.builtins import BUILTINS, Interval
from mixc.frontend.builtins import bounds as builtin_bounds
from mixc.frontend.ir import (
    CHANNEL,
    Binary,
    Call,
    Expr,
    Identity,
    Name,
    Neg,
    Number,
    Timed,
    Transpose,
)

__all__ = ["bounds", "nonpositive"]

_INF = math.inf
_WHOLE_LINE: Interval = (-_INF, _INF)


def bounds(
    e: Expr,
    env: Mapping[str, Interval] | None = None,
    defaults: Mapping[str, Expr | None] | None = None,
) -> Interval:
    """Interval of the values every entry of `e` can take, for a head index h >= 0.

    `env` gives the interval of some inputs (read as `x_t`) and parameters (read as `x`); any
    other input or parameter is any real. `defaults` gives the default expression of some
    parameters (None for a parameter without one), bounded in place of the parameter.

    A matrix product is bounded as a product of its entries, which is exact for the scalar and
    elementwise factors gates are made of (`dt_t A`, `2 sigmoid(b_t)`), but too narrow for a
    contraction over more than one entry with finite bounds. A dot product (`.`), a sum of one
    or more such products, keeps only the ends that the signs of its terms guarantee.
    """
    return _bounds(e, env or {}, defaults or {})


def _bounds(e: Expr, env: Mapping[str, Interval], defaults: Mapping[str, Expr | None]) -> Interval:
    """`bounds`, with `env` and `defaults` given."""
    if isinstance(e, Number):
        v = float(e.text)
        return v, v
    if isinstance(e, Identity):  # its entries are 0 and 1
        return 0.0, 1.0
    if isinstance(e, Name):
        if e.name == "h":
            return 0.0, _INF
        if e.name == CHANNEL:  # a vector's channel index, or where env bounds it
            return env.get(CHANNEL, (0.0, _INF))
        default = defaults.get(e.name)
        if default is not None:
            return _bounds(default, env, defaults)
        return env.get(e.name, _WHOLE_LINE)
    if isinstance(e, Timed):
        return env.get(e.name, _WHOLE_LINE)
    if isinstance(e, Neg):
        lo, hi = _bounds(e.operand, env, defaults)
        return -hi, -lo
    if isinstance(e, Transpose):  # the same entries, elsewhere
        return _bounds(e.operand, env, defaults)
    if isinstance(e, Call) and e.func in BUILTINS:
        ends = [end for a in e.args for end in _bounds(a, env, defaults)]
        return builtin_bounds(e.func, *ends)
    if isinstance(e, Binary):
        return _binary(e.op, _bounds(e.left, env, defaults), _bounds(e.right, env, defaults))
    return _WHOLE_LINE


def _binary(op: str, x: Interval, y: Interval) -> Interval:
    """Interval of `x op y` for the intervals of the two operands."""
    if op == "+":
        return _finite_or_whole(x[0] + y[0], x[1] + y[1])
    if op == "-":
        return _finite_or_whole(x[0] - y[1], x[1] - y[0])
    if op in ("*", "@"):
        return _multiply(x, y)
    if op == ".":
        return _dot(x, y)
    if op == "/":
        return _divide(x, y)
    if op == "^":
        return _power(x, y)
    return _WHOLE_LINE


def _finite_or_whole(lo: float, hi: float) -> Interval:
    """(lo, hi), or the whole line where an end is NaN (inf - inf: nothing is known)."""
    return _WHOLE_LINE if math.isnan(lo) or math.isnan(hi) else (lo, hi)


def _times(a: float, b: float) -> float:
    """a * b for ends of intervals: 0 times an unbounded end is 0, as every value is finite."""
    return 0.0 if a == 0 or b == 0 else a * b


def _multiply(x: Interval, y: Interval) -> Interval:
    """Interval of a product: the extreme products of the ends."""
    ps = [_times(a, b) for a in x for b in y]
    return min(ps), max(ps)


def _dot(x: Interval, y: Interval) -> Interval:
    """Interval of a dot product of vectors with entries in x and y: a sum of one or more
    products, so it keeps only the lower end of a product that is never negative and the upper
    end of one that is never positive."""
    lo, hi = _multiply(x, y)
    return (lo if lo >= 0 else -_INF), (hi if hi <= 0 else _INF)


def _divide(x: Interval, y: Interval) -> Interval:
    """Interval of a quotient: x times 1/y, where y never reaches 0 (1/y then lies between the
    inverses of y's ends, 0 for an unbounded end)."""
    if not (y[0] > 0 or y[1] < 0):
        return _WHOLE_LINE
    inverse = [0.0 if math.isinf(b) else 1 / b for b in y]
    return _multiply(x, (min(inverse), max(inverse)))


def _power(x: Interval, y: Interval) -> Interval:
    """Interval of x^y for a base that is always positive (or 0, to a positive power): x^y = exp(y log x) is monotone in
    each of y and log x, so its extremes are at the corners (inf^0, which has no limit, left
    out: x^0 = 1 at the finite bases). An even whole exponent n >= 2 takes any base: x^n =
    |x|^n >= 0."""
    n = y[0]
    if y[0] == y[1] and math.isfinite(n) and n >= 2 and n == int(n) and int(n) % 2 == 0:
        low = 0.0 if x[0] <= 0 <= x[1] else min(abs(x[0]), abs(x[1]))
        high = max(abs(x[0]), abs(x[1]))
        try:
            return low**n, high**n
        except OverflowError:
            return low**n if low < 1 else _INF, _INF
    if x[0] < 0 or (x[0] == 0 and y[0] <= 0):  # a base of 0 only to a positive power: 0
        return _WHOLE_LINE
    try:
        vals = [a**b for a in x for b in y if not (math.isinf(a) and b == 0)]
        return min(vals), max(vals)
    except (OverflowError, ValueError):  # a corner overflows, or every corner is inf^0
        return 0.0, _INF


def nonpositive(e: Expr, params: Mapping[str, Expr | None]) -> bool:
    """Whether `e` is <= 0 for every head and any inputs, parameters taking their defaults."""
    return bounds(e, defaults=params)[1] <= 0
