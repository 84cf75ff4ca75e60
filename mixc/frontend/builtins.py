"""The built-in functions of the spec language, in one table.

Every stage needs something different of a built-in: the verifier its arity, the expander
whether it acts elementwise, the code generator its torch spelling and a float version for
folding constants, the float64 oracle a tensor version, the analysis and the fuzzer an interval
version. `BUILTINS` holds all of them, so a new function is one entry here.

Importing this module does not import torch: the tensor versions resolve torch when first
called, so that checking and explaining a spec work without it.
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["BUILTINS", "L2NORM_EPS", "Builtin", "Interval", "bounds"]

#: A closed interval (lo, hi) of reals; either end may be infinite.
Interval = tuple[float, float]

_INF = math.inf
_WHOLE_LINE: Interval = (-_INF, _INF)

#: The oracle's l2norm is x / sqrt(|x|^2 + L2NORM_EPS), as the generated code's.
L2NORM_EPS = 1e-6


@dataclass(frozen=True, slots=True)
class Builtin:
    """One built-in function and what each stage of the compiler needs of it.

    - `arity`: how many arguments it takes (the verifier checks calls against it).
    - `elementwise`: whether it acts on each entry alone (all but l2norm, sum and diag); the
      expander pushes transposes inside elementwise calls. The arguments of a two-argument
      elementwise function (max, min) broadcast as those of `*` do.
    - `torch`: its spelling in generated code, applied to the argument in the [..., rows, cols]
      layout (diag's to the argument squeezed to a vector, sum's over the last two dims; `_l2norm`
      is a runtime helper; max and min of a constant are a clamp). The
      generated code reads torch as `_torch` and torch.nn.functional as `_F`: names beginning
      with an underscore, which no spec name can shadow.
    - `evaluate`: the function on floats (one per argument), for folding constants; None where
      it is not a function of a number (l2norm, diag; sum of a number is the number). It never raises: where math.exp would overflow it
      returns the float the true value rounds to (inf for exp(1000), 0 for sigmoid(-1000)), at
      -inf and inf the limits, outside the domain (log(-1)) NaN.
    - `tensor`: the float64 oracle's version, on torch tensors laid out as the oracle lays them
      out (written independently of `torch`, so the oracle shares no code with the generator).
    - `bounds`: (lo, hi) per argument, flattened (lo1, hi1, lo2, hi2 for max) -> an interval
      holding every value the function takes there; the module's `bounds` adds the NaN check and
      is what callers should use.
    """

    name: str
    arity: int
    elementwise: bool
    torch: str
    evaluate: Callable[..., float] | None
    tensor: Callable[..., Any]
    bounds: Callable[..., Interval]


def bounds(name: str, lo: float, hi: float, *more: float) -> Interval:
    """An interval that holds `name`(x) for every x in [lo, hi] (ends may be -inf or inf); for a
    function of two arguments, `more` is the second's (lo, hi).

    It is never too narrow, up to rounding at the ends (an end is the function evaluated in
    float64, not rounded outwards). Where part of [lo, hi] lies outside the function's domain
    (log or sqrt of a negative number) or an end is NaN, the answer is the whole line: the value
    there is NaN, which no interval bounds. For l2norm and diag the interval bounds each entry
    of the result, given that each entry of the argument lies in [lo, hi]; for sum, the sum of
    any number of such entries. Raises KeyError for a name that is not a built-in (a let
    function is inlined before anyone asks).
    """
    if any(math.isnan(x) for x in (lo, hi, *more)):
        return _WHOLE_LINE
    return BUILTINS[name].bounds(lo, hi, *more)


# ----------------------------------------------------------------------------- floats


def _exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return _INF


def _log(x: float) -> float:
    if x < 0:
        return math.nan
    return -_INF if x == 0 else math.log(x)


def _sqrt(x: float) -> float:
    return math.nan if x < 0 else math.sqrt(x)


def _sigmoid(x: float) -> float:
    try:
        return 1 / (1 + math.exp(-x))
    except OverflowError:  # x < -709: 1 + e^-x is e^-x to the last bit
        return math.exp(x)


def _logsigmoid(x: float) -> float:
    try:
        return -math.log1p(math.exp(-x))
    except OverflowError:  # x < -709: log(1 + e^-x) is -x to the last bit
        return x


def _softplus(x: float) -> float:
    try:
        return math.log1p(math.exp(x))
    except OverflowError:  # x > 709: log(1 + e^x) is x to the last bit
        return x


def _silu(x: float) -> float:
    if x == -_INF:
        return -0.0
    try:
        return x / (1 + math.exp(-x))
    except OverflowError:  # x < -709: x e^x / (1 + e^x) is x e^x to the last bit
        return x * math.exp(x)


def _elu(x: float) -> float:
    return x if x > 0 else math.expm1(x)


def _relu(x: float) -> float:
    return max(x, 0.0)


def _cos(x: float) -> float:
    return math.nan if math.isinf(x) else math.cos(x)


def _sin(x: float) -> float:
    return math.nan if math.isinf(x) else math.sin(x)


def _floor(x: float) -> float:
    return x if math.isinf(x) or math.isnan(x) else float(math.floor(x))


def _max(x: float, y: float) -> float:
    return math.nan if math.isnan(x) or math.isnan(y) else max(x, y)


def _min(x: float, y: float) -> float:
    return math.nan if math.isnan(x) or math.isnan(y) else min(x, y)


# ----------------------------------------------------------------------------- tensors


def _torch_function(path: str) -> Callable[[Any], Any]:
    """The torch function at dotted `path` ("torch.nn.functional.logsigmoid"), looked up on the
    first call, so that importing this module does not import torch."""
    module, _, attr = path.rpartition(".")

    @functools.cache
    def resolve() -> Callable[[Any], Any]:
        return getattr(importlib.import_module(module), attr)

    def call(x: Any) -> Any:
        return resolve()(x)

    call.__name__ = call.__qualname__ = path
    return call


def _softplus_tensor(x):
    """log(1 + exp(x)) without overflow, and without torch's linear cut-off above x = 20."""
    import torch

    return torch.clamp(x, min=0) + torch.log1p(torch.exp(-x.abs()))


