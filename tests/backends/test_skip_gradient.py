"""A skip term's parameters (Mamba's D in y_t = H_t C_t + D x_t) get their gradients summed
over the tokens in float64 (`_add_skip`, issue 34): a float32 sum of many terms that cancel
keeps few of the digits of what is left, and how few depends on the order of the sum, which
eager torch and inductor choose differently. The inputs here make the float32 sum fail in the
orders these take: terms of magnitude 2^22 whose signs cancel exactly, each plus 1, so that
the exact gradient is the count of terms while a float32 partial sum past 2^24 drops ones."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mixc

ROOT = Path(__file__).resolve().parents[2]


def _cancelling(shape, generator) -> torch.Tensor:
    """±2^22 + 1, the signs of each head's [T, P] half +, half - (float32 holds every entry)."""
    B, T, NH, P = shape
    signs = torch.tensor([1.0, -1.0]).repeat_interleave(T * P // 2)
    signs = torch.stack([signs[torch.randperm(T * P, generator=generator)] for _ in range(NH)])
    return (2.0**22 * signs.view(NH, T, P).permute(1, 0, 2) + 1).expand(B, T, NH, P).contiguous()


@pytest.mark.parametrize("form", ["chunk", "parallel"])
def test_mamba2_skip_gradient_is_the_float64_sum(form):
    module = mixc.load(ROOT / "specs/mamba2.mix")
    g = torch.Generator().manual_seed(0)
    B, T, NH, P, N = 2, 96, 2, 8, 4
    x = _cancelling((B, T, NH, P), g)
    dt = torch.rand(B, T, NH, generator=g)
    Bk, C = (torch.randn(B, T, NH, N, generator=g) for _ in range(2))
    A = torch.rand(NH, generator=g)
    D = torch.randn(NH, generator=g).requires_grad_()
    y, _ = getattr(module, form)(x, dt, Bk, C, A, D)
    y.backward(torch.ones_like(y))
    exact = x.double().sum((0, 1, 3))  # dy/dD = sum of x: B T P, a count
    assert torch.equal(exact, torch.full((NH,), float(B * T * P), dtype=torch.float64))
    assert torch.equal(D.grad, exact.float())
    float32_sum = x.sum((0, 1, 3))  # what autograd's own sum gives: the ones dropped
    assert not torch.equal(float32_sum, exact.float())


def test_each_factor_of_a_skip_gets_the_float64_sum():
    """base + x D m (Mamba-3 MIMO's D mimo_x1 x_t): D's gradient the float64 sum of x m over
    every token and channel, m's of x D over the tokens; x's and base's as autograd's."""
    module = mixc.load(ROOT / "specs/mamba2.mix")
    g = torch.Generator().manual_seed(1)
    B, T, NH, P = 2, 64, 3, 8
    x = _cancelling((B, T, NH, P), g)[..., None].requires_grad_()
    base = torch.randn(B, T, NH, P, 1, generator=g).requires_grad_()
    D = torch.ones(NH, 1, 1).requires_grad_()
    m = torch.ones(NH, P, 1).requires_grad_()
    y = module._add_skip(base, x, D, m, value=-1)
    torch.testing.assert_close(y, base - x * (D * m), rtol=0, atol=0)
    y.backward(torch.ones_like(y))
    assert torch.equal(D.grad.flatten(), -torch.full((NH,), float(B * T * P)))
    assert torch.equal(m.grad, -x.double().sum((0, 1)).float())
    assert torch.equal(x.grad, -torch.ones_like(x))
    assert torch.equal(base.grad, torch.ones_like(base))
