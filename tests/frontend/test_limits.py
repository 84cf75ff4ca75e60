"""How large a spec may grow once inlined (`mixc.frontend.limits`): sizes found without inlining,
and specs past the limit refused quickly, at the part that is too large."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings

import mixc
from mixc.algebra.expand import inline
from mixc.check import random_specs
from mixc.driver import plan
from mixc.errors import SpecError, SpecSyntaxError
from mixc.frontend.ir import walk
from mixc.frontend.limits import MAX_INLINED_NODES, InlinedSizes, SpecSizeError
from mixc.frontend.verify import equation_order
from tests.mixers import answered_within
from tests.strategies import small_mixers

ROOT = Path(__file__).resolve().parents[2]
HEAD = "mixer m\nin q[K], k[K], v[V], a\nstate H[V, K]\n"
TAIL = "H_t = H_{t-1} + v_t k_t^T\ny_t = H_t q_t\n"


def inlined_sizes(mixer) -> tuple[InlinedSizes, dict[str, int]]:
    """The sizes of a verified mixer's lets and values, and of each equation, as verify finds
    them."""
    sizes = InlinedSizes()
    for fn in mixer.lets:
        sizes.add_let(fn.name, fn.args, fn.body)
    found = {}
    for eq in equation_order(mixer):
        found[eq.target] = sizes.size(eq.value)
        if mixer.state(eq.target) is None:
            sizes.add_value(eq.target, found[eq.target])
    return sizes, found


def nodes(e) -> int:
    return sum(1 for _ in walk(e))


@pytest.mark.parametrize(
    "lets, value",
    [
        ("let f(x, y) = x + exp(x) * y\n", "f(a_t + a_t, f(a_t, 1)) H_{t-1}"),
        ("let f(x, y) = x\nlet g(x) = f(x, x) + f(1, x)\n", "g(g(a_t)) H_{t-1}"),
        ("let f(x) = 2\n", "f(a_t + a_t) H_{t-1}"),  # an argument it never uses
        ("c_t = exp(a_t) + a_t\nd_t = c_t * c_t\n", "d_t H_{t-1}"),
    ],
)
def test_sizes_are_those_of_the_inlined_tree(lets: str, value: str) -> None:
    spec = mixc.load_spec(text=HEAD + lets + f"H_t = {value} + v_t k_t^T\ny_t = H_t q_t\n")
    _, found = inlined_sizes(spec.mixer)
    for eq in spec.mixer.equations:
        assert found[eq.target] == nodes(inline(spec.mixer, eq.value)), eq


@given(small_mixers)
def test_sizes_of_any_mixer_that_verifies(mixer) -> None:
    try:
        mixc.verify(mixer)
    except SpecError:
        return
    _, found = inlined_sizes(mixer)
    for eq in mixer.equations:
        assert found[eq.target] == nodes(inline(mixer, eq.value))


def doubling(levels: int, call: str) -> str:
    lets = "let f1(x) = x\n" + "".join(
        f"let f{i}(x) = f{i - 1}(x) + f{i - 1}(x)\n" for i in range(2, levels + 1)
    )
    return HEAD + lets + call + TAIL


def refused(text: str) -> SpecSizeError:
    """The SpecSizeError load_spec raises, within the CPU time every hostile spec is answered in
    (`answered_within`)."""
    with answered_within(what="the refusal"), pytest.raises(SpecSizeError) as info:
        mixc.load_spec(text=text)
    return info.value


@pytest.mark.parametrize("called", [True, False], ids=["called", "never called"])
def test_a_doubling_let_chain_is_refused_where_it_passes_the_limit(called: bool) -> None:
    text = doubling(60, "z_t = f60(a_t)\n" if called else "")
    err = refused(text)
    assert err.span.line == 17  # let f14(x) = f13(x) + f13(x): 16,383 nodes
    assert err.message == (
        "f13(x) + f13(x) is too large to analyse: with its lets inlined it has 16,383 nodes "
        f"(the limit is {MAX_INLINED_NODES:,})"
    )
    assert "every call of a let copies its body" in err.hint


def test_doubling_values_are_refused() -> None:
    values = "c0_t = a_t\n" + "".join(f"c{i}_t = c{i - 1}_t + c{i - 1}_t\n" for i in range(1, 41))
    err = refused(HEAD + values + "H_t = c40_t H_{t-1} + v_t k_t^T\ny_t = H_t q_t\n")
    assert err.span.line == 17  # c13_t = c12_t + c12_t
    assert "with its lets and per-token values inlined it has 16,383 nodes" in err.message


def test_a_let_that_doubles_its_argument_nested_in_itself() -> None:
    text = HEAD + "let f(x) = x + x\nz_t = " + "f(" * 40 + "a_t" + ")" * 40 + "\n" + TAIL
    err = refused(text)
    assert err.message.startswith("f(f(f(f(f(f(f(f(f(f(f(f(f(a_t)))))))))))))")  # 2^13 + ...


def test_a_long_expression_without_lets_is_refused_as_long() -> None:
    leaves = ["p"] * 8192
    while len(leaves) > 1:
        leaves = [f"({x} + {y})" for x, y in zip(leaves[::2], leaves[1::2], strict=True)]
    err = refused(HEAD.replace("state", "param p\nstate") + f"z_t = {leaves[0]}\n" + TAIL)
    assert "is too large to analyse: it has 16,383 nodes" in err.message
    assert err.hint == "split the spec's work into fewer, shorter expressions"


def below_the_limit(text: str) -> None:
    _, found = inlined_sizes(mixc.load_spec(text=text).mixer)
    assert max(found.values()) < MAX_INLINED_NODES // 100, text


@pytest.mark.parametrize("path", sorted((ROOT / "specs").glob("*.mix")), ids=lambda p: p.stem)
def test_shipped_specs_are_far_below_the_limit(path: Path) -> None:
    below_the_limit(path.read_text(encoding="utf-8"))


@settings(max_examples=50)
@given(random_specs())
def test_random_specs_are_far_below_the_limit(text: str) -> None:
    below_the_limit(text)


def test_values_nest_as_deeply_as_they_are_inlined() -> None:
    # each value nests 100 levels around the one before; the analysis inlines all three
    values = "c0_t = a_t\n" + "".join(
        f"c{i}_t = " + "exp(" * 100 + f"c{i - 1}_t" + ")" * 100 + "\n" for i in range(1, 4)
    )
    text = HEAD + values + "H_t = c3_t H_{t-1} + v_t k_t^T\ny_t = H_t q_t\n"
    with pytest.raises(SpecSyntaxError) as info:
        plan(text=text)
    assert info.value.message == (
        "expression nested too deeply (more than 200 levels, with lets and per-token values "
        "inlined)"
    )
    assert info.value.span.line == 6  # c2_t, 201 levels with c1_t inlined
