"""The interval arithmetic the analysis and the fuzzer share: every interval holds every value
of its expression (checked on random expressions at random points), and the rules for identity,
transposes, dot products, unbounded products, quotients and powers are as tight as they are
meant to be."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mixc.algebra.intervals import bounds, nonpositive
from mixc.frontend.builtins import BUILTINS
from mixc.frontend.ir import Binary, Call, Expr, Identity, Name, Neg, Number, Timed, Transpose

INF = math.inf
WHOLE = (-INF, INF)
ELEMENTWISE = [name for name, b in BUILTINS.items() if b.elementwise]
ENDS = [-50.0, -3.0, -1.0, -0.5, 0.0, 0.25, 1.0, 2.0, 40.0]
#: The intervals of the leaves x0, x1, x2, drawn per example.
LEAVES = ("x0", "x1", "x2")


def x(name: str) -> Timed:
    return Timed(name, 0)


def num(v: float) -> Number:
    return Number(repr(v))


@pytest.mark.parametrize(
    ("e", "env", "want"),
    [
        (Identity(), {}, (0.0, 1.0)),
        (Transpose(x("a")), {"a": (1.0, 2.0)}, (1.0, 2.0)),
        (Binary(".", x("a"), x("b")), {"a": (1.0, 2.0), "b": (3.0, 4.0)}, (3.0, INF)),
        (Binary(".", x("a"), x("b")), {"a": (-2.0, -1.0), "b": (3.0, 4.0)}, (-INF, -3.0)),
        (Binary(".", x("a"), x("b")), {"a": (-1.0, 1.0), "b": (3.0, 4.0)}, WHOLE),
        (Binary("*", x("a"), x("b")), {"a": (2.0, 3.0), "b": (1.0, INF)}, (2.0, INF)),
        (Binary("@", x("a"), x("b")), {"a": (0.0, 1.0), "b": (-INF, 0.0)}, (-INF, 0.0)),
        (Binary("/", num(1.0), x("a")), {"a": (2.0, INF)}, (0.0, 0.5)),
        (Binary("/", num(1.0), x("a")), {"a": (-INF, -4.0)}, (-0.25, 0.0)),
        (Binary("/", num(1.0), x("a")), {"a": (0.0, 1.0)}, WHOLE),
        (Binary("^", num(2.0), Neg(Name("h"))), {}, (0.0, 1.0)),
        (Binary("^", x("a"), num(2.0)), {"a": (-1.0, 1.0)}, (0.0, 1.0)),
        (Binary("^", x("a"), num(2.0)), {"a": (-3.0, -2.0)}, (4.0, 9.0)),
        (Binary("^", x("a"), num(3.0)), {"a": (-1.0, 1.0)}, WHOLE),
        (Binary("^", x("a"), num(0.0)), {"a": (INF, INF)}, (0.0, INF)),
        (Binary("-", Number("1e400"), Number("1e400")), {}, WHOLE),
        (Call("sigmoid", (x("a"),)), {}, (0.0, 1.0)),
        (Call("l2norm", (x("a"),)), {"a": (0.5, 2.0)}, (0.0, 1.0)),
        (Call("phi", (x("a"),)), {"a": (0.5, 2.0)}, WHOLE),
    ],
)
def test_rules(e: Expr, env: dict, want: tuple[float, float]) -> None:
    assert bounds(e, env) == want


def test_names_read_the_head_index_the_environment_and_the_defaults() -> None:
    gamma = Binary("-", num(1.0), Binary("^", num(2.0), Binary("-", num(-5.0), Name("h"))))
    defaults = {"gamma": gamma, "A": None}
    assert bounds(Name("h")) == (0.0, INF)
    assert bounds(Name("gamma"), defaults=defaults) == (0.96875, 1.0)
    assert bounds(Name("A"), {"A": (-INF, 0.0)}, defaults) == (-INF, 0.0)
    assert bounds(Name("A"), defaults=defaults) == WHOLE
    assert bounds(x("A"), defaults=defaults) == WHOLE  # a default is a parameter's, not an input's
    assert nonpositive(Call("log", (Name("gamma"),)), defaults)
    assert not nonpositive(Name("A"), defaults)


@st.composite
def _exprs(draw, depth: int = 3) -> Expr:
    """A scalar expression over the leaves, h and numbers."""
    leaf = st.one_of(
        st.sampled_from([x(n) for n in LEAVES] + [Name("h"), Identity()]),
        st.sampled_from(ENDS).map(num),
    )
    if depth == 0 or draw(st.booleans()):
        return draw(leaf)
    kind = draw(st.sampled_from(["neg", "transpose", "call", "binary"]))
    if kind == "neg":
        return Neg(draw(_exprs(depth - 1)))
    if kind == "transpose":
        return Transpose(draw(_exprs(depth - 1)))
    if kind == "call":
        func = draw(st.sampled_from(ELEMENTWISE))
        return Call(func, tuple(draw(_exprs(depth - 1)) for _ in range(BUILTINS[func].arity)))
    op = draw(st.sampled_from(["+", "-", "*", "@", "/", "^"]))
    return Binary(op, draw(_exprs(depth - 1)), draw(_exprs(depth - 1)))


def _value(e: Expr, at: dict[str, float]) -> float:
    """`e` at the point `at` (Identity an entry 0 or 1, chosen by the point too); raises
    ArithmeticError or ValueError where the value is not a real number."""
    if isinstance(e, Number):
        return float(e.text)
    if isinstance(e, Identity):
        return at["I"]
    if isinstance(e, Name | Timed):
        return at[e.name]
    if isinstance(e, Neg):
        return -_value(e.operand, at)
    if isinstance(e, Transpose):
        return _value(e.operand, at)
    if isinstance(e, Call):
        return BUILTINS[e.func].evaluate(*(_value(a, at) for a in e.args))
    a, b = _value(e.left, at), _value(e.right, at)
    if e.op == "+":
        return a + b
    if e.op == "-":
        return a - b
    if e.op in ("*", "@"):
        return a * b
    if e.op == "/":
        return a / b
    return math.pow(a, b)


def _point(env: dict[str, tuple[float, float]], rng: random.Random) -> dict[str, float]:
    """A point with every leaf in its interval (often at an end) and h a head index."""
    at = {n: rng.choice([lo, hi, lo + (hi - lo) * rng.random()]) for n, (lo, hi) in env.items()}
    return at | {"h": float(rng.randrange(8)), "I": float(rng.randrange(2))}


@given(
    _exprs(),
    st.lists(st.tuples(st.sampled_from(ENDS), st.sampled_from(ENDS)), min_size=3, max_size=3),
    st.integers(0, 2**32),
)
def test_every_value_lies_in_the_interval(e: Expr, ends: list, seed: int) -> None:
    env = {n: (min(a, b), max(a, b)) for n, (a, b) in zip(LEAVES, ends, strict=True)}
    lo, hi = bounds(e, env)
    rng = random.Random(seed)
    for _ in range(20):
        try:
            v = _value(e, _point(env, rng))
        except (ArithmeticError, ValueError):
            continue
        if math.isnan(v):  # inf - inf or 0 inf in floats: no real value to check
            continue
        slack = 1e-9 * max(1.0, abs(v)) if math.isfinite(v) else 0.0
        assert lo - slack <= v <= hi + slack, (str(e), env, v)


@given(
    st.tuples(st.sampled_from(ENDS), st.sampled_from(ENDS)),
    st.tuples(st.sampled_from(ENDS), st.sampled_from(ENDS)),
    st.integers(1, 6),
    st.integers(0, 2**32),
)
def test_a_dot_product_of_any_length_lies_in_the_interval(a, b, n: int, seed: int) -> None:
    env = {"a": (min(a), max(a)), "b": (min(b), max(b))}
    lo, hi = bounds(Binary(".", x("a"), x("b")), env)
    rng = random.Random(seed)
    points = [_point(env, rng) for _ in range(n)]
    v = sum(p["a"] * p["b"] for p in points)
    assert lo <= v <= hi, (env, n, v)
