"""A plan is immutable in fact: lowering it, rendering its program and explaining it leave its
Typer and Expander as `analyze` left them, so that plans can be cached and read by several callers at
once (a cache miss is computed, not stored)."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

import pytest

from mixc.analysis.plan import analyze
from mixc.backends import BACKENDS
from mixc.frontend.ir import Binary, Number, Timed
from mixc.frontend.shapes import Symbol, Typer
from mixc.frontend.spec import load_spec
from mixc.lowering import lower
from mixc.tools.explain import explain
from tests.test_hostile_specs import sum_product

SPECS = Path(__file__).parents[2] / "specs"
SHIPPED = sorted(p.name for p in SPECS.glob("*.mix"))


def _state(obj: object) -> dict:
    """Every attribute of `obj`, and what each dict (a cache, the symbols) holds."""
    return {
        name: dict(value) if isinstance(value, dict | MappingProxyType) else value
        for name, value in vars(obj).items()
    }


@pytest.mark.parametrize("name", [*SHIPPED, "sum_product_40"])
def test_compiling_and_explaining_a_plan_leave_it_as_it_was(name: str) -> None:
    spec = load_spec(text=sum_product(40)) if name == "sum_product_40" else load_spec(SPECS / name)
    plan = analyze(spec)
    typer, expander = _state(plan.typer), _state(plan.expander)
    for name, backend in BACKENDS.items():
        program = lower(plan)
        if backend.supports(program) is None:
            backend.render(program)
        explain(spec, plan=plan, backend=name)
    assert _state(plan.typer) == typer
    assert _state(plan.expander) == expander


def test_a_frozen_typer_and_expander_answer_without_keeping_the_answer() -> None:
    plan = analyze(load_spec(SPECS / "deltanet.mix"))
    new = Binary("+", Timed("H", -1), Binary("*", Number("2"), Timed("H", -1)))
    typer, expander = _state(plan.typer), _state(plan.expander)
    assert plan.typer.shape_of(new) == ("V", "K")
    assert plan.expander.has_state(new) and plan.expander.depth(new) == 3
    assert _state(plan.typer) == typer and _state(plan.expander) == expander
    with pytest.raises(TypeError):
        plan.typer.symbols["x"] = Symbol("input", ("K", "1"))


def test_rendering_finds_the_shapes_of_the_plans_expressions_known(monkeypatch) -> None:
    """Freezing types what the plan holds first: the renderer asks at every level of a gate's
    log of some 3,000 nodes, and a shape computed anew at each level would cost the size of
    what is below it (twice the compile time of this spec)."""
    plan = analyze(load_spec(text=sum_product(40)))
    computed = 0
    shape = Typer._shape

    def counting(self, e, env):
        nonlocal computed
        computed += 1
        return shape(self, e, env)

    monkeypatch.setattr(Typer, "_shape", counting)
    BACKENDS["pytorch"].render(lower(plan))
    assert computed < 100
