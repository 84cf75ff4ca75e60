"""The value-side kernel without autograd: chunk_dplr_value's one-pass form (_value_fused, on
CPU, where every chunk's total decay is at least 2^-30) against its float64 loop and, through
the compiled gated Oja rule, against the float64 oracle by `mixc fuzz`; chunks that decay more,
and non-finite inputs, take the two passes."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch

import mixc
from mixc.backends.pytorch.kernels import dplr_value
from mixc.backends.pytorch.kernels.dplr_value import chunk_dplr_value
from mixc.check import fuzz
from tests.backends.test_kernels import dplr_value_inputs, oracle_dplr_value, rel_err

ROOT = Path(__file__).resolve().parents[2]


def _run(inputs, dtype, chunk):
    args = {n: x.to(dtype) for n, x in inputs.items()}
    with torch.no_grad():
        fused = dplr_value._value_fused(
            args["q"], args["k"], args["v"], args["a"], args.get("gk"),
            args.get("initial_state", torch.zeros(*args["q"].shape[:2], 8, 6, dtype=dtype)),
            chunk,
        )  # fmt: skip
        return fused, chunk_dplr_value(**args, chunk_size=chunk)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("gate", [True, False])
@pytest.mark.parametrize("init", [True, False])
@pytest.mark.parametrize("chunk", [4, 16])
@pytest.mark.parametrize("t_len", [1, 7, 100])
def test_the_one_pass_form_equals_the_loop(t_len, chunk, init, gate, dtype):
    inputs = dplr_value_inputs(t_len, gate=gate, init=init, seed=t_len)
    fused, (o, state) = _run(inputs, dtype, chunk)
    assert fused is not None  # these chunks decay little: the one pass ran
    want_o, want_state = oracle_dplr_value(
        inputs["q"], inputs["k"], inputs["v"], inputs["a"], inputs.get("gk"),
        inputs.get("initial_state"),
    )  # fmt: skip
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert rel_err(o, want_o) <= tol and rel_err(state, want_state) <= tol


def test_chunks_that_decay_more_take_the_two_passes():
    inputs = dplr_value_inputs(40, seed=3)
    inputs["gk"] = inputs["gk"] * 40 - 1  # some chunk decays below 2^-30
    inputs["a"] = -torch.exp(inputs["gk"]) * inputs["k"] * 0.5
    fused, (o, state) = _run(inputs, torch.float64, 16)
    assert fused is None
    want_o, want_state = oracle_dplr_value(
        inputs["q"], inputs["k"], inputs["v"], inputs["a"], inputs["gk"],
        inputs["initial_state"],
    )  # fmt: skip
    assert rel_err(o, want_o) <= 1e-12 and rel_err(state, want_state) <= 1e-12


def test_a_non_finite_input_gives_what_the_two_passes_give():
    """The same non-finite entries from the bad token on, the outputs before it untouched, as
    the guarded passes give (with autograd)."""
    inputs = {n: x.float() for n, x in dplr_value_inputs(30, seed=5).items()}
    inputs["v"][:, :, 17, 2] = float("inf")
    with torch.no_grad():
        o, state = chunk_dplr_value(**inputs, chunk_size=8)
    o2, state2 = chunk_dplr_value(**{n: x.requires_grad_(True) for n, x in inputs.items()})
    o2, state2 = o2.detach(), state2.detach()
    assert not o[:, :, 18:].isfinite().any() and o[:, :, :17].isfinite().all()
    for got, want in ((o, o2), (state, state2)):
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
    assert rel_err(o[:, :, :17], o2[:, :, :17].double()) <= 1e-6


class _Values(torch.autograd.Function):
    """The values of `b` with the gradients of `a`."""

    @staticmethod
    def forward(ctx, a, b):
        return b.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _no_grad_chunk(module):
    """The compiled module whose chunk computes its values without autograd (the one-pass form)
    and its gradients with it (the two passes), for the fuzzer, which asks for both."""
    proxy = types.ModuleType(f"{module.__name__}_no_grad")
    proxy.__dict__.update({n: x for n, x in vars(module).items() if not n.startswith("__")})

    def chunk(*args, **kwargs):
        y, final = module.chunk(*args, **kwargs)
        with torch.no_grad():
            y0, final0 = module.chunk(*args, **kwargs)
        if final is None:
            return _Values.apply(y, y0), None
        return _Values.apply(y, y0), _Values.apply(final, final0)

    proxy.chunk = chunk
    return proxy


@pytest.mark.parametrize(("dtype", "examples"), [("float32", 12), ("float64", 4)])
def test_the_compiled_gated_oja_rule_without_autograd_agrees_with_the_oracle(
    dtype, examples, monkeypatch
):
    module = mixc.load(ROOT / "specs/gated_oja.mix")
    ran = []
    one_pass = module._value_fused
    monkeypatch.setattr(module, "_value_fused", lambda *a: ran.append(1) or one_pass(*a))
    report = fuzz(
        ROOT / "specs/gated_oja.mix", _no_grad_chunk(module), examples=examples, dtype=dtype
    )
    assert report.ok, report.failure.summary()
    assert ran  # the one-pass form ran (packed sequences, initial states and all)
