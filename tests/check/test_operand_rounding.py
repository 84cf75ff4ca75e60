"""mixc fuzz's bfloat16 rule for kernels that round their operands (docs/fuzzing.md): a module
that declares `OPERANDS` gets bounds raised by what rounding those operands costs in float64, and
still fails on real bugs. A tensor-core kernel is emulated on the CPU here: the PyTorch module's
kernels with their declared arguments rounded to bfloat16 as they are called (the Triton
kernels themselves run under the interpreter in tests/backends/test_triton.py)."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch

from mixc.check import fuzz
from mixc.check.operands import (
    _rounding,
    declared_operands,
    rounded_operands,
    rounding_module,
)
from mixc.driver import compile_source
from mixc.frontend.spec import load_spec

SPECS_DIR = Path(__file__).resolve().parents[2] / "specs"
ROUNDED = {"chunk_delta": ("q", "k", "v"), "chunk_scalar_decay": ("q", "k", "v")}
ROUNDED["chunk_dplr"] = ("q", "k", "v", "a", "b")


def _emulated(name: str, declare: bool = True, mutate=(), rounded=True) -> types.ModuleType:
    """The PyTorch module of specs/name.mix, its kernels of ROUNDED rounding those arguments to
    bfloat16 (declared as OPERANDS unless not `declare`), the text first changed by `mutate`
    ((old, new) pairs, each found)."""
    text = compile_source(SPECS_DIR / f"{name}.mix", "pytorch")
    for old, new in mutate:
        assert old in text, old
        text = text.replace(old, new)
    module = types.ModuleType(f"emulated_{name}")
    exec(compile(text, f"<emulated {name}>", "exec"), module.__dict__)
    for kernel, names in ROUNDED.items():
        if rounded and f"_{kernel}" in module.__dict__:
            module.__dict__[f"_{kernel}"] = _rounding(module.__dict__[f"_{kernel}"], names)
    if declare:
        module.OPERANDS = {k: v for k, v in ROUNDED.items() if f"_{k}" in module.__dict__}
    return module


def _fuzz(name: str, module, examples: int = 4):
    spec = SPECS_DIR / f"{name}.mix"
    return fuzz(spec, module, examples=examples, dtype="bfloat16", shrink=False, max_T=40)


def test_a_module_declares_what_its_kernels_round():
    from mixc.driver import load

    assert rounded_operands(load(SPECS_DIR / "kda.mix")) == {}
    module = _emulated("kda")
    assert rounded_operands(module) == {"chunk_dplr": ("q", "k", "v", "a", "b")}


def test_the_model_rounds_only_the_declared_arguments():
    spec = load_spec(SPECS_DIR / "deltanet.mix")
    exact, rounded = rounding_module(spec, {"chunk_delta": ("k",)})
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 20, 1, 8, dtype=torch.float64) for _ in range(3))
    k = k / k.norm(dim=-1, keepdim=True)
    beta = torch.rand(1, 20, 1, dtype=torch.float64)
    y0, _ = exact.chunk(q, k, v, beta, chunk_size=16)
    y1, _ = rounded.chunk(q, k, v, beta, chunk_size=16)
    y2, _ = exact.chunk(q, k.bfloat16().double(), v, beta, chunk_size=16)
    assert (y0 - y1).abs().max() > 1e-6
    torch.testing.assert_close(y1, y2, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "name", ["mamba2", *(pytest.param(n, marks=pytest.mark.slow) for n in ("deltaproduct", "kda"))]
)
def test_rounded_computed_operands_pass_the_rule(name):
    report = _fuzz(name, _emulated(name))
    assert report.ok, report.failure.summary()


def test_undeclared_rounding_fails():
    """The same emulated kernels, their rounding not declared: the plain bfloat16 rule."""
    report = _fuzz("deltaproduct", _emulated("deltaproduct", declare=False), examples=10)
    assert not report.ok


MUTANTS = {
    "dropped gate": ("gated_deltanet", [("_seq_scalar(g, ", "_seq_scalar(0 * g, ")]),
    "key one token late": (
        "gated_deltanet",
        [("_k_H = _seq_vector(k, ", "_k_H = _seq_vector(_torch.roll(k, 1, 1), ")],
    ),
    "unit key not normalised": (
        "deltaproduct",
        [("_seq_vector(_l2norm(k1), ", "_seq_vector(0.9 * _l2norm(k1), ")],
    ),
    "write scale halved": ("mamba2", [("_seq_vector(dt * x, ", "_seq_vector(0.5 * dt * x, ")]),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_mutants_fail_with_rounded_operands(mutant):
    name, edits = MUTANTS[mutant]
    report = _fuzz(name, _emulated(name, mutate=edits))
    assert not report.ok
    assert report.failure.form.startswith(("chunk", "packed"))


@pytest.mark.parametrize(
    ("name", "declared"),
    [
        ("mamba2", '{"chunk_scalar_decay": ("q", "k", "v")}'),  # computed values dt x
        ("hydra", '{"chunk_scalar_decay": ("q", "k", "v")}'),  # two directions, computed
        ("retnet_xpos", '{"chunk_diagonal": ("q", "k", "v")}'),  # scaled, rotated q and k
        ("deltaproduct", None),  # the delta rule's and DPLR's kernels round their state
        ("kda", None),  # (STATE_ROUNDED): generated modules call them without operands=
        ("mamba3", '{"chunk_scalar_decay": ("q", "k", "v")}'),  # its angle sums call none
        ("linear_attention_normalized", None),  # a readout divides: y = H q / (z . q)
        ("gsa", None),  # a softmax over a state's readout
    ],
)
def test_triton_modules_declare_the_kernels_they_call_with_operands(name, declared):
    text = compile_source(SPECS_DIR / f"{name}.mix", "triton")
    assert (f"\nOPERANDS = {declared}\n" in text) == (declared is not None)
    assert ("operands=_out_dtype" in text) == (declared is not None)


def _modelled_costs(name: str, operands: dict, n: int = 3) -> list[tuple[str, float]]:
    """(quantity, what the model adds to its float32 bound) for n examples of specs/name.mix
    drawn as mixc fuzz --dtype bfloat16 draws them, the kernels `operands` rounding, without
    MODEL_CAP, where the model raises the bound above the plain rule's. The addition, not the
    whole bound: an ill-conditioned example's float32 bound can exceed the cap by itself (the
    gradient of retnet_xpos's positions, a cross product of the turned vectors that cancels,
    gets 0.16-0.24), and no cap on the model makes that quantity better checked."""
    from mixc.check import forms

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(forms, "MODEL_CAP", float("inf"))
        drawn = forms.drawn_operand_bounds(SPECS_DIR / f"{name}.mix", operands, n, max_T=60)
    return [(q, raised - fp32) for q, raised, plain, fp32 in drawn if raised > plain]


FAST_MODELLED = ["mamba2", "retnet_xpos"]


SHIPPED = {
    p.stem: declared_operands(compile_source(p, "triton")) for p in sorted(SPECS_DIR.glob("*.mix"))
}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=() if n in FAST_MODELLED else pytest.mark.slow)
        for n, declared in SHIPPED.items()
        if declared
    ],
)
def test_shipped_modelled_costs_stay_below_the_cap(name):
    """What the model adds to the bound of every quantity of a shipped spec, uncapped, stays
    below MODEL_CAP (a tenth of the quantity's scale, or of its near-zero floor): the rule never
    needs the cap. Fails if a spec's rounding comes to cost more."""
    from mixc.check.tolerance import MODEL_CAP

    costs = _modelled_costs(name, SHIPPED[name])
    assert all(cost < MODEL_CAP for _, cost in costs), costs


@pytest.mark.parametrize(
    ("name", "n"),
    [("linear_attention_normalized", 6), pytest.param("gsa", 16, marks=pytest.mark.slow)],
)
def test_divided_readouts_would_pass_the_cap(name, n):
    """Why a mixer that divides by a readout calls its kernels without operands=: rounding
    them would cost some gradient more than MODEL_CAP (dq, which cancels, 0 analytically at
    K = 1 for linear_attention_normalized), so the cap, not the model, would bound it."""
    from mixc.check.tolerance import MODEL_CAP

    operands = {"chunk_scalar_decay": ("q", "k", "v"), "chunk_diagonal": ("q", "k", "v")}
    costs = _modelled_costs(name, operands, n)
    assert max(c for _, c in costs) > MODEL_CAP


def _coarse(x):
    """x rounded to 5 significant bits (bfloat16 keeps 8), in its own dtype."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        return x
    m, e = torch.frexp(x.detach())
    return x + (torch.ldexp(torch.round(m * 32) / 32, e) - x.detach())


def test_a_kernel_that_rounds_more_than_it_declares_fails():
    """A mutant kernel: Mamba-2's chunk_scalar_decay rounds its q, k and v (dt x among them) to
    5 significant bits while it declares bfloat16's rounding; the rule, its bounds modelled on
    bfloat16, fails it (the same kernel rounding to bfloat16 passes,
    test_rounded_computed_operands_pass_the_rule)."""
    module = _emulated("mamba2", declare=True)
    exact = _emulated("mamba2", declare=False, rounded=False)._chunk_scalar_decay

    def coarse(q, k, v, *args, **kwargs):
        return exact(_coarse(q), _coarse(k), _coarse(v), *args, **kwargs)

    module._chunk_scalar_decay = coarse
    report = _fuzz("mamba2", module)
    assert not report.ok
    assert report.failure.form.startswith(("chunk", "packed"))
