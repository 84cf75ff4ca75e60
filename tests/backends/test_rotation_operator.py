"""The operator `rotate` that a rotation is under torch.compile (mixc/backends/pytorch/kernels/
rotations.py): several vectors turned by one angle, each with an optional addend (a bias), and
a backward computed directly (the output's gradient turned back, the angle's from the pairs'
cross products). Its gradients are checked against finite differences in float64
(torch.autograd.gradcheck: independent of the formulas), its values against the eager rotation,
and its fake implementations by torch.library.opcheck; for each of the three rotations, fewer
pairs than the vector holds (the rest kept), an angle for every entry (the first half read),
an angle broadcast over batch and heads, and a vector broadcast over the tokens."""

from __future__ import annotations

import linecache
import re

import pytest
import torch

import mixc

ROTATIONS = ["rotate", "rotate_halves", "rotate_interleaved"]
B, T, NH, D = 2, 5, 3, 8


def _module(rotation):
    """A generated module that carries the rotation's helpers and registers `rotate`."""
    text = (
        "mixer turned\nin q[K], k[K], v[V], a[P]\nparam kb[K]\nstate H[V, K]\n"
        f"H_t = H_{{t-1}} + v_t {rotation}(k_t + kb, a_t)^T\ny_t = H_t {rotation}(q_t, a_t)\n"
    )
    module = mixc.load(text=text)
    source = "".join(linecache.cache[module.__file__][2])
    found = re.search(r' = _register_rotations\("(mixc_[0-9a-f]{16})", globals\(\)\)', source)
    return module, getattr(torch.ops, found[1])


def _inputs(pairs, gen):
    """Two vectors [B, T, NH, D, 1] and [NH, D, 1] (one per head, broadcast over the tokens),
    a bias [NH, D, 1] of the first, and angles [1, T, 1, pairs, 1] (float64, as an angle from
    positions is), to be broadcast over batch and heads."""
    x1 = torch.randn(B, T, NH, D, 1, generator=gen, dtype=torch.float64)
    x2 = torch.randn(NH, D, 1, generator=gen, dtype=torch.float64)
    bias = torch.randn(NH, D, 1, generator=gen, dtype=torch.float64)
    theta = 3 * torch.randn(1, T, 1, pairs, 1, generator=gen, dtype=torch.float64)
    return [t.requires_grad_(True) for t in (x1, x2, bias, theta)]


def _call(ops, rotation, x1, x2, bias, theta):
    """Both vectors turned by one call of the operator, the first with its bias."""
    expanded = theta.expand(B, T, NH, *theta.shape[-2:])
    return ops.rotate(f"_{rotation}", [x1, x2], [bias], [0, -1], expanded, D, torch.float64)


@pytest.mark.parametrize("pairs", [3, D], ids=["some_pairs", "an_angle_per_entry"])
@pytest.mark.parametrize("rotation", ROTATIONS)
def test_gradients_match_finite_differences(rotation, pairs):
    module, ops = _module(rotation)
    x1, x2, bias, theta = _inputs(pairs, torch.Generator().manual_seed(0))
    assert torch.autograd.gradcheck(
        lambda *t: tuple(_call(ops, rotation, *t)), (x1, x2, bias, theta)
    )
    # an output without a gradient (None) and inputs that want none
    y1, _ = _call(ops, rotation, x1, x2.detach(), bias, theta)
    grads = torch.autograd.grad(y1.square().sum(), (x1, bias, theta))
    with torch.no_grad():
        turn = module._turning(theta, D, torch.float64, theta.expand(B, T, NH, pairs, 1))
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(True) for t in (x1, bias, theta)]
        turned = module._turning(leaves[2], D, torch.float64, leaves[2].expand(B, T, NH, pairs, 1))
        eager = getattr(module, f"_{rotation}")(leaves[0] + leaves[1], turned)
        expected = torch.autograd.grad(eager.square().sum(), leaves)
    assert torch.equal(y1.detach(), getattr(module, f"_{rotation}")(x1 + bias, turn).detach())
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("rotation", ROTATIONS)
def test_fake_implementations_agree_with_the_operator(rotation):
    _, ops = _module(rotation)
    x1, x2, bias, theta = _inputs(3, torch.Generator().manual_seed(1))
    expanded = theta.detach().expand(B, T, NH, 3, 1).requires_grad_(True)
    args = (f"_{rotation}", [x1, x2], [bias], [0, -1], expanded, D, torch.float64)
    torch.library.opcheck(ops.rotate, args)
