"""Positions, rotations and the functions Transformer-VQ needs (issues 30 and 31): the shipped
specs against references written here from the papers and from torchscale's code, in plain
torch over whole sequences (nothing of mixc but the layout); the relative-position property;
mutants the references catch; angles far from position 0 in float32; the language's errors."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

import mixc
from mixc.errors import SpecError

SPECS = Path(__file__).parents[2] / "specs"
f64 = torch.float64
B, T, NH, K, V = 2, 37, 2, 8, 6


def spec_text(name: str) -> str:
    return (SPECS / f"{name}.mix").read_text(encoding="utf-8")


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative RMS error of a against the reference b."""
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def qkv(seed: int, dtype=f64, t: int = T):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, t, NH, K, generator=g, dtype=f64) for _ in range(2))
    v = torch.randn(B, t, NH, V, generator=g, dtype=f64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def from_position(start: float, dtype=f64):
    """An initial state: zero H, every sequence and head at position `start`."""
    return (torch.zeros(B, NH, V, K, dtype=dtype), torch.full((B, NH), start, dtype=dtype))


# ----------------------------------------------------------------------------- references


def rotate_every_two(x):
    """torchscale's: (x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...)."""
    return torch.stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2)


def rotate_half(x):
    """GPT-NeoX's: (x1, x2) -> (-x2, x1), halves of the last axis."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), -1)


def roformer_rotation(x, start=0, pairing="interleaved"):
    """RoFormer (arXiv 2104.09864, eq. 34): token m turned by m theta_i, theta_i = 10000^(-2i/d),
    written as x cos + rotate(x) sin with the angles duplicated per pair (as torchscale and
    GPT-NeoX write it). x: [B, T, NH, d] in float64."""
    d = x.shape[-1]
    positions = start + torch.arange(x.shape[1], dtype=f64)
    angles = positions[:, None] * 10000 ** (-torch.arange(d // 2, dtype=f64) * 2 / d)
    if pairing == "interleaved":
        angles, turn = angles.repeat_interleave(2, -1), rotate_every_two
    else:
        angles, turn = torch.cat((angles, angles), -1), rotate_half
    cos, sin = torch.cos(angles)[:, None], torch.sin(angles)[:, None]
    return x * cos + turn(x) * sin


def causal_attention(scores, v):
    """Scores [B, NH, T, S] masked to s <= t, then applied to v [B, S, NH, V]."""
    mask = torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
    return torch.einsum("bhts,bshv->bthv", scores * mask, v)


def ref_linear_attention_rope(q, k, v, start=0, pairing="interleaved"):
    qr, kr = (roformer_rotation(x.double(), start, pairing) for x in (q, k))
    return causal_attention(torch.einsum("bthd,bshd->bhts", qr, kr), v.double())


def ref_retnet_xpos(q, k, v):
    """Retention (parallel form, RetNet eq. 5) of torchscale's multiscale_retention with its XPOS
    (component/xpos_relative_position.py): angles from positions 0.., the scale zeta^(n/512) from
    positions centred on 0, as XPOS.forward computes them; the key scaled by d^-1/2."""
    t, d = q.shape[1], q.shape[-1]
    zeta = (torch.arange(0, d, 2, dtype=f64) + 0.4 * d) / (1.4 * d)
    low = -t // 2
    scale = zeta ** (torch.arange(low, low + t, dtype=f64)[:, None] / 512)  # [T, d/2]
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d // 2, dtype=f64) / (d // 2)))
    angles = torch.arange(t, dtype=f64)[:, None] * inv_freq
    sin, cos = torch.sin(angles), torch.cos(angles)

    def xpos(x, s):  # apply_rotary_pos_emb(x, sin, cos, scale)
        sin_s, cos_s = ((m * s).repeat_interleave(2, -1)[:, None] for m in (sin, cos))
        return x * cos_s + rotate_every_two(x) * sin_s

    qr, kr = xpos(q.double(), scale), xpos(k.double() * d**-0.5, 1 / scale)
    gamma = 1 - 2 ** (-5 - torch.arange(q.shape[2], dtype=f64))
    n = torch.arange(t, dtype=f64)
    decay = gamma[:, None, None] ** (n[:, None] - n[None, :]).clamp(min=0)  # [NH, T, S]
    return causal_attention(torch.einsum("bthd,bshd->bhts", qr, kr) * decay, v.double())


def ref_transformer_vq(q, k, v, C):
    """Transformer-VQ (arXiv 2309.16354): each key replaced by its nearest code of C [NH, S, d];
    causal softmax attention over the quantised keys, scaled by d^-1/2."""
    distances = ((k.double()[..., None, :] - C.double()) ** 2).sum(-1)  # [B, T, NH, S]
    codes = distances.argmin(-1)
    k_hat = torch.stack([C.double()[h][codes[:, :, h]] for h in range(C.shape[0])], 2)
    scores = torch.einsum("bthd,bshd->bhts", q.double(), k_hat) / math.sqrt(q.shape[-1])
    weights = torch.exp(scores) * torch.ones(scores.shape[-2:]).tril()
    return causal_attention(weights, v.double()) / weights.sum(-1).transpose(1, 2)[..., None]


# ----------------------------------------------------------------------------- the shipped specs


@pytest.mark.parametrize("form", ["chunk", "recurrent", "parallel"])
def test_linear_attention_rope_is_roformer(form):
    m = mixc.load(SPECS / "linear_attention_rope.mix")
    q, k, v = qkv(1)
    kw = {"chunk_size": 8} if form == "chunk" else {}
    y, _ = getattr(m, form)(q, k, v, **kw)
    assert rel(y, ref_linear_attention_rope(q, k, v)) < 1e-12


@pytest.mark.parametrize("form", ["chunk", "recurrent"])
def test_retnet_xpos_is_torchscales_retention_with_xpos(form):
    m = mixc.load(SPECS / "retnet_xpos.mix")
    q, k, v = qkv(2)
    y, _ = getattr(m, form)(q, k, v)
    assert rel(y, ref_retnet_xpos(q, k, v)) < 1e-12


def test_xpos_written_as_scales_on_q_and_k_is_the_decay_spelling():
    """zeta^(pos_t / 512) on the query and its inverse on the key, as xPos writes it, computes
    what the shipped spec's decay does (at short T, where the powers do not overflow)."""
    text = spec_text("retnet_xpos").replace(
        "H_t = gamma H_{t-1} diag(zeta^(1 / 512)) + v_t rotate_interleaved(k_t / sqrt(K), "
        "pos_t theta)^T\ny_t = H_t rotate_interleaved(q_t, pos_t theta)",
        "H_t = gamma H_{t-1} + v_t (zeta^(-pos_t / 512) * rotate_interleaved(k_t / sqrt(K), "
        "pos_t theta))^T\ny_t = H_t (zeta^(pos_t / 512) * rotate_interleaved(q_t, pos_t theta))",
    )
    assert "zeta^(-pos_t / 512)" in text
    scales = mixc.load(text=text)
    q, k, v = qkv(3)
    want = ref_retnet_xpos(q, k, v)
    for form in ("chunk", "recurrent"):
        assert rel(getattr(scales, form)(q, k, v)[0], want) < 1e-12


