"""Constants no module can compute are refused where they are written: division by zero,
overflow, a negative base to a fractional power, a function outside its domain, a literal
beyond float64, and the same made by simplifying (`x / (a_t - a_t)`). Constants that are fine,
however extreme, still compile."""

from __future__ import annotations

import pytest

import mixc
from mixc.errors import SpecAnalysisError, SpecError, SpecSyntaxError
from mixc.frontend.constants import FLOATS, Constants, Folder, constant
from mixc.frontend.ir import Binary, Call, Identity, Name, Number, Timed, Transpose
from mixc.frontend.parser import parse

HEAD = "mixer m\nin q[K], k[K], v[V], a\nstate H[V, K]\n"  # lines 1-3
WRITE = " + v_t k_t^T\n"
OUT = "y_t = H_t q_t\n"


def error_of(text: str) -> SpecError:
    """The error `mixc.driver.plan` (what check, explain and compile share) raises."""
    from mixc.driver import plan

    with pytest.raises(SpecError) as info:
        plan(text=text)
    return info.value


@pytest.mark.parametrize(
    "update, message, column",
    [
        ("H_{t-1} / 0", "H_{t-1} / 0 divides by zero", 7),
        ("H_{t-1} / (1 - 1)", "H_{t-1} / (1 - 1) divides by zero", 7),
        ("H_{t-1} / exp(0 - 1000)", "H_{t-1} / exp(0 - 1000) divides by zero", 7),
        ("0^(0 - 1) H_{t-1}", "0^(0 - 1) divides by zero (0 to a negative power)", 7),
        ("2^1024 H_{t-1}", "2^1024 is not finite: it is inf in float64", 7),
        ("(1e308 * 10) H_{t-1}", "1e+308 * 10 is not finite: it is inf in float64", 8),
        ("exp(1000) H_{t-1}", "exp(1000) is not finite: it is inf in float64", 7),
        ("log(0) H_{t-1}", "log(0) is not finite: it is -inf in float64", 7),
        (
            "(0 - 1)^0.5 H_{t-1}",
            "(0 - 1)^0.5 is not a real number: a negative base to a fractional power",
            7,
        ),
        (
            "sqrt(0 - 2) H_{t-1}",
            "sqrt(0 - 2) is not a real number: -2 is outside the domain of sqrt",
            7,
        ),
        ("a_t H_{t-1} + exp(1000)", "exp(1000) is not finite: it is inf in float64", 21),
    ],
)
def test_constants_without_a_value_are_refused_where_they_are(
    update: str, message: str, column: int
) -> None:
    err = error_of(HEAD + f"H_t = {update}" + WRITE + OUT)
    assert isinstance(err, SpecAnalysisError)
    assert err.message == message
    assert (err.span.line, err.span.column) == (4, column)
    assert "float64" in err.hint


def test_a_let_called_with_a_constant_it_cannot_take() -> None:
    text = HEAD + "let f(x) = 1 / x\nH_t = f(1 - 1) H_{t-1}" + WRITE + OUT
    err = error_of(text)
    assert err.message == "1 / x divides by zero"
    assert (err.span.line, err.span.column) == (4, 12)  # in the let's body
    assert err.hint.startswith("in the call f(1 - 1) at line 5;")  # and the call that passes 0


def test_a_let_that_divides_by_zero_whatever_it_is_given() -> None:
    err = error_of(HEAD + "let f(x) = x / 0\nH_t = H_{t-1}" + WRITE + OUT)
    assert err.message == "x / 0 divides by zero"
    assert err.hint.startswith("constants are computed in float64")  # no call to blame


@pytest.mark.parametrize(
    "update, written",
    [
        ("H_{t-1} / (a_t - a_t)", "1 / (a_t - a_t) divides by zero"),
        ("exp(log(a_t - a_t)) H_{t-1}", "log(a_t - a_t) is not finite: it is -inf in float64"),
        (
            "exp(1000 + a_t - a_t) H_{t-1}",
            "exp(1000 + a_t - a_t) is not finite: it is inf in float64",
        ),
    ],
)
def test_constants_made_by_simplifying_are_refused(update: str, written: str) -> None:
    err = error_of(HEAD + f"H_t = {update}" + WRITE + OUT)
    assert err.message == written
    assert err.span.line == 4
    assert "once simplified, whatever the inputs" in err.hint


