"""The expander and the canonicaliser on inputs that multiply their work: like terms collected as
they are produced, what does not collapse refused at a limit, and each shared or nested
expression worked on once."""

from __future__ import annotations

import sys

import pytest

import mixc
import mixc.algebra.expand as expand_module
from mixc.algebra.canon import Canon
from mixc.algebra.expand import Expander
from mixc.analysis.plan import analyze
from mixc.frontend import ir
from mixc.frontend.ir import walk
from mixc.frontend.limits import MAX_FACTORS, MAX_TERMS, SpecSizeError
from mixc.frontend.parser import MAX_DEPTH
from mixc.frontend.shapes import Typer

HEAD = "mixer m\nin q[K], k[K], v[V], a, b, b0, b1, b2, b3, b4, b5, b6\nstate H[V, K]\n"
OUT = "y_t = H_t q_t\n"


def spec_of(update: str, head: str = HEAD):
    return mixc.load_spec(text=head + f"H_t = {update} + v_t k_t^T\n" + OUT)


def expander(spec) -> Expander:
    mixer = spec.mixer
    return Expander(mixer, Typer(mixer, dict(spec.symbols)), {s.name for s in mixer.states})


def update_terms(spec):
    return expander(spec).expand(spec.mixer.update("H").value)


def refused(update: str, head: str = HEAD) -> SpecSizeError:
    with pytest.raises(SpecSizeError) as info:
        analyze(spec_of(update, head))
    return info.value


def test_a_long_chain_of_delta_factors_collapses_as_it_expands() -> None:
    # 2^30 products, but only 31 distinct terms: H (k k^T)^m b^m for m = 0..30
    terms = update_terms(spec_of("H_{t-1}" + " (I - b_t k_t k_t^T)" * 30))
    assert len(terms) == 32  # and the write
    assert sorted(len(t.chain) for t in terms) == [1, 2, *range(3, 62, 2)]


def test_powers_of_a_sum_collapse_as_they_expand() -> None:
    terms = update_terms(spec_of("(a_t + b_t) " * 40 + "H_{t-1}"))
    assert len(terms) == 42  # binomial: a^i b^(40-i), and the write
    assert max(t.coeff for t in terms) == 137846528820  # 40 choose 20


def test_a_product_of_distinct_sums_is_refused_at_the_product() -> None:
    factors = " ".join(f"(a_t + b{i}_t)" for i in range(7))
    err = refused(f"{factors} H_{{t-1}}")
    assert err.message.endswith(
        f"is too large to analyse: it expands into 128 terms (the limit is {MAX_TERMS})"
    )
    assert (err.span.line, err.span.column) == (4, 7)
    assert err.message.startswith("(a_t + b0_t) (a_t + b1_t) (a_t + b2_t)")


def test_a_term_with_too_many_factors_is_refused() -> None:
    err = refused("a_t " * 120 + "H_{t-1}")
    assert f"a term of it has {MAX_FACTORS + 1} factors (the limit is {MAX_FACTORS})" in err.message


def test_terms_that_nest_too_deeply_once_written_out_are_refused() -> None:
    deep = "exp(" * 150 + "a_t" + ")" * 150
    factors = " ".join(f"(a_t + b{i}_t)" for i in range(6))
    err = refused(f"{deep} {factors} H_{{t-1}}")
    assert f"expanded, it nests 222 levels deep (the limit is {MAX_DEPTH})" in err.message
    assert (err.span.line, err.span.column) == (4, 7)


def test_canonical_forms_that_nest_too_deeply_are_refused_at_the_update() -> None:
    # written, exp(...) is one factor 160 deep; canonical, its argument is a sum of 81 terms
    head = HEAD.replace("b6", ", ".join(f"c{i}" for i in range(12)))
    factors = " ".join(f"(c{i}_t + c{i + 4}_t + c{i + 8}_t)" for i in range(4))
    err = refused("exp(" * 150 + factors + ")" * 150 + " H_{t-1}", head)
    assert "in canonical form it nests" in err.message
    assert (err.span.line, err.span.column) == (4, 7)  # placed at the update, not at 1:1


def test_gates_that_are_sums_are_refused_where_they_distribute() -> None:
    head = HEAD.replace("a, b,", "a[V, K], b[V, K],")
    err = refused("(a_t + b_t) * (" * 7 + "H_{t-1}" + ")" * 7, head)
    assert "its gates distribute into 128 terms" in err.message


@pytest.mark.parametrize(
    "update, where",
    [
        ("1e308 H_{t-1} + 1e308 H_{t-1}", "1e+308 H_{t-1} + 1e+308 H_{t-1}"),
        ("1e200 (1e200 H_{t-1})", "1e+200 (1e+200 H_{t-1})"),
        ("(1e300 H_{t-1}) / 1e-300", "1e+300 H_{t-1} / 1e-300"),
    ],
)
def test_coefficients_beyond_float64_are_refused(update: str, where: str) -> None:
    err = refused(update)
    assert err.message == (
        f"{where} is too large: a constant factor of it is beyond float64 (about 1.8e308)"
    )


class Counting(Typer):
    """A Typer that counts the shapes it is asked for, by callers and by itself."""

    asked = 0

    def shape_of(self, e, env=None):
        Counting.asked += 1
        return super().shape_of(e, env)


def test_the_shape_of_every_node_of_a_tree_costs_the_tree() -> None:
    spec = spec_of("exp(" * 190 + "a_t" + ")" * 190 + " H_{t-1}")
    typer = Counting(spec.mixer, dict(spec.symbols))
    nodes = list(walk(spec.mixer.update("H").value))
    Counting.asked = 0
    # Counting's own frame at each of the 190 levels is not the compiler's: room for it, however
    # deep the test runner's own stack is (a pytest-xdist worker's is deeper)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(limit + 1000)
    try:
        for node in nodes:  # as code generation asks, each node of a tree in turn
            typer.shape_of(node)
    finally:
        sys.setrecursionlimit(limit)
    assert Counting.asked <= 3 * len(nodes)


def test_whether_each_node_of_a_tree_reads_a_state_costs_the_tree(monkeypatch) -> None:
    spec = spec_of("exp(" * 190 + "a_t" + ")" * 190 + " H_{t-1}")
    ex = expander(spec)
    nodes = list(walk(spec.mixer.update("H").value))
    visits = []
    children = ir.children

    def counted(e):
        visits.append(e)
        return children(e)

    monkeypatch.setattr(ir, "children", counted)  # what walk uses
    monkeypatch.setattr(expand_module, "children", counted)
    for node in nodes:  # as expanding asks, at each node on the way down
        ex.has_state(node)
    assert len(visits) <= 3 * len(nodes)


def test_a_deep_atom_shared_by_many_terms_is_canonicalised_once(monkeypatch) -> None:
    calls = []
    expand = Expander.expand

    def counted(self, e, transposed=False):
        calls.append(e)
        return expand(self, e, transposed)

    monkeypatch.setattr(Expander, "expand", counted)
    factors = " ".join(f"(a_t + b{i}_t)" for i in range(5))
    spec = spec_of("exp(" * 100 + "a_t" + ")" * 100 + f" {factors} H_{{t-1}}")
    ex = expander(spec)
    terms = ex.expand(spec.mixer.update("H").value)
    assert len(terms) == 33
    calls.clear()
    Canon(ex).combine(terms)
    assert len(calls) < 4 * 100  # once per level of the tower, not once per level and term