def test_transformer_vq_is_softmax_attention_over_quantised_keys():
    m = mixc.load(SPECS / "transformer_vq.mix")
    q, k, v = (x.requires_grad_() for x in qkv(4))
    C = torch.randn(NH, 5, K, generator=torch.Generator().manual_seed(5), dtype=f64)
    want = ref_transformer_vq(q, k, v, C)
    cot = torch.randn_like(want)
    grads_want = torch.autograd.grad((want * cot).sum(), (q, v))
    for form in ("chunk", "recurrent", "parallel"):
        y, _ = getattr(m, form)(q, k, v, C)
        assert rel(y, want) < 1e-12, form
        # the gradients the quantisation leaves alone (k's passes softmax's, see language.md)
        for got, ref in zip(torch.autograd.grad((y * cot).sum(), (q, v)), grads_want, strict=True):
            assert rel(got, ref) < 1e-10, form


def test_far_positions_stay_accurate_in_float32():
    """From position 10^6 the float32 forms stay within float32's error of the float64
    reference; a float32 product position * frequency (the mutant) is off by far more."""
    m = mixc.load(SPECS / "linear_attention_rope.mix")
    start = 1_000_000.0
    q, k, v = qkv(6, torch.float32)
    want = ref_linear_attention_rope(q, k, v, start)
    for form in ("chunk", "recurrent"):
        state = from_position(start, torch.float32)
        y, final = getattr(m, form)(q, k, v, initial_state=state, output_final_state=True)
        assert rel(y, want) < 1e-5, form
        assert final[1].eq(start + T).all()
    # the mutant: angles computed in float32, as a naive module would
    d = K
    positions = start + torch.arange(T, dtype=torch.float32)
    freq = (10000 ** (-torch.arange(d // 2, dtype=f64) * 2 / d)).float()
    naive = (positions[:, None] * freq).double()
    exact = (start + torch.arange(T, dtype=f64))[:, None] * freq.double()
    assert (naive - exact).abs().max() > 1e-3


# ----------------------------------------------------------------------------- properties


@pytest.mark.parametrize("name", ["linear_attention_rope", "retnet_xpos"])
def test_shifting_every_position_leaves_the_output_unchanged(name):
    m = mixc.load(SPECS / f"{name}.mix")
    q, k, v = qkv(7)
    y0, _ = m.chunk(q, k, v, initial_state=from_position(0.0), chunk_size=8)
    for shift in (1.0, 12345.0, 1e6):
        y, _ = m.chunk(q, k, v, initial_state=from_position(shift), chunk_size=8)
        assert rel(y, y0) < 1e-9, shift


def test_each_sequence_and_head_from_its_own_position_or_frequencies():
    """Positions that differ between sequences and heads (the angles of each computed apart),
    and frequencies that differ between heads, against RoFormer's rotation of each (b, h);
    the shared positions and frequencies (one angle for all) in test_far_positions_..."""
    m = mixc.load(SPECS / "linear_attention_rope.mix")
    q, k, v = qkv(9)
    starts = torch.tensor([[0.0, 3.0], [1e6, 0.0]], dtype=f64)
    state = (torch.zeros(B, NH, V, K, dtype=f64), starts)
    for form in ("chunk", "recurrent"):
        y, _ = getattr(m, form)(q, k, v, initial_state=state)
        for b in range(B):
            for h in range(NH):
                one = (x[b : b + 1, :, h : h + 1] for x in (q, k, v))
                want = ref_linear_attention_rope(*one, starts[b, h].item())
                assert rel(y[b : b + 1, :, h : h + 1], want) < 1e-12, (form, b, h)
    # head 1 turns twice as fast: RoFormer's rotation of 2 t theta is its rotation at 2t
    theta = 10000 ** (-2 * torch.arange(K, dtype=f64) / K) * torch.tensor([[1.0], [2.0]], dtype=f64)
    y, _ = m.chunk(q, k, v, theta=theta, chunk_size=8)
    t = torch.arange(T)
    for h, factor in ((0, 1), (1, 2)):
        qr, kr = (_rotated_at(x[:, :, h : h + 1], factor * t.double()) for x in (q, k))
        scores = torch.einsum("bthd,bshd->bhts", qr, kr)
        want = causal_attention(scores, v[:, :, h : h + 1].double())
        assert rel(y[:, :, h : h + 1], want) < 1e-12, h


def _rotated_at(x, positions):
    """RoFormer's rotation of x [B, T, NH, d] with token t at positions[t] (float64)."""
    d = x.shape[-1]
    angles = positions[:, None] * 10000 ** (-torch.arange(d // 2, dtype=f64) * 2 / d)
    angles = angles.repeat_interleave(2, -1)
    cos, sin = torch.cos(angles)[:, None], torch.sin(angles)[:, None]
    return x * cos + rotate_every_two(x) * sin


def test_a_rotation_of_the_query_alone_is_not_relative():
    """The property test can fail: with only the query turned, a shift changes the output."""
    text = spec_text("linear_attention_rope").replace(
        "rotate_interleaved(k_t, pos_t theta)^T", "k_t^T"
    )
    m = mixc.load(text=text)
    q, k, v = qkv(8)
    y0, _ = m.chunk(q, k, v, initial_state=from_position(0.0))
    y1, _ = m.chunk(q, k, v, initial_state=from_position(5.0))
    assert rel(y1, y0) > 0.1


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("rotate_interleaved(k_t, pos_t theta)^T", "k_t^T"),  # the rotation applied to q only
        ("rotate_interleaved(", "rotate("),  # the wrong pairing (half-split)
        ("pos_t theta)^T", "(pos_t + 1) theta)^T"),  # the key's angle one token off
    ],
    ids=["q-only", "wrong-pairing", "key-angle-shifted"],
)
def test_mutants_of_rope_are_caught_by_the_reference(old, new):
    text = spec_text("linear_attention_rope")
    assert old in text
    m = mixc.load(text=text.replace(old, new))
    q, k, v = qkv(9)
    assert rel(m.chunk(q, k, v)[0], ref_linear_attention_rope(q, k, v)) > 0.05


def test_half_split_pairing_is_gpt_neox():
    text = spec_text("linear_attention_rope").replace("rotate_interleaved(", "rotate(")
    m = mixc.load(text=text)
    q, k, v = qkv(10)
    want = ref_linear_attention_rope(q, k, v, pairing="half")
    assert rel(m.chunk(q, k, v)[0], want) < 1e-12


def test_a_leading_fraction_turns_and_the_rest_is_kept():
    """theta with P < K / 2 entries turns the leading 2P channels (Mamba-3's rope_fraction)."""
    text = (
        "mixer part\nin q[K], k[K], v[V], a[P]\nstate H[V, K]\n"
        "H_t = H_{t-1} + v_t rotate(k_t, a_t)^T\ny_t = H_t rotate(q_t, a_t)\n"
    )
    m = mixc.load(text=text)
    q, k, v = qkv(11)
    a = torch.randn(B, T, NH, 2, dtype=f64)

    def turned(x):  # channels (0, 2) and (1, 3) turn, 4.. stay
        c, s = torch.cos(a), torch.sin(a)
        x1, x2 = x[..., :2], x[..., 2:4]
        return torch.cat((x1 * c - x2 * s, x1 * s + x2 * c, x[..., 4:]), -1)

    want = causal_attention(torch.einsum("bthd,bshd->bhts", turned(q), turned(k)), v)
    for form in ("chunk", "recurrent"):
        assert rel(getattr(m, form)(q, k, v, a)[0], want) < 1e-12
    with pytest.raises(mixc.MixcError, match="rotate: 5 angles for a vector of 8 entries"):
        m.chunk(q, k, v, torch.zeros(B, T, NH, 5, dtype=f64))


HALVES = (
    "mixer halves\nin q[K], k[K], v[V], a[P]\nstate H[V, K]\n"
    "H_t = H_{t-1} + v_t rotate_halves(k_t, a_t)^T\ny_t = H_t rotate_halves(q_t, a_t)\n"
)


def _turned_halves(x, a):
    """x [..., d] with its channels i and i + d // 2 turned by a[..., i], i < a's size, by hand
    in float64, entry by entry; the rest kept."""
    out, half = x.clone(), x.shape[-1] // 2
    for i in range(a.shape[-1]):
        c, s = torch.cos(a[..., i]), torch.sin(a[..., i])
        out[..., i] = x[..., i] * c - x[..., i + half] * s
        out[..., i + half] = x[..., i] * s + x[..., i + half] * c
    return out


@pytest.mark.parametrize("pairs", [2, K // 2], ids=["a leading fraction", "every pair"])
def test_rotate_halves_pairs_the_two_halves_of_the_vector(pairs):
    """rotate_halves(x, theta) turns channels i and i + K / 2 by theta_i for i < P (Mamba-3
    MIMO's kernels: the first P pairs of the halves; with P = K / 2, what `rotate` does); the
    rest are kept. Every form computes the hand-written turn; with P < K / 2 the other pairings
    (a mutant of the spec each) do not."""
    m = mixc.load(text=HALVES)
    q, k, v = qkv(14)
    a = torch.randn(B, T, NH, pairs, dtype=f64)
    qk = torch.einsum("bthd,bshd->bhts", _turned_halves(q, a), _turned_halves(k, a))
    want = causal_attention(qk, v)
    for form in ("chunk", "recurrent", "parallel"):
        assert rel(getattr(m, form)(q, k, v, a)[0], want) < 1e-12
    state = None
    for t in range(T):
        y_t, state = m.step(q[:, t], k[:, t], v[:, t], a[:, t], state=state)
        assert rel(y_t, want[:, t]) < 1e-12
    split = mixc.load(text=HALVES.replace("rotate_halves(", "rotate("))
    interleaved = mixc.load(text=HALVES.replace("rotate_halves(", "rotate_interleaved("))
    assert rel(interleaved.chunk(q, k, v, a)[0], want) > 1e-2
    if pairs < K // 2:  # pairs (i, i + P): another function
        assert rel(split.chunk(q, k, v, a)[0], want) > 1e-2
    else:  # pairs (i, i + K / 2) both
        assert rel(split.chunk(q, k, v, a)[0], want) < 1e-12
    with pytest.raises(mixc.MixcError, match="rotate: 5 angles for a vector of 8 entries"):
        m.chunk(q, k, v, torch.zeros(B, T, NH, 5, dtype=f64))


def test_a_wrong_pairing_in_the_generated_helper_is_caught(tmp_path):
    """mixc fuzz catches _rotate_halves mutated to pair i with i + P (rotate's pairing)."""
    from mixc.check import fuzz

    spec = tmp_path / "halves.mix"
    spec.write_text(HALVES, encoding="utf-8")
    target = "return _turn_two_slices(x, turning, x.shape[-2] // 2)"
    source = mixc.compile_source(spec)
    assert source.count(target) == 1
    module = tmp_path / "halves_mutant.py"
    mutant = "return _turn_two_slices(x, turning, turning.shape[-1])"
    module.write_text(source.replace(target, mutant))
    report = fuzz(spec, module, examples=20, shrink=False)
    assert not report.ok and report.failure.kind == "numerical", report.failure.summary()


def test_sizes_are_numbers_in_expressions():
    text = (
        "mixer rms\nin q[K], k[K], v[V]\nstate H[V, K]\nH_t = H_{t-1} + v_t k_t^T\n"
        "o_t = H_t q_t / sqrt(K)\ny_t = o_t / sqrt(sum(o_t^2) / V + 1e-6)\n"
    )
    m = mixc.load(text=text)
    q, k, v = qkv(12)
    o = causal_attention(torch.einsum("bthd,bshd->bhts", q, k), v) / math.sqrt(K)
    want = o / torch.sqrt((o**2).mean(-1, keepdim=True) + 1e-6)
    assert rel(m.chunk(q, k, v)[0], want) < 1e-12


def test_stop_gradient_and_onehot_argmax_gradients():
    """stop_gradient passes no gradient; onehot_argmax's value is the one-hot, its gradient
    softmax's (straight-through)."""
    text = (
        "mixer st\nin q[K], k[K], v[V]\nstate H[V, K]\n"
        "H_t = H_{t-1} + v_t (onehot_argmax(k_t) + stop_gradient(k_t))^T\ny_t = H_t q_t\n"
    )
    m = mixc.load(text=text)
    q, k, v = qkv(13, t=1)
    k.requires_grad_()
    y, _ = m.recurrent(q, k, v)
    (grad,) = torch.autograd.grad(y.sum(), k)
    soft = torch.softmax(k.detach(), -1)
    hard = torch.nn.functional.one_hot(k.detach().argmax(-1), K).double()
    w = q * v.sum(-1, keepdim=True)  # d y.sum() / d z, z the key
    torch.testing.assert_close(y, torch.einsum("bthv,bthk->bthv", v, (hard + k.detach()) * q))
    want = soft * (w - (w * soft).sum(-1, keepdim=True))  # softmax's vector-Jacobian product
    torch.testing.assert_close(grad, want)


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("equation", "message"),
    [
        ("y_t = H_t q_t * pos", "pos is the token's position and needs the time index"),
        ("y_t = H_t q_t * pos_{t-1}", "the position is read at t only"),
        ("y_t = H_t q_t * idx", "idx (the channel index) can only be used in the default"),
        ("y_t = H_t rotate(q_t^T, q_t)", "rotate needs two column vectors"),
        ("y_t = H_t rotate(q_t, w4)", "rotate of a vector [8] by 5 angles"),
        ("y_t = H_t rotate_halves(q_t, w4)", "rotate_halves of a vector [8] by 5 angles"),
        ("y_t = softmax(q_t . q_t) * H_t q_t", "softmax needs a vector, got scalar"),
        ("y_t = H_t q_t * V_t", "V is a size and has no time index"),
    ],
)
def test_mistakes_get_a_located_message(equation, message):
    text = (
        "mixer bad\nin q[8], k[8], v[V]\nparam w4[5]\nstate H[V, 8]\n"
        f"H_t = H_{{t-1}} + v_t k_t^T\n{equation}\n"
    )
    with pytest.raises(SpecError, match=re.escape(message)) as err:
        mixc.load_spec(mixc.errors.Source(text, "bad.mix"))
    assert err.value.render().startswith("bad.mix:6:")


def test_idx_only_in_a_vector_default():
    text = "mixer bad\nin q[K], k[K], v[V]\nparam A[V, K] = idx\nstate H[V, K]\n"
    text += "H_t = H_{t-1} A + v_t k_t^T\ny_t = H_t q_t\n"
    with pytest.raises(SpecError, match="idx"):
        mixc.load_spec(mixc.errors.Source(text, "bad.mix"))


def _turn_two_pairs(x, a):
    """x's interleaved channel pairs (0, 1) and (2, 3) turned by the angles a[..., 2]; the
    channels from 4 on stay."""
    c, s = torch.cos(a), torch.sin(a)
    x1, x2 = x[..., 0:4:2], x[..., 1:4:2]
    pairs = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), -1).flatten(-2)
    return torch.cat((pairs, x[..., 4:]), -1)


def _split_turned_calls(m):
    """Counts the calls of the module's _Turned.chunks (the kernel turning a rotated input)."""
    calls = []
    split = m._Turned.chunks
    m._Turned.chunks = lambda *args: calls.append(1) or split(*args)
    return calls, split


@pytest.mark.parametrize("dtype", [f64, torch.float32])
def test_without_autograd_the_kernel_turns_q_and_k_as_it_splits_them(dtype):
    """Under no_grad the rotated q and k reach the kernel unturned with their turn (_Turned) and
    are turned as each span is split into chunks (_Turned.chunks): against RoFormer's rotation
    and torchscale's xPos, with T not a whole number of chunks, positions that differ between
    sequences and heads (one at 10^6), and a key shared by the heads."""
    m = mixc.load(SPECS / "linear_attention_rope.mix")
    calls, split = _split_turned_calls(m)
    q, k, v = qkv(12, dtype)
    k = k[:, :, :1]  # one key head for both query heads
    starts = torch.tensor([[0.0, 3.0], [1e6, 7.0]], dtype=dtype)
    state = (torch.zeros(B, NH, V, K, dtype=dtype), starts)
    with torch.no_grad():
        y, _ = m.chunk(q, k, v, initial_state=state, chunk_size=8)
    m._Turned.chunks = split
    assert len(calls) > 0
    tolerance = 1e-12 if dtype == f64 else 1e-5
    for b in range(B):
        for h in range(NH):
            one = (q[b : b + 1, :, h : h + 1], k[b : b + 1], v[b : b + 1, :, h : h + 1])
            want = ref_linear_attention_rope(*one, starts[b, h].item())
            assert rel(y[b : b + 1, :, h : h + 1], want) < tolerance, (b, h)
    m = mixc.load(SPECS / "retnet_xpos.mix")
    calls, split = _split_turned_calls(m)
    q, k, v = qkv(13, dtype)
    with torch.no_grad():
        y, _ = m.chunk(q, k, v, chunk_size=8)
    m._Turned.chunks = split
    assert len(calls) > 0
    assert rel(y, ref_retnet_xpos(q, k, v)) < tolerance


def test_without_autograd_a_leading_fraction_of_an_odd_width_turns():
    """An interleaved turn of the leading pairs of a key of odd width (its pairs no complex
    view of the chunk buffer) under no_grad, split by the kernel, against the turn written out."""
    text = (
        "mixer part\nin q[K], k[K], v[V], a[P]\nstate H[V, K]\n"
        "H_t = H_{t-1} + v_t rotate_interleaved(k_t, a_t)^T\ny_t = H_t rotate_interleaved(q_t, a_t)\n"
    )
    m = mixc.load(text=text)
    calls, split = _split_turned_calls(m)
    g = torch.Generator().manual_seed(14)
    q, k = (torch.randn(B, T, NH, 7, generator=g, dtype=f64) for _ in range(2))
    v = torch.randn(B, T, NH, V, generator=g, dtype=f64)
    a = torch.randn(B, T, NH, 2, generator=g, dtype=f64)

    want = causal_attention(
        torch.einsum("bthd,bshd->bhts", _turn_two_pairs(q, a), _turn_two_pairs(k, a)), v
    )
    with torch.no_grad():
        y, _ = m.chunk(q, k, v, a, chunk_size=8)
    m._Turned.chunks = split
    assert len(calls) > 0
    assert rel(y, want) < 1e-12


def test_under_autograd_the_kernel_turns_q_and_k_and_their_gradients_back():
    """With autograd the rotated q and k reach the kernel with their turn too (its own backward
    turns them again span by span and turns their gradients back by the conjugate turn): the
    gradients of q, k and v against those of RoFormer's rotation, from positions that differ
    between sequences and heads (one at 10^6), T not a whole number of chunks, a key shared by
    the heads. Frequencies that take a gradient are turned first instead, and get theirs."""
    m = mixc.load(SPECS / "linear_attention_rope.mix")
    calls, split = _split_turned_calls(m)
    q, k, v = qkv(15)
    k = k[:, :, :1]
    starts = torch.tensor([[0.0, 3.0], [1e6, 7.0]], dtype=f64)
    state = (torch.zeros(B, NH, V, K, dtype=f64), starts)
    inputs = [x.clone().requires_grad_() for x in (q, k, v)]
    y, _ = m.chunk(*inputs, initial_state=state, chunk_size=8)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(16), dtype=f64)
    got = torch.autograd.grad(y, inputs, dy)
    assert len(calls) > 0
    for b in range(B):
        for h in range(NH):
            one = [x[b : b + 1, :, h : h + 1].clone().requires_grad_() for x in (q, v)]
            key = k[b : b + 1].clone().requires_grad_()
            want = ref_linear_attention_rope(one[0], key, one[1], starts[b, h].item())
            dq, dk, dv = torch.autograd.grad(
                want, [one[0], key, one[1]], dy[b : b + 1, :, h : h + 1]
            )
            assert rel(got[0][b : b + 1, :, h : h + 1], dq) < 1e-12, (b, h)
            assert rel(got[2][b : b + 1, :, h : h + 1], dv) < 1e-12, (b, h)
            if h == 0:  # the shared key's gradient sums both heads'
                dk_sum = dk
            else:
                assert rel(got[1][b : b + 1], dk_sum + dk) < 1e-12, b
    calls.clear()
    theta = (10000 ** (-torch.arange(K, dtype=f64) * 2 / K)).expand(NH, K).clone()
    theta.requires_grad_()
    inputs = [x.clone().requires_grad_() for x in (q, k, v)]
    y, _ = m.chunk(*inputs, theta=theta, chunk_size=8)
    got = torch.autograd.grad(y, [*inputs, theta], dy)
    m._Turned.chunks = split
    assert not calls
    y_ref, _ = m.recurrent(*inputs, theta=theta)
    want = torch.autograd.grad(y_ref, [*inputs, theta], dy)
    for a, b in zip(got, want):
        assert rel(a, b) < 1e-12


def test_under_autograd_a_leading_fraction_of_an_odd_width_turns_back():
    """The gradients of an interleaved turn of the leading pairs of keys and queries of odd width
    (the pairs of their gradients no complex view), turned by the kernel, against the turn
    written out, through autograd."""
    text = (
        "mixer part\nin q[K], k[K], v[V], a[P]\nstate H[V, K]\n"
        "H_t = H_{t-1} + v_t rotate_interleaved(k_t, a_t)^T\ny_t = H_t rotate_interleaved(q_t, a_t)\n"
    )
    m = mixc.load(text=text)
    calls, split = _split_turned_calls(m)
    g = torch.Generator().manual_seed(17)
    q, k = (torch.randn(B, T, NH, 7, generator=g, dtype=f64, requires_grad=True) for _ in range(2))
    v = torch.randn(B, T, NH, V, generator=g, dtype=f64, requires_grad=True)
    a = torch.randn(B, T, NH, 2, generator=g, dtype=f64)

    want = causal_attention(
        torch.einsum("bthd,bshd->bhts", _turn_two_pairs(q, a), _turn_two_pairs(k, a)), v
    )
    y, _ = m.chunk(q, k, v, a, chunk_size=8)
    m._Turned.chunks = split
    assert len(calls) > 0
    dy = torch.randn(y.shape, generator=g, dtype=f64)
    for got, ref in zip(
        torch.autograd.grad(y, [q, k, v], dy), torch.autograd.grad(want, [q, k, v], dy)
    ):
        assert rel(got, ref) < 1e-12


def _turn_pairs(x, a):
    """x's interleaved channel pairs (2i, 2i + 1), i < n, turned by the angles a[..., n]; the
    channels from 2n on stay (plain torch, written out)."""
    n = a.shape[-1]
    c, s = torch.cos(a), torch.sin(a)
    x1, x2 = x[..., 0 : 2 * n : 2], x[..., 1 : 2 * n : 2]
    pairs = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), -1).flatten(-2)
    return torch.cat((pairs, x[..., 2 * n :]), -1)


