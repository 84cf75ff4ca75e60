"""The operator `angle_sums` that a state of angles summed over time (Mamba-3's Th) is under
torch.compile (mixc/backends/pytorch/kernels/tokens.py): the float64 cumulative sum, the states
before and after each token's update and the final states, with a backward computed directly
(one reversed cumulative sum). Its gradients are checked against finite differences in float64
(torch.autograd.gradcheck: independent of the formula), its values against the eager sum, and
its fake implementations by torch.library.opcheck; whole rows and packed sequences (one of
them empty), angles broadcast over the state's entries."""

from __future__ import annotations

import linecache
import re
from pathlib import Path

import pytest
import torch

import mixc

SPEC = Path(__file__).resolve().parents[2] / "specs" / "mamba3.mix"
T, NH, R = 7, 3, 4
PACKED = torch.tensor([0, 3, 3, 7])  # three sequences, the second empty


def _module():
    """mamba3's generated module, which sums its angles and registers `angle_sums`."""
    module = mixc.load(SPEC)
    source = "".join(linecache.cache[module.__file__][2])
    found = re.search(r' = _register_angle_sums\("(mixc_[0-9a-f]{16})", globals\(\)\)', source)
    return module, getattr(torch.ops, found[1])


def _inputs(cu_seqlens, entries, gen):
    """Angles [B, T, NH, entries, 1] added at each token (entries 1: broadcast over the R
    entries of the state) and initial states [B or N, NH, R, 1], float64."""
    batch, states = (2, 2) if cu_seqlens is None else (1, len(cu_seqlens) - 1)
    v = torch.randn(batch, T, NH, entries, 1, generator=gen, dtype=torch.float64)
    initial = 10 * torch.randn(states, NH, R, 1, generator=gen, dtype=torch.float64)
    return v.requires_grad_(True), initial.requires_grad_(True)


@pytest.mark.parametrize("entries", [R, 1], ids=["per_entry", "broadcast"])
@pytest.mark.parametrize("cu_seqlens", [None, PACKED], ids=["rows", "packed"])
def test_gradients_match_finite_differences(cu_seqlens, entries):
    module, ops = _module()
    v, initial = _inputs(cu_seqlens, entries, torch.Generator().manual_seed(0))
    assert torch.autograd.gradcheck(lambda *t: ops.angle_sums(*t, cu_seqlens), (v, initial))
    got = ops.angle_sums(v, initial, cu_seqlens)
    with torch.no_grad():
        eager = module._summed_angles(v, initial, cu_seqlens)
    for g, e in zip(got, eager, strict=True):
        assert torch.equal(g.detach(), e)
    # outputs no gradient reaches (None) and an input that wants none
    before, _, _ = ops.angle_sums(v, initial.detach(), cu_seqlens)
    (d_v,) = torch.autograd.grad(before.square().sum(), (v,))
    leaf = v.detach().requires_grad_(True)
    with torch.enable_grad():
        want = module._summed_angles(leaf, initial.detach(), cu_seqlens)[0].square().sum()
    torch.testing.assert_close(d_v, torch.autograd.grad(want, leaf)[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cu_seqlens", [None, PACKED], ids=["rows", "packed"])
def test_fake_implementations_agree_with_the_operator(cu_seqlens):
    _, ops = _module()
    v, initial = _inputs(cu_seqlens, R, torch.Generator().manual_seed(1))
    torch.library.opcheck(ops.angle_sums, (v, initial, cu_seqlens))
