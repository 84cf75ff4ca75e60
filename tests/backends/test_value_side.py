"""The value-side kernel without autograd: chunk_dplr_value's two passes as one (_value_span, on
CPU), against its float64 loop and, through the compiled gated Oja rule, against the float64
oracle by `mixc fuzz` (whose own calls take gradients, so run the two passes); rows past a
strong decay or growth take the binary split, non-finite inputs the guarded spans. Causality,
bit for bit, is tests/backends/test_causality.py's (gated_oja)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import mixc
from mixc.backends.pytorch.kernels import dplr_value
from mixc.backends.pytorch.kernels.dplr_value import chunk_dplr_value
from mixc.check import fuzz
from tests.backends.test_kernels import dplr_value_inputs, oracle_dplr_value, rel_err
from tests.mixers import no_grad_values

ROOT = Path(__file__).resolve().parents[2]


def _one_pass(inputs, dtype, chunk, monkeypatch):
    """chunk_dplr_value without autograd on `inputs` in `dtype`, checking that the one pass ran:
    (o, final state)."""
    ran = []
    span = dplr_value._value_span
    monkeypatch.setattr(dplr_value, "_value_span", lambda *a: ran.append(1) or span(*a))
    with torch.no_grad():
        out = chunk_dplr_value(**{n: x.to(dtype) for n, x in inputs.items()}, chunk_size=chunk)
    assert ran
    return out


def _oracle(inputs):
    names = ("q", "k", "v", "a", "gk", "initial_state")
    return oracle_dplr_value(*(inputs.get(n) for n in names))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("gate", [True, False])
@pytest.mark.parametrize("chunk", [4, 16])
@pytest.mark.parametrize("t_len", [1, 7, 100])
def test_the_one_pass_equals_the_loop(t_len, chunk, gate, dtype, monkeypatch):
    inputs = dplr_value_inputs(t_len, gate=gate, init=t_len != 7, seed=t_len)
    o, state = _one_pass(inputs, dtype, chunk, monkeypatch)
    want_o, want_state = _oracle(inputs)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert rel_err(o, want_o) <= tol and rel_err(state, want_state) <= tol


@pytest.mark.parametrize(("scale", "shift"), [(40.0, -1.0), (8.0, 0.0), (1.0, 0.8)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rows_past_a_strong_decay_or_growth_take_the_binary_split(scale, shift, dtype, monkeypatch):
    """Gates whose running decay leaves [2^-30, 2^30] inside a chunk (shift > 0: growth): the
    rows from there on take the binary split, those before it the direct form, both right."""
    inputs = dplr_value_inputs(100, seed=3)
    inputs["gk"] = inputs["gk"] * scale + shift
    inputs["a"] = -torch.exp(inputs["gk"]) * inputs["k"] * 0.5
    if shift > 0:
        inputs["q"] = inputs["q"] * 1e-8  # growth by e^(0.8 T): outputs kept within fp32
        inputs["v"] = inputs["v"] * 1e-8
        inputs["initial_state"] = inputs["initial_state"] * 1e-8
    chunk = 32
    g = torch.nn.functional.pad(inputs["gk"], (0, 0, 0, 28))  # 128 tokens: 4 whole chunks
    inside = dplr_value._value_range(g.reshape(*g.shape[:2], 4, chunk, -1).movedim(2, 0))[1]
    assert inside.any() and not inside.all()  # both kinds of rows, inside some chunk
    assert (inside[..., 0] & ~inside[..., -1]).any()
    o, state = _one_pass(inputs, dtype, chunk, monkeypatch)
    want_o, want_state = _oracle(inputs)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert rel_err(o, want_o) <= tol and rel_err(state, want_state) <= tol


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 1e30])
def test_a_non_finite_input_changes_no_earlier_output(value, monkeypatch):
    """From a non-finite token on (or one whose values overflow inside the chunk's products), the
    outputs are non-finite where the two passes' are (guarded, with autograd); before it, the
    same bits as without it."""
    inputs = {n: x.float() for n, x in dplr_value_inputs(30, seed=5).items()}
    clean, _ = _one_pass(inputs, torch.float32, 8, monkeypatch)
    inputs["v"][:, :, 17, 2] = value
    inputs["a"][:, :, 17, 3] = value
    o, state = _one_pass(inputs, torch.float32, 8, monkeypatch)
    o2, state2 = chunk_dplr_value(**{n: x.requires_grad_(True) for n, x in inputs.items()})
    o2, state2 = o2.detach(), state2.detach()
    assert torch.equal(o[:, :, :17], clean[:, :, :17])
    if not torch.isfinite(torch.tensor(value)):
        assert not o[:, :, 18:].isfinite().any()
    for got, want in ((o, o2), (state, state2)):
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())


def _fuzz_one_pass(module, examples, dtype, monkeypatch):
    ran = []
    span = module._value_span
    monkeypatch.setattr(module, "_value_span", lambda *a: ran.append(1) or span(*a))
    path = ROOT / "specs/gated_oja.mix"
    report = fuzz(path, no_grad_values(module), examples=examples, dtype=dtype, shrink=False)
    assert ran  # the one pass ran (packed sequences, initial states and all)
    return report


@pytest.mark.parametrize(("dtype", "examples"), [("float32", 12), ("float64", 4), ("bfloat16", 4)])
def test_the_compiled_gated_oja_rule_without_autograd_agrees_with_the_oracle(
    dtype, examples, monkeypatch
):
    module = mixc.load(ROOT / "specs/gated_oja.mix")
    report = _fuzz_one_pass(module, examples, dtype, monkeypatch)
    assert report.ok, report.failure.summary()


#: Edits of the one pass in the compiled module (target, replacement), each caught by the
#: fuzzer through the values of chunk without autograd.
ONE_PASS_MUTANTS = {
    "the pseudo-values without the state entering the chunk": (
        "keys = _bmm(w, states_in, add=writes)",
        "keys = writes",
    ),
    "the rank-one term's scores reading the token itself": (
        "scores = _bmm(rows, cols.transpose(-1, -2)).tril_(-1)",
        "scores = _bmm(rows, cols.transpose(-1, -2)).tril_()",
    ),
    "the outputs' pairs without the token itself": (
        "scores = _bmm(q_c, keys.transpose(-1, -2)).tril_()",
        "scores = _bmm(q_c, keys.transpose(-1, -2)).tril_(-1)",
    ),
    "the final state returned as S, not M = S^T": ("return o, final.mT", "return o, final"),
    "the state passed without the rank-one term": (
        "moves = _bmm(to_end, w)",
        "moves = _bmm(to_end, w) * 0",
    ),
}


@pytest.mark.parametrize("what", sorted(ONE_PASS_MUTANTS))
def test_the_fuzzer_catches_a_broken_one_pass(what, tmp_path, monkeypatch):
    target, replacement = ONE_PASS_MUTANTS[what]
    source = mixc.compile_source(ROOT / "specs/gated_oja.mix")
    assert source.count(target) == 1, f"the generated code changed: {target!r}"
    path = tmp_path / "gated_oja_mutant.py"
    path.write_text(source.replace(target, replacement))
    spec = importlib.util.spec_from_file_location("gated_oja_mutant", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    report = _fuzz_one_pass(module, 12, "float32", monkeypatch)
    assert not report.ok, f"{what}: survived"
    assert report.failure.form == "chunk", report.failure.summary()