def test_frequencies_the_same_in_every_channel_turn_every_pair():
    """A frequency given as a view that repeats one value along the channels (stride 0): the
    chunked form computes the angle once per distinct value along the leading axes only (the
    channels kept: the turn reads K / 2 of them), so every pair turns, as RoFormer's rotation
    at that frequency written out."""
    m = mixc.load(SPECS / "linear_attention_rope.mix")
    q, k, v = qkv(18)
    theta = torch.tensor(0.3, dtype=f64).expand(NH, K)
    angles = (0.3 * torch.arange(T, dtype=f64))[:, None, None].expand(T, NH, K // 2)
    qr, kr = (_turn_pairs(x, angles) for x in (q, k))
    want = causal_attention(torch.einsum("bthd,bshd->bhts", qr, kr), v)
    for form in ("chunk", "recurrent"):
        y, _ = getattr(m, form)(q, k, v, theta=theta)
        assert rel(y, want) < 1e-12, form


def test_an_angle_summed_over_its_channels_is_not_cut_to_the_pairs_read():
    """An angle with one entry a channel whose entries read every channel (a sum over them): the
    chunked form must compute it from whole vectors (the first K / 2 of a and of the angle are
    not the angle's first K / 2), against the turn written out."""
    text = (
        "mixer part\nin q[K], k[K], v[V], a[K]\nstate H[V, K]\n"
        "H_t = H_{t-1} + v_t rotate_interleaved(k_t, a_t + sum(a_t))^T\n"
        "y_t = H_t rotate_interleaved(q_t, a_t + sum(a_t))\n"
    )
    m = mixc.load(text=text)
    q, k, v = qkv(19)
    a = torch.randn(B, T, NH, K, generator=torch.Generator().manual_seed(20), dtype=f64)
    angles = (a + a.sum(-1, keepdim=True))[..., : K // 2]
    qr, kr = (_turn_pairs(x, angles) for x in (q, k))
    want = causal_attention(torch.einsum("bthd,bshd->bhts", qr, kr), v)
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            y, _ = m.chunk(q, k, v, a, chunk_size=8)
        assert rel(y, want) < 1e-12, grad
