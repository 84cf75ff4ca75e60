"""The builtins table: its float, tensor and interval versions agree with each other, never raise
at the extremes, and importing the table does not import torch."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from mixc.frontend.builtins import BUILTINS, bounds
from mixc.frontend.constants import constant
from mixc.frontend.ir import FUNCTIONS, Binary, Call, Neg, Number, Timed
from mixc.oracle.interpret import FUNCTIONS as ORACLE_FUNCTIONS
from tests.mixers import ROOT

INF = math.inf
ELEMENTWISE = [name for name, b in BUILTINS.items() if b.elementwise and b.arity == 1]
BINARY = [name for name, b in BUILTINS.items() if b.arity == 2 and b.elementwise]
#: Points that reach every branch: both infinities, overflow of exp either way, silu's minimum.
POINTS = [-INF, -800.0, -705.0, -50.0, -2.0, -1.2785, -0.5, 0.0, 0.5, 2.0, 50.0, 705.0, 800.0, INF]
#: Every interval between two points, but the single points at infinity.
INTERVALS = [(lo, hi) for lo in POINTS for hi in POINTS if lo < hi or (lo == hi and abs(lo) < INF)]


def test_the_views_list_every_builtin_in_order():
    names = ["exp", "log", "sigmoid", "logsigmoid", "softplus", "silu", "elu", "relu", "tanh"]
    names += ["sqrt", "abs", "max", "min", "sum", "l2norm", "diag", "floor", "cos", "sin"]
    names += ["softmax", "onehot_argmax", "stop_gradient", "rotate", "rotate_interleaved"]
    names += ["rotate_halves"]
    assert list(BUILTINS) == names
    assert list(FUNCTIONS) == list(BUILTINS) and set(FUNCTIONS.values()) == {1, 2}
    rotations = ["rotate", "rotate_interleaved", "rotate_halves"]
    assert [n for n, arity in FUNCTIONS.items() if arity == 2] == ["max", "min", *rotations]
    assert BINARY == ["max", "min"]
    assert list(ORACLE_FUNCTIONS) == list(BUILTINS)
    vectors = ["sum", "l2norm", "diag", "softmax", "onehot_argmax", *rotations]
    assert [n for n, b in BUILTINS.items() if not b.elementwise] == vectors


def test_importing_the_frontend_does_not_import_torch():
    code = (
        "import sys, mixc.frontend.builtins, mixc.frontend.verify, mixc.algebra.expand; "
        "print('torch' in sys.modules)"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert run.stdout.strip() == "False", run.stderr


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_evaluate_never_raises_and_matches_the_tensor_version(name):
    builtin = BUILTINS[name]
    for x in (-INF, INF, math.nan):
        builtin.evaluate(x)
    xs = [*POINTS[1:-1], math.nan, -710.0, 710.0, 1e-300, -1e-300]
    floats = torch.tensor([builtin.evaluate(x) for x in xs], dtype=torch.float64)
    tensors = builtin.tensor(torch.tensor(xs, dtype=torch.float64))
    torch.testing.assert_close(floats, tensors, rtol=1e-15, atol=1e-300, equal_nan=True)


@pytest.mark.parametrize("name", BINARY)
def test_two_argument_builtins_match_their_tensor_and_interval_versions(name):
    builtin = BUILTINS[name]
    xs = [*POINTS, math.nan]
    pairs = [(x, y) for x in xs for y in xs]
    floats = torch.tensor([builtin.evaluate(x, y) for x, y in pairs], dtype=torch.float64)
    a, b = (torch.tensor(list(c), dtype=torch.float64) for c in zip(*pairs))
    torch.testing.assert_close(floats, builtin.tensor(a, b), rtol=0, atol=0, equal_nan=True)
    for lo, hi in INTERVALS[::7]:
        for lo2, hi2 in INTERVALS[::5]:
            low, high = bounds(name, lo, hi, lo2, hi2)
            for x in _inside(lo, hi, 5):
                for y in _inside(lo2, hi2, 5):
                    assert low <= builtin.evaluate(x, y) <= high, (lo, hi, lo2, hi2, x, y)


def test_sum_adds_every_entry_and_keeps_their_sign():
    x = torch.tensor([[1.0, -2.0], [3.0, 0.5]], dtype=torch.float64)
    assert BUILTINS["sum"].tensor(x).item() == 2.5
    assert bounds("sum", 0.5, 2.0) == (0.5, INF)
    assert bounds("sum", -2.0, -1.0) == (-INF, -1.0)
    assert bounds("sum", -1.0, 1.0) == (-INF, INF)


def _inside(lo: float, hi: float, n: int = 41) -> list[float]:
    """Points of [lo, hi]: its ends and a grid over its finite part (infinities cut at 1000)."""
    a, b = max(lo, -1000.0), min(hi, 1000.0)
    grid = [a + (b - a) * i / (n - 1) for i in range(n)] if a <= b else []
    return [lo, hi, *grid, *(x for x in POINTS if lo <= x <= hi)]


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_bounds_hold_every_value_of_an_elementwise_builtin(name):
    evaluate = BUILTINS[name].evaluate
    for lo, hi in INTERVALS:
        low, high = bounds(name, lo, hi)
        for x in _inside(lo, hi):
            y = evaluate(x)
            assert (math.isnan(y) and (low, high) == (-INF, INF)) or low <= y <= high, (lo, hi, x)


@pytest.mark.parametrize("name", ["l2norm", "diag"])
def test_bounds_hold_every_entry_of_l2norm_and_diag(name):
    g = torch.Generator().manual_seed(0)
    for lo, hi in INTERVALS:
        a, b = max(lo, -1000.0), min(hi, 1000.0)
        x = a + (b - a) * torch.rand(200, 4, 1, generator=g, dtype=torch.float64)
        low, high = bounds(name, lo, hi)
        y = BUILTINS[name].tensor(x)
        assert low <= y.min().item() and y.max().item() <= high, (lo, hi)


@pytest.mark.parametrize(
    ("name", "lo", "hi", "want"),
    [
        ("exp", -INF, INF, (0.0, INF)),
        ("exp", 800.0, 900.0, (INF, INF)),
        ("sigmoid", -INF, INF, (0.0, 1.0)),
        ("tanh", -INF, INF, (-1.0, 1.0)),
        ("softplus", -INF, INF, (0.0, INF)),
        ("logsigmoid", -INF, INF, (-INF, 0.0)),
        ("elu", -INF, INF, (-1.0, INF)),
        ("relu", -INF, -1.0, (0.0, 0.0)),
        ("log", 0.0, INF, (-INF, INF)),
        ("log", -1.0, 1.0, (-INF, INF)),
        ("sqrt", 0.0, 4.0, (0.0, 2.0)),
        ("sqrt", -1.0, 4.0, (-INF, INF)),
        ("abs", -3.0, 2.0, (0.0, 3.0)),
        ("abs", -3.0, -2.0, (2.0, 3.0)),
        ("silu", 2.0, 3.0, (1.0, INF)),
        ("l2norm", 0.5, 2.0, (0.0, 1.0)),
        ("diag", 1.0, 2.0, (0.0, 2.0)),
        ("exp", math.nan, 1.0, (-INF, INF)),
    ],
)
def test_bounds_at_the_edges(name, lo, hi, want):
    assert bounds(name, lo, hi) == want


def test_bounds_of_a_non_builtin_is_a_key_error():
    with pytest.raises(KeyError):
        bounds("phi", 0.0, 1.0)


def _call(func: str, x: float) -> Call:
    number = Number(repr(abs(x)))
    return Call(func, (Neg(number) if x < 0 else number,))


@pytest.mark.parametrize(
    ("func", "x", "want"),
    [
        ("sigmoid", 0.0, 0.5),
        ("sigmoid", -800.0, 0.0),  # math.exp(800) overflows; the table's sigmoid does not
        ("softplus", 800.0, 800.0),
        ("logsigmoid", -800.0, -800.0),
        ("exp", 1000.0, None),  # not finite: left to the generated code
        ("log", 0.0, None),
        ("sqrt", -1.0, None),
        ("l2norm", 2.0, None),  # not a function of a number
        ("abs", -2.0, 2.0),
        ("sum", -2.0, -2.0),
    ],
)
def test_constant_folding(func, x, want):
    assert constant(_call(func, x)) == want


def test_constant_is_finite_at_every_node_and_folds_deep_expressions():
    """A constant has a value only where every node of it is a finite real, as the verifier
    requires of a spec's (1 / (1e300 * 1e300) has none: its product overflows float64); what
    does not fold (a division by zero, a time-indexed input anywhere) is None; and a nest
    deeper than Python's recursion limit folds, each node once."""
    huge = Binary("*", Number("1e300"), Number("1e300"))
    assert constant(Binary("/", Number("1"), huge)) is None
    assert constant(huge) is None
    assert constant(Binary("/", Number("1"), Number("0"))) is None
    deep = Number("1")
    for _ in range(sys.getrecursionlimit() * 2):
        deep = Binary("+", deep, Number("1"))
    assert constant(deep) == sys.getrecursionlimit() * 2 + 1
    assert constant(Binary("*", deep, Timed("x", 0))) is None
