"""The turn of a long sequence built from two tables (issue 31: `_turning_at`): an angle that is
a position times frequencies the same at every token (RoPE's pos_t theta) turns token
a + j s as e^(i a f) e^(i j s f), cos and sin of T / 64 + 64 float64 angles a frequency in
place of T. Checked against cos and sin of the float64 angles (the rule of functions.py) far
from position 0, and, through a layer whose output reads absolute positions (only the query
turned: RoPE's relative property would hide a turn off by a constant angle), against
RoFormer's rotation written out in tests/backends/test_positions.py."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

import mixc
from tests.backends.test_positions import (
    _rotated_at,
    causal_attention,
    ref_linear_attention_rope,
    rel,
    roformer_rotation,
)

SPECS = Path(__file__).parents[2] / "specs"
f64 = torch.float64
B, NH, K, V = 2, 2, 8, 6
#: Longer than a run of the tables (64 tokens) and not a whole number of them, nor of chunks.
T = 300
#: Each sequence and head from its own position, one of them far from 0.
STARTS = torch.tensor([[0.0, 3.0], [1e6, 7.0]], dtype=f64)


def _angles(start: torch.Tensor, length: int, freq: torch.Tensor) -> torch.Tensor:
    """The float64 angles (start + t) f, [B, T, NH, n], of the rule the tables stand for."""
    positions = start[:, None, :] + torch.arange(length, dtype=f64)[None, :, None]
    return positions[..., None] * freq


@pytest.mark.parametrize(
    ("dtype", "bound"),
    # float32: the product of two rounded tables (the rule's own rounding is 4.2e-8); float64:
    # two ulps of an angle near 10^6 (the rule rounds (a + j) f once, the tables a f and j f)
    [(torch.float32, 2e-7), (f64, 2.5e-10)],
)
def test_the_turn_from_tables_is_cos_and_sin_of_the_float64_angles(dtype, bound):
    m = mixc.load(SPECS / "linear_attention_rope.mix")
    x = torch.zeros(B, T, NH, K, dtype=dtype)
    pos, _ = m._positions(STARTS.to(dtype)[..., None, None], {"B": B, "T": T, "NH": NH}, None)
    theta = m._prepare(x, x, x, _sequence=True)[3]
    positions, freq = m._compact(pos), m._compact(theta, K // 2)
    assert m._position_step(positions, freq) == 1.0  # the tables are what is checked
    with torch.no_grad():
        turn = m._turning_at(positions, freq, K, dtype, pos, theta)
    angles = _angles(STARTS, T, 10000 ** (-2 * torch.arange(K // 2, dtype=f64) / K))
    assert turn.shape == (B, T, NH, K // 2)
    assert (turn.real.double() - angles.cos()).abs().max() < bound
    assert (turn.imag.double() - angles.sin()).abs().max() < bound
    # the check can fail: the angles of float32 positions near 10^6 are far off
    naive = _angles(STARTS.float().double(), T, torch.tensor(0.9, dtype=f64))
    assert (naive.float().double().cos() - naive.cos()).abs().max() > 1e-3


def _query_turned():
    """linear_attention_rope with the key left unturned: the output reads absolute positions."""
    text = (SPECS / "linear_attention_rope.mix").read_text(encoding="utf-8")
    return mixc.load(text=text.replace("rotate_interleaved(k_t, pos_t theta)^T", "k_t^T"))


def _reference(q, k, v, start):
    """RoFormer's rotation of the query only, from position `start`, then causal attention."""
    scores = torch.einsum("bthd,bshd->bhts", roformer_rotation(q.double(), start), k.double())
    return causal_attention(scores, v.double())


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (f64, 1e-9)])
def test_a_long_sequence_turned_from_tables_is_roformers_rotation(dtype, tolerance):
    """Chunked (chunk size 32: spans that do not start on a run of the tables) without and
    with autograd, against the reference per sequence and head, and q's, k's and v's
    gradients. float64: at position 10^6 the reference and the tables round the angle apart."""
    m = _query_turned()
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(B, T, NH, K, generator=g, dtype=f64).to(dtype) for _ in range(2))
    v = torch.randn(B, T, NH, V, generator=g, dtype=f64).to(dtype)
    dy = torch.randn(B, T, NH, V, generator=g, dtype=f64).to(dtype)
    state = (torch.zeros(B, NH, V, K, dtype=dtype), STARTS.to(dtype))
    with torch.no_grad():
        y, _ = m.chunk(q, k, v, initial_state=state, chunk_size=32)
    tracked = [x.clone().requires_grad_() for x in (q, k, v)]
    y_grad, _ = m.chunk(*tracked, initial_state=state, chunk_size=32)
    grads = torch.autograd.grad(y_grad, tracked, dy)
    for b in range(B):
        for h in range(NH):
            one = [x[b : b + 1, :, h : h + 1].double().requires_grad_() for x in (q, k, v)]
            want = _reference(*one, STARTS[b, h].item())
            wants = torch.autograd.grad(want, one, dy[b : b + 1, :, h : h + 1].double())
            assert rel(y[b : b + 1, :, h : h + 1], want) < tolerance, (b, h)
            assert rel(y_grad[b : b + 1, :, h : h + 1], want) < tolerance, (b, h)
            for got, ref in zip(grads, wants, strict=True):
                assert rel(got[b : b + 1, :, h : h + 1], ref) < tolerance, (b, h)


