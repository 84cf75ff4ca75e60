"""Hostile specs: small texts that multiply the compiler's work, constants no module can compute,
and specs with several errors. `check`, `explain` and `compile`, run in-process as a user runs
them, each answer every one within seconds: exit 0 with a module that imports, or exit 1 with
located errors (file:line:col, the line and a caret), never a traceback.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import sys
from pathlib import Path

import pytest

import mixc
from mixc.frontend.parser import MAX_SPEC_BYTES
from tests.mixers import answered_within
from tests.test_agreement import _run

HEAD = "mixer hostile\nin q[K], k[K], v[V], a, b\nstate H[V, K]\n"
OUT = "y_t = H_t q_t\n"
WRITE = " + v_t k_t^T\n"


def update(decay: str, tail: str = OUT) -> str:
    """A spec whose update is `decay H_{t-1}` plus a write."""
    return HEAD + f"H_t = {decay}" + WRITE + tail


def balanced(leaf: str, n: int, op: str) -> str:
    """n copies of `leaf` joined by `op` as a balanced tree: a long expression that nests
    log2(n) deep, under the parser's depth limit."""
    xs = [leaf] * n
    while len(xs) > 1:
        pairs = [f"({xs[i]} {op} {xs[i + 1]})" for i in range(0, len(xs) - 1, 2)]
        xs = pairs + ([xs[-1]] if len(xs) % 2 else [])
    return xs[0]


def delta_chain(n: int) -> str:
    return update("H_{t-1}" + " (I - b_t k_t k_t^T)" * n)


def sum_product(n: int) -> str:
    return update("(a_t + b_t) " * n + "H_{t-1}")


def distinct_sums(n: int) -> str:
    names = ", ".join(f"a{i}, b{i}" for i in range(n))
    factors = " ".join(f"(a{i}_t + b{i}_t)" for i in range(n))
    return (
        f"mixer hostile\nin q[K], k[K], v[V], {names}\nstate H[V, K]\n"
        f"H_t = {factors} H_{{t-1}}" + WRITE + OUT
    )


def three_term_sums(n: int) -> str:
    names = ", ".join(f"a{i}, b{i}, c{i}" for i in range(n))
    factors = " ".join(f"(a{i}_t + b{i}_t + c{i}_t)" for i in range(n))
    return (
        f"mixer hostile\nin q[K], k[K], v[V], {names}\nstate H[V, K]\n"
        f"H_t = {factors} H_{{t-1}}" + WRITE + OUT
    )


def doubling_lets(n: int, call: str = "f{n}(a_t) H_{{t-1}}") -> str:
    lets = "let f1(x) = x\n" + "".join(
        f"let f{i}(x) = f{i - 1}(x) + f{i - 1}(x)\n" for i in range(2, n + 1)
    )
    return HEAD + lets + "H_t = " + call.format(n=n) + WRITE + OUT


def doubling_values(n: int) -> str:
    values = "".join(f"c{i}_t = c{i - 1}_t + c{i - 1}_t\n" for i in range(1, n + 1))
    return HEAD + "c0_t = a_t\n" + values + f"H_t = c{n}_t H_{{t-1}}" + WRITE + OUT


def nested_calls(n: int) -> str:
    """f(f(f(...))) with f doubling its argument: 2^n nodes from one let."""
    return (
        HEAD
        + "let f(x) = x + x\n"
        + "H_t = "
        + "f(" * n
        + "a_t"
        + ")" * n
        + " H_{t-1}"
        + WRITE
        + OUT
    )


def deep_values(n: int, depth: int) -> str:
    """Per-token values each nesting `depth` levels around the one before."""
    values = "".join(
        f"c{i}_t = " + "exp(" * depth + f"c{i - 1}_t" + ")" * depth + "\n" for i in range(1, n + 1)
    )
    return HEAD + "c0_t = a_t\n" + values + f"H_t = c{n}_t H_{{t-1}}" + WRITE + OUT


def many_states(n: int) -> str:
    states = ", ".join(f"S{i}[V, K]" for i in range(n))
    updates = "".join(
        f"S{i}_t = S{i}_{{t-1}} (I - b_t k_t k_t^T) + b_t v_t k_t^T\n" for i in range(n)
    )
    return (
        f"mixer hostile\nin q[K], k[K], v[V], b\nstate {states}\n{updates}"
        f"y_t = {' + '.join(f'S{i}_t q_t' for i in range(min(n, 150)))}\n"
    )


