"""`mixc check` reports every independent error of a spec, each located, and none that follows
from another; `compile` and `explain` report the first, the same one. A spec with one error
reads as it always did."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given

import mixc
from mixc.errors import SpecError
from mixc.frontend.parser import parse
from mixc.frontend.verify import errors
from tests.strategies import small_mixers
from tests.test_agreement import _run

HEAD = "mixer m\nin q[K], k[K], v[V], a\nstate H[V, K]\n"  # lines 1-3
UPDATE = "H_t = H_{t-1} + v_t k_t^T\n"
OUT = "y_t = H_t q_t\n"


def found(text: str) -> list[tuple[int, str]]:
    """(line, message) of each error the verifier finds."""
    return [(e.span.line, e.message) for e in errors(parse(text))]


def test_two_bad_equations() -> None:
    assert found(HEAD + "H_t = H_{t-1} + v_t k_t\ny_t = H_t qq_t\n") == [
        (5, "undefined name qq"),  # names are checked before shapes, as verify does
        (4, "cannot multiply v_t [V] by k_t [K]"),
    ]


def test_a_name_error_and_a_shape_error_in_another_equation() -> None:
    text = HEAD + "z_t = nope_t\nw_t = k_t + v_t\n" + UPDATE + OUT
    assert found(text) == [(4, "undefined name nope"), (5, "cannot add k_t [K] and v_t [V]")]


def test_what_reads_a_bad_let_or_value_is_not_checked() -> None:
    text = (
        HEAD
        + "let f(x) = x + nope\n"  # 4: the error
        + "c_t = f(a_t)\n"  # 5: calls the bad let
        + "d_t = c_t k_t\n"  # 6: reads the bad value
        + "e_t = d_t . q_t q_t\n"  # 7: reads d, would be a shape error if d were known
        + "w_t = k_t + v_t\n"  # 8: independent
        + "u_t = c_t + nope2_t\n"  # 9: reads the bad value, but a wrong name is wrong anyway
        + UPDATE
        + OUT
    )
    assert found(text) == [
        (4, "undefined name nope"),
        (9, "undefined name nope2"),
        (8, "cannot add k_t [K] and v_t [V]"),
    ]


def test_an_error_in_the_declarations_stops_there() -> None:
    text = "mixer m\nin q[K], q[V]\nstate H[V, K]\n" + UPDATE + "y_t = H_t qq_t\n"
    assert found(text) == [(2, "q is already declared as an input")]


def test_a_cycle_stops_the_shapes_but_not_the_names() -> None:
    text = HEAD + "c_t = d_t\nd_t = c_t\nw_t = k_t + v_t\n" + UPDATE + "y_t = H_t qq_t\n"
    assert [m for _, m in found(text)] == [
        "undefined name qq",
        "c_t depends on itself at the same time step (through c -> d)",
    ]


@given(small_mixers)
def test_the_first_error_is_the_one_verify_raises(mixer) -> None:
    every = errors(mixer)
    try:
        mixc.verify(mixer)
    except SpecError as exc:
        assert every and str(every[0]) == str(exc)
    else:
        assert every == []


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "spec.mix"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_check_prints_every_error_and_compile_the_first(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + "H_t = H_{t-1} + v_t k_t\ny_t = H_t qq_t\n")
    code, out, err = _run("check", path)
    assert (code, out) == (1, "")
    first, second = err.split("\n\n")
    assert first.startswith(f"{path}:5:11: error: undefined name qq\n  5 | y_t = H_t qq_t\n")
    assert second.startswith(f"{path}:4:17: error: cannot multiply v_t [V] by k_t [K]\n")
    assert second.endswith(f"\n{path}: 2 errors\n")
    assert _run("compile", path)[2] == first + "\n"
    assert _run("explain", path)[2] == first + "\n"


def test_one_error_reads_as_before(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + UPDATE + "y_t = H_t qq_t\n")
    with pytest.raises(SpecError) as info:
        mixc.load_spec(path)
    assert _run("check", path) == (1, "", str(info.value) + "\n")


def test_an_unreadable_spec_is_one_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.mix"
    path.write_bytes("mixer m\nin café\n".encode("latin-1"))
    code, _, err = _run("check", str(path), str(tmp_path / "missing.mix"))
    assert code == 1
    assert err.count("error") == 1 and "not UTF-8" in err
    assert "no such spec file" in err