def test_packed_sequences_each_turn_from_their_own_first_token():
    """With cu_seqlens the positions restart at each sequence (no one step for all tokens): the
    turn is computed token by token, each sequence against the reference from position 0."""
    m = _query_turned()
    g = torch.Generator().manual_seed(1)
    q, k = (torch.randn(1, T, NH, K, generator=g, dtype=f64) for _ in range(2))
    v = torch.randn(1, T, NH, V, generator=g, dtype=f64)
    bounds = [0, 120, T]
    with torch.no_grad():
        y, _ = m.chunk(q, k, v, cu_seqlens=torch.tensor(bounds), chunk_size=32)
    for lo, hi in itertools.pairwise(bounds):
        want = _reference(q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], 0.0)
        assert rel(y[:, lo:hi], want) < 1e-12, (lo, hi)


@pytest.mark.parametrize(
    ("angle", "positions"),
    [
        ("theta (pos_t + 3)", lambda t: t + 3.0),  # from tables, the positions moved
        ("(2 pos_t) theta", lambda t: 2.0 * t),  # from tables, a step of 2
        ("pos_t^2 theta", lambda t: t**2),  # no one step: each angle's cos and sin
    ],
)
def test_any_angle_that_is_a_function_of_the_position_times_frequencies(angle, positions):
    """The emitter hands _turning_at the factor that reads the position and the frequencies,
    whichever side each is on; the tables apply where that factor advances by one step."""
    text = (SPECS / "linear_attention_rope.mix").read_text(encoding="utf-8")
    text = text.replace("rotate_interleaved(k_t, pos_t theta)^T", "k_t^T")
    m = mixc.load(text=text.replace("pos_t theta)", f"{angle})"))
    g = torch.Generator().manual_seed(2)
    q, k = (torch.randn(1, T, NH, K, generator=g, dtype=f64) for _ in range(2))
    v = torch.randn(1, T, NH, V, generator=g, dtype=f64)
    with torch.no_grad():
        y, _ = m.chunk(q, k, v, chunk_size=32)
    turned = _rotated_at(q, positions(torch.arange(T, dtype=f64)))
    want = causal_attention(torch.einsum("bthd,bshd->bhts", turned, k), v)
    assert rel(y, want) < 1e-12