BLOWUP = {
    "delta_chain_14": delta_chain(14),
    "delta_chain_16": delta_chain(16),
    "delta_chain_40": delta_chain(40),
    "delta_chain_60": delta_chain(60),
    "sum_product_14": sum_product(14),
    "sum_product_40": sum_product(40),
    "distinct_sums_10": distinct_sums(10),
    "distinct_sums_40": distinct_sums(40),
    "doubling_lets_18": doubling_lets(18),
    "doubling_lets_60": doubling_lets(60),
    "doubling_lets_unused": doubling_lets(60, "a_t H_{{t-1}}"),
    "doubling_lets_elementwise": doubling_lets(16, "H_{{t-1}} * f{n}(v_t k_t^T)"),
    "doubling_values_18": doubling_values(18),
    "doubling_values_60": doubling_values(60),
    "nested_doubling_calls": nested_calls(40),
    "exp_doubling_lets": HEAD
    + "let f1(x) = exp(x)\n"
    + "".join(f"let f{i}(x) = exp(f{i - 1}(x)) * exp(f{i - 1}(x))\n" for i in range(2, 30))
    + "H_t = f29(a_t) H_{t-1}"
    + WRITE
    + OUT,
    "gates_that_are_sums": HEAD.replace("a, b", "a[V, K], b[V, K]")
    + "H_t = "
    + "(a_t + b_t) * (" * 12
    + "H_{t-1}"
    + ")" * 12
    + WRITE
    + OUT,
    "balanced_scalar_sum": update(f"({balanced('a_t', 7000, '+')}) H_{{t-1}}"),
    "balanced_scalar_product": update(f"({balanced('a_t', 7000, '*')}) H_{{t-1}}"),
    "balanced_key_sum": HEAD + f"H_t = H_{{t-1}} + v_t ({balanced('k_t', 7000, '+')})^T\n" + OUT,
    "balanced_readout": HEAD
    + "H_t = H_{t-1}"
    + WRITE
    + f"y_t = H_t {balanced('q_t', 7000, '+')}\n",
    "balanced_writes": HEAD + f"H_t = H_{{t-1}} + {balanced('v_t k_t^T', 4000, '+')}\n" + OUT,
    "exp_tower": update("exp(" * 195 + "a_t" + ")" * 195 + " H_{t-1}"),
    # scalars and numbers inside nested elementwise products, which canonical forms move out
    "scaled_elementwise_tower": HEAD
    + "H_t = H_{t-1} + v_t ("
    + "(2 a_t k_t * " * 150
    + "k_t"
    + ")" * 150
    + ")^T\n"
    + OUT,
    "constant_fraction_tower": update("(" + "(1 / " * 190 + "2" + ")" * 190 + ") H_{t-1}"),
    "exp_tower_in_key": HEAD
    + "H_t = H_{t-1} + v_t ("
    + "exp(" * 190
    + "k_t"
    + ")" * 190
    + ")^T\n"
    + OUT,
    "exp_tower_over_a_big_sum": update(
        "exp(" * 180 + balanced("a_t", 2000, "+") + ")" * 180 + " H_{t-1}"
    ),
    "deep_atom_in_many_terms": distinct_sums(6).replace(
        "H_t = ", "H_t = " + "exp(" * 150 + "a0_t" + ")" * 150 + " "
    ),
    "deep_call_around_many_terms": three_term_sums(4)
    .replace("H_t = ", "H_t = " + "exp(" * 150)
    .replace(" H_{t-1}", ")" * 150 + " H_{t-1}"),
    "deep_values": deep_values(3, 100),
    "many_deep_values": deep_values(30, 40),
    "many_states": many_states(250),
    "many_values": HEAD
    + "c0_t = a_t\n"
    + "".join(f"c{i}_t = c{i - 1}_t * b_t + a_t\n" for i in range(1, 1500))
    + "H_t = c1499_t H_{t-1}"
    + WRITE
    + OUT,
}

CONSTANTS = {
    "divide_state_by_zero": update("H_{t-1} / 0 + 0"),
    "let_one_over_x_at_zero": HEAD + "let f(x) = 1 / x\nH_t = f(0) H_{t-1}" + WRITE + OUT,
    "let_one_over_x_at_one_minus_one": HEAD
    + "let f(x) = 1 / x\nH_t = f(1 - 1) H_{t-1}"
    + WRITE
    + OUT,
    "let_log_of_negative": HEAD + "let g(x) = log(x)\nlet f(x) = g(x - 2)\n"
    "H_t = exp(f(1)) H_{t-1}" + WRITE + OUT,
    "digits_309": update("2" + "0" * 308 + " H_{t-1}"),
    "digits_5000": update("9" * 5000 + " H_{t-1}"),
    "overflowing_product": update("(1e308 * 10) H_{t-1}"),
    "overflowing_coefficient": HEAD + "H_t = H_{t-1} + 1e308 * 10 v_t k_t^T\n" + OUT,
    "two_to_the_1024": update("2^1024 H_{t-1}"),
    "ten_to_the_400": update("10^400 H_{t-1}"),
    "root_of_minus_one": update("(0 - 1)^0.5 H_{t-1}"),
    "cube_root_of_minus_eight": update("(0 - 8)^(1/3) H_{t-1}"),
    "exp_1000_write": HEAD + "H_t = H_{t-1} + exp(1000) v_t k_t^T\n" + OUT,
    "zero_to_minus_one": update("0^(0-1) H_{t-1}"),
    "log_zero": update("log(0) H_{t-1}"),
    "sqrt_negative": update("sqrt(0 - 1) H_{t-1}"),
    "divide_by_underflow": update("H_{t-1} / exp(0 - 1000)"),
    "divide_by_a_difference_of_equals": update("H_{t-1} / (a_t - a_t)"),
    "log_of_a_difference_of_equals": update("exp(log(a_t - a_t)) H_{t-1}"),
    "exp_of_a_sum_that_cancels": update("exp(1000 + a_t - a_t) H_{t-1}"),
    "coefficients_that_add_up": update("1e308 H_{t-1} + 1e308 H_{t-1}"),
    "coefficients_that_multiply": update("1e200 (1e200 H_{t-1})"),
    "coefficient_by_division": update("(1e300 H_{t-1}) / 1e-300"),
    "parameter_default_over_zero": HEAD.replace("state", "param g = 1 / 0\nstate")
    + "H_t = g H_{t-1}"
    + WRITE
    + OUT,
    "readout_over_zero": HEAD + "H_t = H_{t-1}" + WRITE + "y_t = H_t q_t / 0\n",
    # constants that are fine: a negative decay (no chunked form), a tiny one, a huge finite one
    "negative_decay": update("-0.5 H_{t-1}"),
    "underflowing_decay": update("exp(0 - 1000) H_{t-1}"),
    "largest_finite": HEAD + "H_t = H_{t-1} + 1e308 v_t k_t^T\n" + OUT,
}

