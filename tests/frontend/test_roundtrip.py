"""Printing IR gives spec text that parses back to the same IR (syntax only: no verification)."""

import pytest
from hypothesis import given

from mixc import parse
from mixc.frontend.ir import (
    Binary,
    Call,
    Equation,
    Identity,
    Mixer,
    Name,
    Neg,
    Number,
    Timed,
    Transpose,
    walk,
)
from tests.strategies import exprs, mixers

a, b, T = Name("a"), Name("b"), Name("T")

# Spellings a printer gets wrong easily: an exponent that starts with the name T (a^T is a
# transpose), signs in exponents, unary minus inside products, numbers side by side.
TRICKY = [
    Binary("^", a, T),
    Binary("^", a, Binary("^", T, Number("2"))),
    Binary("^", a, Call("T", (b,))),
    Binary("^", a, Neg(Binary("^", b, T))),
    Binary("^", Binary("^", a, b), T),
    Binary("^", Neg(a), Transpose(b)),
    Binary("@", a, Neg(b)),
    Binary("@", Neg(a), Binary("@", b, a)),
    Binary("-", a, Neg(Neg(b))),
    Binary("@", Number("2"), Number("0.5")),
    Binary(".", Number("2"), Number("5")),
    Transpose(Transpose(Timed("T", -1))),
    Binary("/", Identity(), Binary("*", a, Binary("+", a, b))),
]


def _with(e) -> Mixer:
    return Mixer("m", equations=(Equation("y", e),))


@given(mixers)
def test_parse_of_print_is_identity(m: Mixer) -> None:
    assert parse(str(m)) == m


@pytest.mark.parametrize("e", TRICKY, ids=str)
def test_tricky_spellings_round_trip(e) -> None:
    assert parse(str(_with(e))) == _with(e)


@given(mixers)
def test_print_is_a_fixed_point(m: Mixer) -> None:
    text = str(m)
    assert str(parse(text)) == text


@given(exprs)
def test_expression_round_trip(e) -> None:
    assert parse(str(_with(e))).equations[0].value == e


def test_strategy_reaches_every_expression_node() -> None:
    seen: set[type] = set()

    @given(exprs)
    def collect(e) -> None:
        seen.update(type(n) for n in walk(e))

    collect()
    assert seen >= {Number, Name, Timed, Identity, Neg, Binary, Transpose, Call}
