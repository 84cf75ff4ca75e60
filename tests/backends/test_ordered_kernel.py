"""The scalar-decay kernel run backward in time (reverse=) and read before the token's update
(strict=) against a float64 loop written here, token by token: outputs, final states and every
gradient, over one span and over spans of two chunks; and a non-finite value reaches only the
outputs on its side, one token off for a strict read.

The loop: S_t = exp(g_t) S_{t-1} + k_t v_t^T (reverse: S_{t+1}, from the state after the last
token), o_t = q_t S_t, or q_t S_{t-1} (reverse: q_t S_{t+1}) for a strict read, q_t exp(g_t)
S_{t-1} for a strict read after the token's decay (decayed=, forward only)."""

from __future__ import annotations

import pytest
import torch

from mixc.backends.pytorch.kernels import common
from mixc.backends.pytorch.kernels.scalar_decay import chunk_scalar_decay, parallel_scalar_decay

ORDERS = [(False, True), (True, False), (True, True)]
IDS = ["strict", "reverse", "reverse-strict"]


def _loop(q, k, v, g, state, reverse, strict, decayed=False):
    """(o [B, NH, T, V], final state), one token at a time; `decayed` (strict): the output reads
    the state after the token's decay, before its write, q_t exp(g_t) S_{t-1}."""
    B, NH, T, K = q.shape
    S = q.new_zeros(B, NH, K, v.shape[-1]) if state is None else state
    out = [None] * T
    for t in range(T - 1, -1, -1) if reverse else range(T):
        decay = 1.0 if g is None else torch.exp(g[:, :, t])[..., None, None]
        new = decay * S + k[:, :, t, :, None] * v[:, :, t, None, :]
        read = decay * S if decayed else S if strict else new
        out[t] = torch.einsum("bhk,bhkv->bhv", q[:, :, t], read)
        S = new
    return torch.stack(out, 2), S