SEVERAL_ERRORS = {
    "two_bad_equations": HEAD + "H_t = H_{t-1} + v_t k_t\ny_t = H_t qq_t\n",
    "unknown_name_and_shape_error": HEAD + "z_t = nope_t\nH_t = H_{t-1} + k_t v_t^T\n" + OUT,
    "bad_let_and_its_callers": HEAD
    + "let f(x) = x + undefined\nH_t = f(a_t) H_{t-1}"
    + WRITE
    + "y_t = H_t f(q_t)\nz_t = k_t k_t\n",
    "cycle_and_name_error": HEAD + "c_t = d_t\nd_t = c_t\nH_t = H_{t-1} + v_t k_t^T\n"
    "y_t = H_t q_t + e_t\n",
}

VALID = {
    "delta_chain_2": delta_chain(2),
    "sum_product_6": sum_product(6),
    "distinct_sums_6": distinct_sums(6),
    "doubling_lets_12": doubling_lets(12),
}

CORPUS = {**BLOWUP, **CONSTANTS, **SEVERAL_ERRORS, **VALID}
LOCATED = re.compile(r"^\S+:(\d+):(\d+): error: .+\n  \d+ \| .*\n  +\| *\^+$", re.MULTILINE)


def _timed(*argv: str) -> tuple[int, str, str]:
    with answered_within(what=f"mixc {argv[0]}"):
        return _run(*argv)


def _imports(path: Path) -> None:
    spec = importlib.util.spec_from_file_location(f"hostile_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    assert callable(module.recurrent)


def test_the_corpus_is_large_and_small() -> None:
    assert len(CORPUS) >= 40
    assert all(len(text.encode()) <= MAX_SPEC_BYTES for text in CORPUS.values())


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_hostile_spec_is_answered(name: str, tmp_path: Path) -> None:
    text = CORPUS[name]
    path = tmp_path / f"{name}.mix"
    path.write_text(text, encoding="utf-8")
    module = tmp_path / f"{name}.py"
    check = _timed("check", "-q", str(path))
    explain = _timed("explain", "--json", str(path))
    compiled = _timed("compile", str(path), "-o", str(module))
    codes = (check[0], explain[0], compiled[0])
    assert len(set(codes)) == 1 and codes[0] in (0, 1), codes
    for _, _, err in (check, explain, compiled):
        assert "Traceback" not in err
    if codes[0] == 0:
        _imports(module)
        return
    lines = text.split("\n")
    blocks = check[2].split("\n\n")
    assert len(blocks) >= 1
    for block in (*blocks, compiled[2], explain[2]):
        found = LOCATED.search(block)
        assert found, block
        line, column = int(found[1]), int(found[2])
        assert 1 <= line <= len(lines) and 1 <= column <= len(lines[line - 1]) + 1, block
    assert check[2].startswith(compiled[2])
    if name in SEVERAL_ERRORS:
        assert check[2].rstrip().endswith(f"{path}: {len(blocks)} errors"), check[2]
        assert len(blocks) >= 2


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_hostile_looking_specs_compile(name: str, tmp_path: Path) -> None:
    path = tmp_path / f"{name}.mix"
    path.write_text(VALID[name], encoding="utf-8")
    assert _run("check", "-q", str(path))[0] == 0


def test_a_deep_spec_is_answered_from_deep_in_a_callers_stack() -> None:
    """The compiler's recursion over a spec nested near the parser's limit needs about a
    thousand frames; it gets them above its caller's however deep that is and whatever limit
    the caller set (a test runner, a notebook), and the caller's limit is left as it was."""
    text = CORPUS["constant_fraction_tower"]

    def nested(n: int) -> str:
        return nested(n - 1) if n else mixc.compile_source(text=text)

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack()) + 400)
    try:
        source = nested(300)
        low = sys.getrecursionlimit()
    finally:
        sys.setrecursionlimit(limit)
    assert "def recurrent(" in source
    assert low == len(inspect.stack()) + 400
