"""Specs near the size limit whose work grows with their size: thousands of names, arguments or
misspelt names, a name of 63,000 characters. Every stage is linear (or near it) in a spec's size,
so `check`, `explain`, `compile` and `graph` each answer one of them, as a user runs them, within
the CPU-time bound of every answer: exit 0, or exit 1 with a one-line or located error, never a
traceback (issue 33, case 4). A graph too large to draw is refused in one line.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mixc.errors import SpecError
from mixc.frontend.parser import MAX_SPEC_BYTES
from mixc.frontend.spec import load_spec
from tests.mixers import answered_within
from tests.test_agreement import _run

HEAD = "mixer large\nin q[K], k[K], v[V], a, b{inputs}\nstate H[V, K]\n"
BODY = "H_t = a_t H_{t-1} + v_t k_t^T\ny_t = H_t q_t\n"


def _head(inputs: list[str] = ()) -> str:
    return HEAD.format(inputs="".join(f", {x}" for x in inputs))


def balanced(leaves: list[str], op: str) -> str:
    """`leaves` joined by `op` as a balanced tree: log2(n) deep, under the parser's depth limit."""
    while len(leaves) > 1:
        pairs = [f"({leaves[i]}{op}{leaves[i + 1]})" for i in range(0, len(leaves) - 1, 2)]
        leaves = pairs + ([leaves[-1]] if len(leaves) % 2 else [])
    return leaves[0]


def wide_let() -> str:
    """A let of 3,600 arguments, each read, called: sized once per argument, it was quadratic."""
    params = [f"x{i}" for i in range(3_600)]
    call = f"f({','.join('a_t' for _ in params)})"
    let = f"let f({','.join(params)})={balanced(params, '+')}\n"
    return _head() + let + BODY.replace("a_t H", f"{call} H")


def misspelt_names() -> str:
    """2,600 inputs and 2,600 equations each reading an undefined name: did-you-mean compared
    each with each."""
    n = 2_600
    inputs = [f"x{i}" for i in range(n)]
    return _head(inputs) + BODY + "".join(f"y{i}_t = z{i}_t\n" for i in range(n))


def unknown_functions() -> str:
    """1,900 lets and 1,900 calls of functions that are none of them."""
    n = 1_900
    lets = "".join(f"let f{i}(x)=x\n" for i in range(n))
    return _head() + lets + BODY + "".join(f"y{i}_t=g{i}(a_t)\n" for i in range(n))


def long_name() -> str:
    """An input named by 63,000 characters: every line of the module that holds it was scanned
    character by character, several times."""
    return _head(["n" * 63_000]) + BODY


def unused_inputs() -> str:
    """9,000 inputs nothing reads: the module's signatures hold them all."""
    return _head([f"u{i}" for i in range(9_000)]) + BODY


def sized_inputs() -> str:
    """4,700 inputs, each with a size of its own: the cost formulas were re-sorted per input."""
    return _head([f"u{i}[D{i}]" for i in range(4_700)]) + BODY


def many_outputs() -> str:
    """5,000 per-token values, none read: each was inlined with tables built anew."""
    return _head() + BODY + "".join(f"y{i}_t=a_t\n" for i in range(5_000))


LARGE: dict[str, Callable[[], str]] = {
    f.__name__: f
    for f in (
        wide_let,
        misspelt_names,
        unknown_functions,
        long_name,
        unused_inputs,
        sized_inputs,
        many_outputs,
    )
}


def _timed(*argv: str) -> tuple[int, str, str]:
    with answered_within(what=f"mixc {argv[0]}"):
        code, out, err = _run(*argv)
    assert code in (0, 1), (argv[0], code, err[-2000:])
    assert "Traceback" not in err
    return code, out, err


@pytest.mark.parametrize("name", sorted(LARGE))
def test_a_large_spec_is_answered_in_seconds(name: str, tmp_path: Path) -> None:
    text = LARGE[name]()
    assert MAX_SPEC_BYTES * 0.75 < len(text.encode()) <= MAX_SPEC_BYTES
    path = tmp_path / f"{name}.mix"
    path.write_text(text, encoding="utf-8")
    check = _timed("check", "-q", str(path))
    explain = _timed("explain", "--json", str(path))
    compiled = _timed("compile", str(path), "-o", str(tmp_path / "module.py"))
    assert check[0] == explain[0] == compiled[0], name
    for suffix in (".svg", ".png"):
        picture = tmp_path / f"graph{suffix}"
        code, _, err = _timed("graph", str(path), "-o", str(picture))
        if code == 0:
            assert picture.stat().st_size > 0
        elif check[0] == 0:  # a valid spec's graph is refused only for its size, in one line
            assert not picture.exists()
            assert err.count("\n") == 1 and "too many to draw" in err, err


def test_a_layer_of_a_large_spec_is_built_in_seconds(tmp_path: Path) -> None:
    from mixc.driver import clear_cache
    from mixc.nn import MixerLayer

    path = tmp_path / "wide_let.mix"
    path.write_text(LARGE["wide_let"](), encoding="utf-8")
    clear_cache()
    with answered_within(what="MixerLayer"):
        MixerLayer(path, 16, 2, chunk_size=8)


def test_a_layer_takes_time_linear_in_its_inputs(tmp_path: Path) -> None:
    """A layer projects each input from x, so its build is linear in their number (9,000
    inputs take about 5 s of CPU on the development machine, most of it in torch's Linear):
    four times the inputs take well under the 16 times a quadratic step would, and the larger
    build stays within the answer bound."""
    from mixc.driver import clear_cache
    from mixc.nn import MixerLayer

    def build(n: int) -> float:
        path = tmp_path / f"unused_{n}.mix"
        path.write_text(_head([f"u{i}" for i in range(n)]) + BODY, encoding="utf-8")
        clear_cache()
        start = time.process_time()
        MixerLayer(path, 16, 2, chunk_size=8)
        return time.process_time() - start

    build(10)  # imports and first-call work outside the timings
    small = build(750)
    with answered_within(what="MixerLayer"):
        large = build(3_000)
    assert large < 8 * small, (small, large)


@pytest.mark.parametrize("others", [0, 3_000])
def test_misspelt_names_still_get_suggestions(others: int) -> None:
    """The bounds on did-you-mean leave a suggestion where a misspelt name has one, among a
    few names or thousands."""
    text = _head(["gate", *(f"x{i}" for i in range(others))]) + BODY.replace("a_t H", "gaet_t H")
    with pytest.raises(SpecError, match=r"undefined name gaet[\s\S]*did you mean gate_t\?"):
        load_spec(text=text)


def test_a_thousand_defaults_compile_and_more_are_refused_located() -> None:
    """Each default is a keyword argument of the module's calls, which Python compiles in time
    quadratic in their number: past MAX_DEFAULTED_PARAMS the spec is refused, at the first
    parameter over."""
    from mixc.frontend.verify import MAX_DEFAULTED_PARAMS

    def spec(n: int) -> str:
        params = ",".join(f"p{i}=1" for i in range(n))
        return _head().replace("state", f"param {params}\nstate") + BODY

    load_spec(text=spec(MAX_DEFAULTED_PARAMS))
    with pytest.raises(SpecError, match="too many parameters with a default") as caught:
        load_spec(text=spec(MAX_DEFAULTED_PARAMS + 1))
    assert caught.value.span.line == 3
    assert (
        spec(MAX_DEFAULTED_PARAMS + 1)[:-1]
        .split("\n")[2][caught.value.span.column - 1 :]
        .startswith(f"p{MAX_DEFAULTED_PARAMS}=1")
    )
