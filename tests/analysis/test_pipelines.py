"""Pipelines of states (issue 30): a state's update or the output reads other states through
their readouts. Acyclic reads run one chunked pass per level in dependency order, the readouts
of earlier passes per-token inputs of later ones; a cycle keeps recurrent and step and its
reason names the cycle. Every form is checked against the float64 oracle by the fuzzer."""

from __future__ import annotations

import inspect
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import mixc
from mixc.analysis.plan import analyze
from mixc.backends import BACKENDS
from mixc.check import fuzz
from mixc.errors import MixcError
from mixc.lowering import lower
from mixc.lowering.program import dump

ROOT = Path(__file__).resolve().parents[2]
PIPELINES = ["gsa", "precond_gdn", "stacked"]

# the stacked example with its states declared and written in the reverse order
REVERSED = """mixer reversed
in    q[K], k[K], v[V], u[K], q2[K]
state H2[V, K], H1[V, K]
H2_t = H2_{t-1} + (H1_t q_t) u_t^T
H1_t = H1_{t-1} + v_t k_t^T
y_t = H2_t q2_t
"""

# Titans-style momentum: M reads H_{t-1}, H reads M_t (contractive, so that it stays finite)
CYCLE = """mixer cycle
in    q[K], k[K], v[V], a, b
state H[V, K], M[V, K]
M_t = sigmoid(a_t) M_{t-1} + 0.5 (H_{t-1} l2norm(k_t)) l2norm(k_t)^T
H_t = sigmoid(b_t) H_{t-1} + 0.5 (M_t l2norm(q_t)) l2norm(k_t)^T + v_t l2norm(k_t)^T
y_t = H_t q_t
"""


def _plan(text: str):
    return analyze(mixc.load_spec(text=text))


def test_passes_run_in_dependency_order_whatever_the_declaration_order() -> None:
    plan = _plan(REVERSED)
    assert [g.states for g in plan.groups] == [("H1",), ("H2",)]
    program = lower(plan)
    assert [c.group for c in program.chunk.calls] == ["H1", "H2"]
    assert [c.reads for c in program.chunk.calls] == [(), ("_read_H1",)]
    assert [c.group for c in program.parallel.calls] == ["H1", "H2"]
    assert "after the passes it reads: _read_H1" in dump(program)
    report = fuzz(mixc.load_spec(text=REVERSED), examples=6, seed=3)
    assert report.ok, report.failure.summary()
    assert {"chunk", "parallel", "recurrent", "step"} <= set(report.worst)


def test_a_function_of_a_readout_is_the_query_of_a_later_pass() -> None:
    program = lower(analyze(mixc.load_spec(ROOT / "specs/gsa.mix")))
    ks, vs = program.chunk.calls
    assert (ks.group, vs.group) == ("Ks", "Vs")
    assert vs.reads == ("_read_Ks",)
    assert str(vs.queries[0].query) == "exp(_r0)"  # the softmax's normaliser is outside the pass


def test_a_state_read_entry_by_entry_feeds_a_later_key() -> None:
    program = lower(analyze(mixc.load_spec(ROOT / "specs/precond_gdn.mix")))
    a, h = program.chunk.calls
    assert (a.group, h.group, h.kernel) == ("A", "H", "chunk_dplr")
    assert h.reads == ("_read_A",)
    assert "_r0" in str(h.steps[0].key)


def test_a_cycle_keeps_recurrent_and_step_and_names_the_cycle() -> None:
    plan = _plan(CYCLE)
    assert plan.forms.chunk.kind == "sequential"
    text = plan.forms.chunk.text
    assert "cycle (H -> M -> H" in text
    lines = CYCLE.splitlines()
    at_h = lines[3].index("0.5 (H_{t-1}") + 1  # the read (with its scale), counted from 1
    at_m = lines[4].index("0.5 (M_t") + 1
    assert f"M reads H_{{t-1}} at line 4, column {at_h}" in text
    assert f"H reads M_t at line 5, column {at_m}" in text
    module = mixc.load(mixc.Source(CYCLE))
    assert module.FORMS == ("recurrent", "step")
    x = [torch.randn(1, 5, 2, 3) for _ in range(3)] + [torch.rand(1, 5, 2)] * 2
    with pytest.raises(MixcError, match=r"cycle \(H -> M -> H"):
        module.chunk(*x)
    report = fuzz(mixc.load_spec(text=CYCLE), examples=6, seed=4)
    assert report.ok, report.failure.summary()


def test_a_state_read_whole_by_another_runs_step_by_step() -> None:
    text = """mixer whole
in    q[K], k[K], v[V]
state H[V, K], G[V, K]
H_t = H_{t-1} + v_t k_t^T
G_t = G_{t-1} + H_{t-1}
y_t = G_t q_t
"""
    plan = _plan(text)
    assert "reads another state (H_{t-1} at line 5, column 17)" in plan.reason
    report = fuzz(mixc.load_spec(text=text), examples=4, seed=5)
    assert report.ok, report.failure.summary()


@pytest.mark.parametrize("name", PIPELINES)
def test_every_pipeline_has_a_summary(name: str) -> None:
    """GSA's slot state has a value-side gate (its summary acts from the left), precond_gdn's A
    is read entry by entry (a column: its summary acts entry by entry); tests/test_distributed.py
    checks what they compute."""
    plan = analyze(mixc.load_spec(ROOT / f"specs/{name}.mix"))
    assert plan.forms.chunk is None and plan.forms.summary is None
    module = mixc.load(ROOT / f"specs/{name}.mix")
    actions = {"gsa": "left", "precond_gdn": "elementwise", "stacked": "matmul"}
    assert module.SUMMARY_ACTIONS[module.STATES[0][0]] == actions[name]


def test_a_pipeline_of_summarised_classes_has_a_summary_given_its_earlier_states() -> None:
    """stacked's summary runs H1's pass from the given H1 (its readouts are H2's values), and
    takes initial_state for it; tests/test_distributed.py checks what it computes."""
    plan = analyze(mixc.load_spec(ROOT / "specs/stacked.mix"))
    assert plan.forms.summary is None
    module = mixc.load(ROOT / "specs/stacked.mix")
    assert module.SUMMARY_ORDER == ("H1", "H2")
    assert "initial_state" in inspect.signature(module.summary).parameters


def _inputs(module, T=6, NH=2, d=4):
    out = []
    for _, shape in module.INPUTS:
        out.append(torch.randn(1, T, NH, *([d] * len(shape))))
    return out


@pytest.mark.parametrize("name", ["stacked", "gsa"])
def test_a_pass_run_before_the_pass_it_reads_is_caught(tmp_path: Path, name: str) -> None:
    path = ROOT / f"specs/{name}.mix"
    program = lower(analyze(mixc.load_spec(path)))
    swapped = replace(program, chunk=replace(program.chunk, calls=program.chunk.calls[::-1]))
    module_file = tmp_path / f"{name}_swapped.py"
    module_file.write_text(BACKENDS["pytorch"].render(swapped), encoding="utf-8")
    report = fuzz(path, module_file, examples=3, shrink=False)
    assert not report.ok
    assert report.failure.form == "chunk"
    assert report.failure.quantity == "call"  # the later pass reads a readout not made yet


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", PIPELINES)
def test_pipelines_pass_a_wide_fuzz(name: str, dtype: str) -> None:
    report = fuzz(ROOT / f"specs/{name}.mix", examples=100, seed=7, dtype=dtype)
    assert report.ok, report.failure.summary()