def _silu_tensor(x):
    import torch

    return x * torch.sigmoid(x)


def _elu_tensor(x):
    import torch

    return torch.where(x > 0, x, torch.expm1(x))


def _l2norm_tensor(x):
    """A vector (a column [..., d, 1] or a row [..., 1, d]) over its Euclidean norm."""
    import torch

    return x / torch.sqrt((x * x).sum(dim=(-2, -1), keepdim=True) + L2NORM_EPS)


def _maximum_tensor(x, y):
    import torch

    return torch.maximum(x, y)


def _minimum_tensor(x, y):
    import torch

    return torch.minimum(x, y)


def _sum_tensor(x):
    """Every entry of a vector or matrix [..., r, c] added up, as a scalar [..., 1, 1]."""
    return x.sum(dim=(-2, -1), keepdim=True)


def _softmax_tensor(x):
    """exp(x - max x) over every entry of a vector, normalised to sum 1."""
    import torch

    e = torch.exp(x - x.amax(dim=(-2, -1), keepdim=True))
    return e / e.sum(dim=(-2, -1), keepdim=True)


def _onehot_argmax_tensor(x):
    """1 at the first largest entry of a vector, 0 elsewhere; the gradient of softmax(x)."""
    import torch

    flat = x.flatten(-2)
    hard = torch.zeros_like(flat).scatter_(-1, flat.argmax(-1, keepdim=True), 1.0)
    soft = _softmax_tensor(x)
    return hard.reshape(x.shape) + (soft - soft.detach())