def test_a_default_without_a_value() -> None:
    err = error_of(
        HEAD.replace("state", "param g = 2 / (3 - 3)\nstate") + "H_t = g H_{t-1}" + WRITE + OUT
    )
    assert err.message == "2 / (3 - 3) divides by zero"
    assert err.span.line == 3


@pytest.mark.parametrize("digits", [309, 5000])
def test_a_literal_beyond_float64(digits: int) -> None:
    err = error_of(HEAD + "H_t = " + "9" * digits + " H_{t-1}" + WRITE + OUT)
    assert isinstance(err, SpecSyntaxError)
    assert err.message == f"number 99999999999999999999... ({digits:,} digits) is too large"


@pytest.mark.parametrize(
    "update",
    [
        "-0.5 H_{t-1}",  # a negative decay: no chunked form, but a module
        "exp(0 - 1000) H_{t-1}",  # underflows to 0: a reset
        "1e308 H_{t-1}",
        "2^1023 H_{t-1}",
        "(0 - 8)^3 H_{t-1}",  # a negative base to a whole power
        "0^0 H_{t-1}",
        "1" + "0" * 300 + " H_{t-1}",
        "H_{t-1} / a_t",  # not a constant: a_t may be 0, as the spec says
    ],
)
def test_extreme_constants_that_have_a_value_compile(update: str) -> None:
    mixc.compile_source(text=HEAD + f"H_t = {update}" + WRITE + OUT)


def test_folding_reads_let_arguments_and_leaves_the_rest() -> None:
    mixer = parse(HEAD + "let f(x, y) = x * y + 2\nH_t = f(3, a_t) H_{t-1}" + WRITE + OUT)
    constants = Constants(mixer.lets)
    f3 = mixer.update("H").value.left.left  # f(3, a_t)
    assert constants.check(f3) is None  # a_t is known only when the module runs
    assert constants.check(parse(HEAD + "z_t = exp(0) + 2^3\n" + OUT).equations[0].value) == 9.0


def test_constant_is_an_expression_of_numbers_only() -> None:
    assert constant(Transpose(Call("log", (Number("1"),)))) == 0.0
    assert constant(Binary("^", Number("-2"), Number("3"))) == -8.0
    assert constant(Binary("+", Number("1"), Name("h"))) is None
    assert constant(Binary("*", Number("0"), Timed("a", 0))) is None  # a tensor of zeros
    assert constant(Identity()) is None


class _Counting:
    """FLOATS, counting the operations it is asked to fold."""

    def __init__(self) -> None:
        self.binaries = 0

    def number(self, e):
        return FLOATS.number(e)

    def call(self, e, args):
        return FLOATS.call(e, args)

    def binary(self, e, left, right):
        self.binaries += 1
        return FLOATS.binary(e, left, right)


def test_a_folder_folds_each_node_once_however_often_it_is_asked() -> None:
    """The emitter asks at every level of an expression: each node is folded once, or a
    product of 40 sums takes seconds to compile; a node shared by inlining a let is folded
    once too, however many paths reach it."""
    counting = _Counting()
    folder = Folder(counting)
    e = Number("1")
    levels = [e]
    for _ in range(200):
        e = Binary("+", e, Number("1"))
        levels.append(e)
    for level in reversed(levels):
        folder.value(level)
    assert folder.value(e) == 201.0
    assert counting.binaries == 200
    shared = Number("1")  # f(f(...f(1))) with f(x) = x + x, inlined: 2^60 paths, 61 nodes
    for _ in range(60):
        shared = Binary("+", shared, shared)
    assert folder.value(shared) == 2.0**60
    assert counting.binaries == 260


def test_the_verifier_and_the_folder_agree_on_a_value() -> None:
    text = HEAD + "let f(x) = 2 x + 1\nz_t = f(3) / 7 + 2^2\nH_t = H_{t-1}" + WRITE + OUT
    mixer = parse(text)
    e = mixer.equations[0].value
    assert Constants(mixer.lets).check(e) == Folder(FLOATS, mixer.lets).value(e) == 5.0