def test_positions_scaled_apart_in_each_head_take_no_one_step():
    """A position scale of each head's own ((h + 1) pos_t theta): the positions advance by a
    different step in each head, so there is no one step to build the tables from (each head
    once took the first head's step); each head against the reference at its own positions."""
    text = (SPECS / "linear_attention_rope.mix").read_text(encoding="utf-8")
    text = text.replace("rotate_interleaved(k_t, pos_t theta)^T", "k_t^T")
    text = text.replace("state H[V, K]", "param s = h + 1\nstate H[V, K]")
    m = mixc.load(text=text.replace("pos_t theta)", "(s pos_t) theta)"))
    g = torch.Generator().manual_seed(3)
    q, k = (torch.randn(1, T, NH, K, generator=g, dtype=f64) for _ in range(2))
    v = torch.randn(1, T, NH, V, generator=g, dtype=f64)
    with torch.no_grad():
        y, _ = m.chunk(q, k, v, chunk_size=32)
    for h in range(NH):
        one = [x[:, :, h : h + 1] for x in (q, k, v)]
        turned = _rotated_at(one[0], (h + 1) * torch.arange(T, dtype=f64))
        want = causal_attention(torch.einsum("bthd,bshd->bhts", turned, one[1]), one[2])
        assert rel(y[:, :, h : h + 1], want) < 1e-12, h


def test_a_kept_turn_serves_only_the_calls_it_was_built_for():
    """_turning_at keeps each turn it builds from tables (_TurnTables) and reads it again only
    for the same length, first positions, frequencies and mode: each call against the
    reference, where a turn kept from another call would be far off; the limit is kept to."""
    m = _query_turned()
    kept, limit = m._TurnTables.kept, m._TurnTables.limit
    g = torch.Generator().manual_seed(4)
    q, k = (torch.randn(B, T, NH, K, generator=g, dtype=f64) for _ in range(2))
    v = torch.randn(B, T, NH, V, generator=g, dtype=f64)
    default = 10000 ** (-2 * torch.arange(K, dtype=f64) / K)

    def check(starts, scale=1.0, length=T):
        state = (torch.zeros(B, NH, V, K, dtype=f64), starts)
        with torch.no_grad():
            y, _ = m.chunk(
                *(x[:, :length] for x in (q, k, v)),
                theta=(scale * default).expand(NH, K),
                initial_state=state,
                chunk_size=32,
            )
        for b, h in itertools.product(range(B), range(NH)):
            one = [x[b : b + 1, :length, h : h + 1] for x in (q, k, v)]
            positions = scale * (starts[b, h] + torch.arange(length, dtype=f64))
            scores = torch.einsum("bthd,bshd->bhts", _rotated_at(one[0], positions), one[1])
            assert rel(y[b : b + 1, :, h : h + 1], causal_attention(scores, one[2])) < 1e-9

    try:
        kept.clear()
        check(STARTS)
        first = next(iter(kept.values()))
        check(STARTS)  # read again, not built again
        assert len(kept) == 1 and next(iter(kept.values())) is first
        for i, call in enumerate([(STARTS + 5,), (STARTS, 2.0), (STARTS, 1.0, T - 32)]):
            check(*call)  # other positions, frequencies, length: each a turn of its own
            assert len(kept) == 2 + i
        m._TurnTables.limit = 2 * first.untyped_storage().nbytes()
        check(STARTS + 7)  # the least recently used are dropped
        assert len(kept) == 2 and all(t is not first for t in kept.values())
        m._TurnTables.limit = 0
        check(STARTS)
        assert not kept
    finally:
        m._TurnTables.limit = limit
        kept.clear()


def test_a_turn_kept_in_inference_mode_is_not_read_under_autograd():
    """A tensor made in inference mode cannot be saved for a backward: the turn kept from a call
    in inference mode is not the one a later call under autograd reads (the quadratic form saves
    its turn for the backward), whose gradient is the reference's."""
    m = mixc.load(SPECS / "linear_attention_rope.mix")
    g = torch.Generator().manual_seed(5)
    q, k = (torch.randn(1, T, NH, K, generator=g, dtype=f64) for _ in range(2))
    v = torch.randn(1, T, NH, V, generator=g, dtype=f64)
    with torch.inference_mode():
        m.parallel(q, k, v)
    tracked = [x.clone().requires_grad_() for x in (q, k, v)]
    got = torch.autograd.grad(m.parallel(*tracked)[0].sum(), tracked)
    one = [x.clone().requires_grad_() for x in (q, k, v)]
    wants = torch.autograd.grad(ref_linear_attention_rope(*one).sum(), one)
    for grad, want in zip(got, wants, strict=True):
        assert rel(grad, want) < 1e-12