def _rotate_pairs(x, theta, pairing):
    """Each pair (a, b) of a column [..., d, 1] turned by its angle: (a cos - b sin,
    a sin + b cos). Pair i is (i, i + n) ("split"), (2i, 2i + 1) ("interleaved") or
    (i, i + d // 2) ("halves"), where n is the number of angles theta [..., p, 1] gives, or
    d / 2 when p = d; the entries in no pair are kept."""
    import torch

    d, p = x.shape[-2], theta.shape[-2]
    n = d // 2 if p == d else p
    if 2 * n > d:
        raise ValueError(f"rotate: {p} angles for a vector of {d} entries")
    first = [2 * i for i in range(n)] if pairing == "interleaved" else list(range(n))
    offset = {"split": n, "halves": d // 2}.get(pairing, 0)
    second = [2 * i + 1 for i in range(n)] if offset == 0 else [i + offset for i in range(n)]
    angle = theta[..., :n, :]
    a, b = x[..., first, :], x[..., second, :]
    shape = torch.broadcast_shapes(x.shape, (*theta.shape[:-2], d, 1))
    out = x.expand(shape).clone()
    out[..., first, :] = a * torch.cos(angle) - b * torch.sin(angle)
    out[..., second, :] = a * torch.sin(angle) + b * torch.cos(angle)
    return out


def _rotate_tensor(x, theta):
    return _rotate_pairs(x, theta, "split")


def _rotate_interleaved_tensor(x, theta):
    return _rotate_pairs(x, theta, "interleaved")


def _rotate_halves_tensor(x, theta):
    return _rotate_pairs(x, theta, "halves")


def _diag_tensor(x):
    """A vector (column or row) to the diagonal matrix [..., d, d]."""
    import torch

    return torch.diag_embed(x.flatten(-2))


# ----------------------------------------------------------------------------- bounds


def _increasing(f: Callable[[float], float]) -> Callable[[float, float], Interval]:
    """The interval of a nondecreasing `f`: its values at the ends, or the whole line where an
    end lies outside f's domain (f gives NaN there)."""

    def monotone_bounds(lo: float, hi: float) -> Interval:
        low, high = f(lo), f(hi)
        return _WHOLE_LINE if math.isnan(low) or math.isnan(high) else (low, high)

    return monotone_bounds


#: The minimum of silu (about -0.278465, at x = -1.2785), rounded down.
_SILU_MIN = -0.2785


def _silu_bounds(lo: float, hi: float) -> Interval:
    """silu(x) = x sigmoid(x) is at least x/2 for x >= 0, at least its minimum everywhere, at
    most 0 for x <= 0; above 0 the upper end is left open."""
    return (lo * 0.5 if lo >= 0 else _SILU_MIN), (_INF if hi > 0 else 0.0)


def _l2norm_bounds(lo: float, hi: float) -> Interval:
    """Each entry of x / |x| lies in [-1, 1] and keeps the sign of x's entry."""
    return (0.0 if lo >= 0 else -1.0), (0.0 if hi <= 0 else 1.0)


def _abs_bounds(lo: float, hi: float) -> Interval:
    if lo >= 0:
        return lo, hi
    if hi <= 0:
        return -hi, -lo
    return 0.0, max(-lo, hi)


def _max_bounds(lo: float, hi: float, lo2: float, hi2: float) -> Interval:
    return max(lo, lo2), max(hi, hi2)


def _min_bounds(lo: float, hi: float, lo2: float, hi2: float) -> Interval:
    return min(lo, lo2), min(hi, hi2)


def _sum_bounds(lo: float, hi: float) -> Interval:
    """A sum of one or more entries in [lo, hi]: it keeps their sign, its size is open."""
    low = lo if lo >= 0 else -_INF
    high = hi if hi <= 0 else _INF
    return low, high


def _trig_bounds(lo: float, hi: float) -> Interval:
    """cos and sin lie in [-1, 1]; at an infinite end they are NaN (no limit)."""
    return _WHOLE_LINE if math.isinf(lo) or math.isinf(hi) else (-1.0, 1.0)


def _unit_bounds(lo: float, hi: float) -> Interval:
    """softmax and onehot_argmax: every entry lies in [0, 1]."""
    return 0.0, 1.0


def _rotate_bounds(lo: float, hi: float, lo2: float, hi2: float) -> Interval:
    """An entry a cos - b sin of a turned pair is at most sqrt(2) max(|a|, |b|) in size."""
    size = math.sqrt(2.0) * max(abs(lo), abs(hi))
    return -size, size


def _diag_bounds(lo: float, hi: float) -> Interval:
    """The diagonal holds the vector's entries, every other entry is 0."""
    return min(lo, 0.0), max(hi, 0.0)


# ----------------------------------------------------------------------------- the table


def _monotone(
    name: str, torch: str, evaluate: Callable[[float], float], tensor: Callable[[Any], Any]
) -> Builtin:
    """A one-argument elementwise built-in whose float version is nondecreasing."""
    return Builtin(name, 1, True, torch, evaluate, tensor, _increasing(evaluate))


_F = "torch.nn.functional."
_TABLE = (
    _monotone("exp", "_torch.exp", _exp, _torch_function("torch.exp")),
    _monotone("log", "_torch.log", _log, _torch_function("torch.log")),
    _monotone("sigmoid", "_torch.sigmoid", _sigmoid, _torch_function("torch.sigmoid")),
    _monotone("logsigmoid", "_F.logsigmoid", _logsigmoid, _torch_function(_F + "logsigmoid")),
    _monotone("softplus", "_F.softplus", _softplus, _softplus_tensor),
    Builtin("silu", 1, True, "_F.silu", _silu, _silu_tensor, _silu_bounds),
    _monotone("elu", "_F.elu", _elu, _elu_tensor),
    _monotone("relu", "_torch.relu", _relu, _torch_function("torch.relu")),
    _monotone("tanh", "_torch.tanh", math.tanh, _torch_function("torch.tanh")),
    _monotone("sqrt", "_torch.sqrt", _sqrt, _torch_function("torch.sqrt")),
    Builtin("abs", 1, True, "_torch.abs", abs, _torch_function("torch.abs"), _abs_bounds),
    Builtin("max", 2, True, "_torch.maximum", _max, _maximum_tensor, _max_bounds),
    Builtin("min", 2, True, "_torch.minimum", _min, _minimum_tensor, _min_bounds),
    Builtin("sum", 1, False, "_torch.sum", lambda x: x, _sum_tensor, _sum_bounds),
    Builtin("l2norm", 1, False, "_l2norm", None, _l2norm_tensor, _l2norm_bounds),
    Builtin("diag", 1, False, "_torch.diag_embed", None, _diag_tensor, _diag_bounds),
    _monotone("floor", "_torch.floor", _floor, _torch_function("torch.floor")),
    Builtin("cos", 1, True, "_cos", _cos, _torch_function("torch.cos"), _trig_bounds),
    Builtin("sin", 1, True, "_sin", _sin, _torch_function("torch.sin"), _trig_bounds),
    Builtin("softmax", 1, False, "_softmax", None, _softmax_tensor, _unit_bounds),
    Builtin("onehot_argmax", 1, False, "_onehot_argmax", None, _onehot_argmax_tensor, _unit_bounds),
    _monotone("stop_gradient", "_torch.detach", lambda x: x, _torch_function("torch.detach")),
    Builtin("rotate", 2, False, "_rotate", None, _rotate_tensor, _rotate_bounds),
    Builtin(
        "rotate_interleaved",
        2,
        False,
        "_rotate_interleaved",
        None,
        _rotate_interleaved_tensor,
        _rotate_bounds,
    ),
    Builtin(
        "rotate_halves", 2, False, "_rotate_halves", None, _rotate_halves_tensor, _rotate_bounds
    ),
)

#: The rotations: a column vector's pairs of entries turned by a column of angles, each
#: function its own pairing (docs/language.md, positions and rotations).
ROTATIONS = ("rotate", "rotate_interleaved", "rotate_halves")

#: Every built-in by name, in the order error messages list them.
BUILTINS: dict[str, Builtin] = {b.name: b for b in _TABLE}