def _inputs(T, gated, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def draw(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    q, k, v = draw(2, 3, T, 4), draw(2, 3, T, 4), draw(2, 3, T, 5)
    g = -torch.rand(2, 3, T, generator=gen, dtype=torch.float64) if gated else None
    return q, k, v, g, draw(2, 3, 4, 5)


@pytest.mark.parametrize("spans", ["one", "of two chunks"])
@pytest.mark.parametrize("gated", [True, False], ids=["decay", "no decay"])
@pytest.mark.parametrize("reverse, strict", ORDERS, ids=IDS)
@pytest.mark.parametrize("T, chunk_size", [(37, 8), (5, 16), (48, 16)])
def test_the_kernel_agrees_with_the_loop(reverse, strict, gated, spans, T, chunk_size, monkeypatch):
    if spans != "one":  # spans visited from the last for reverse, their kept tensors in turn
        monkeypatch.setattr(common, "_span_tokens", lambda q, v, size: 2 * size)
    order = dict(reverse=reverse, strict=strict)
    _check_against_loop(_inputs(T, gated), chunk_size, order, (reverse, strict))


def _check_against_loop(inputs, chunk_size, order, loop_order, **decayed):
    """chunk_scalar_decay(**order) against the float64 loop: outputs, final states and
    gradients under autograd, then outputs and final states without it (the untracked path:
    in-place scans, outputs joined span by span)."""
    leaves = [x if x is None else x.requires_grad_() for x in inputs]
    q, k, v, g, state = leaves
    o, final = chunk_scalar_decay(q, k, v, g, state, chunk_size, **order, **decayed)
    o_ref, final_ref = _loop(q, k, v, g, state, *loop_order, **decayed)
    torch.testing.assert_close(o, o_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(final, final_ref, rtol=1e-12, atol=1e-12)
    gen = torch.Generator().manual_seed(1)
    w_o = torch.randn(o.shape, generator=gen, dtype=torch.float64)
    w_s = torch.randn(final.shape, generator=gen, dtype=torch.float64)
    wrt = [x for x in leaves if x is not None]
    got = torch.autograd.grad((o * w_o).sum() + (final * w_s).sum(), wrt)
    want = torch.autograd.grad((o_ref * w_o).sum() + (final_ref * w_s).sum(), wrt)
    for name, a, b in zip("qkvgS", got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=f"d{name}")
    with torch.no_grad():
        o, final = chunk_scalar_decay(q, k, v, g, state, chunk_size, **order, **decayed)
    torch.testing.assert_close(o, o_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(final, final_ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("reverse, strict", ORDERS, ids=IDS)
def test_the_quadratic_form_agrees_with_the_loop(reverse, strict):
    q, k, v, g, _ = _inputs(13, True)
    o = parallel_scalar_decay(q, k, v, g, reverse=reverse, strict=strict)
    torch.testing.assert_close(o, _loop(q, k, v, g, None, reverse, strict)[0], rtol=1e-12, atol=0)


@pytest.mark.parametrize("kind", ["nan", "inf"])
@pytest.mark.parametrize("reverse, strict", ORDERS, ids=IDS)
def test_a_non_finite_token_reaches_only_its_side(reverse, strict, kind):
    """A non-finite value, key or gate at token s: the outputs that do not read it are the same
    bits (a read before the update skips the token's own), the first that does is not finite."""
    q, k, v, g, state = _inputs(21, True)
    base = chunk_scalar_decay(q, k, v, g, state, 8, reverse=reverse, strict=strict)[0]
    s = 10
    first = s - strict if reverse else s + strict  # the nearest output that reads s
    same = slice(first + 1, None) if reverse else slice(0, first)
    for name in "vkg":
        x = {"v": v, "k": k, "g": g}[name].clone()
        x[:, :, s] = float(kind)
        args = {"v": v, "k": k, "g": g, name: x}
        o = chunk_scalar_decay(q, args["k"], args["v"], args["g"], state, 8, reverse=reverse,
                               strict=strict)[0]  # fmt: skip
        assert torch.equal(o[:, :, same], base[:, :, same]), name
        assert not torch.isfinite(o[:, :, first]).all(), name


@pytest.mark.parametrize("spans", ["one", "of two chunks"])
@pytest.mark.parametrize("gated", [True, False], ids=["decay", "no decay"])
@pytest.mark.parametrize("T, chunk_size", [(37, 8), (5, 16)])
def test_the_read_after_the_decay_agrees_with_the_loop(gated, spans, T, chunk_size, monkeypatch):
    """strict and decayed: outputs, final states and gradients, with autograd and without."""
    if spans != "one":
        monkeypatch.setattr(common, "_span_tokens", lambda q, v, size: 2 * size)
    order = dict(strict=True)
    _check_against_loop(_inputs(T, gated, seed=2), chunk_size, order, (False, True), decayed=True)


@pytest.mark.parametrize("kind", ["nan", "inf"])
def test_a_non_finite_token_after_the_decay_reaches_only_later_outputs(kind):
    """Read after the token's decay: a non-finite value or key at s first reaches the output
    at s + 1, a non-finite gate the output at s itself; every earlier output keeps its bits."""
    q, k, v, g, state = _inputs(21, True)
    base = chunk_scalar_decay(q, k, v, g, state, 8, strict=True, decayed=True)[0]
    s = 10
    for name, first in (("v", s + 1), ("k", s + 1), ("g", s)):
        x = {"v": v, "k": k, "g": g}[name].clone()
        x[:, :, s] = float(kind)
        args = {"v": v, "k": k, "g": g, name: x}
        o = chunk_scalar_decay(q, args["k"], args["v"], args["g"], state, 8, strict=True,
                               decayed=True)[0]  # fmt: skip
        assert torch.equal(o[:, :, :first], base[:, :, :first]), name
        assert not torch.isfinite(o[:, :, first]).all(), name


def test_the_read_after_the_decay_is_forward_and_strict_only():
    q, k, v, g, state = _inputs(5, True)
    with pytest.raises(ValueError, match="forward and strict"):
        chunk_scalar_decay(q, k, v, g, state, 8, decayed=True)


@pytest.mark.parametrize("spans", ["one", "of two chunks"])
@pytest.mark.parametrize("gated", [True, False], ids=["decay", "no decay"])
def test_the_scores_diagonal_is_each_token_s_dot_product(gated, spans, monkeypatch):
    """diagonal=True (a folded write's k_t . q_t): without autograd, q_t . k_t [B, NH, T] from
    the scores the chunks compute (T = 37 in chunks of 8, the last padded), within 1e-12 of
    the float64 sum of products, and the outputs and final state the loop's, as without it;
    where autograd records the call, None beside them (the caller computes the dot itself)."""
    if spans != "one":
        monkeypatch.setattr(common, "_span_tokens", lambda q, v, size: 2 * size)
    q, k, v, g, state = _inputs(37, gated, seed=4)
    o_ref, final_ref = _loop(q, k, v, g, state, False, True, decayed=True)
    order = dict(strict=True, decayed=True, diagonal=True)
    with torch.no_grad():
        o, final, dots = chunk_scalar_decay(q, k, v, g, state, 8, **order)
    torch.testing.assert_close(dots, (q * k).sum(-1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(o, o_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(final, final_ref, rtol=1e-12, atol=1e-12)
    o, final, dots = chunk_scalar_decay(q, k, v.requires_grad_(), g, state, 8, **order)
    assert dots is None and o.requires_grad
    torch.testing.assert_close(o, o_ref, rtol=1e-12, atol=1e-12)
