"""The Triton kernel of the diagonal-plus-low-rank class: S_t = (diag(exp(g_t)) + b_t a_t^T)
S_{t-1} + k_t v_t^T, o_t = q_t S_t, with a log-gate g_t per key channel (KDA, RWKV-7). The same
chunked form as the PyTorch kernel (docs/algorithms.md, "Diagonal plus low rank").

The forward is three launches, as flash-linear-attention splits its DPLR kernels, so that no
program holds more than a few tiles (registers on sm_90, tensor memory on sm_100):
_tl_dplr_fwd_scores, every chunk at once, makes each chunk's scores, T and decayed rows, key
columns a block at a time; _tl_dplr_fwd_states, one program per (batch, head, block of value
columns), walks the chunks in order with the state in registers and writes the state entering
each chunk and U; _tl_dplr_fwd_outputs, every chunk at once, makes the outputs. The backward is
two: _tl_dplr_bwd_states, one program per (batch, head, block of value columns), walks the
chunks back with the state's gradient in registers; _tl_dplr_bwd_inputs, one program per
(chunk, batch x head, block of key columns), makes the key-side gradients.

Forward, per chunk, with c the gates' running sum inside the chunk (per channel):
    qk, qb = [Q K], [Q B] (j <= r),  ak, ab = [A K]', [A B]' (j < r): the decayed scores
    T = (I - ab)^{-1}  (forward substitution),  Z = (A ⊙ exp(c_{r-1})) S + ak V,  U = T Z
    O = (Q ⊙ exp(c)) S + qk V + qb U
    S <- exp(c_C) ⊙ S + (K ⊙ exp(c_C - c))^T V + (B ⊙ exp(c_C - c))^T U
U holds the state's reads u_r = a_r^T S_{r-1}. Every decay is the exponential of a sum of gates
of one sign, each sum a scan of its own terms inside an aligned run of rows, never a difference
of running sums. A score's decay exp(c_r - c_j) per channel is never split into exp(c_r) exp(-c_j) (which
overflows for gates near 0): each pair j < r lies in one aligned block of 2, 4, ..., C tokens with
j in its left half and r in its right half, and the decay is split at the boundary between the
halves, both factors <= 1 (one matmul of decayed rows and columns per block size and score).

Backward, from the last chunk, with T and the scores as the forward kept them (as the PyTorch
kernel keeps them: four [C, C] tiles a chunk) and D the gradient of the state leaving the chunk:
    dU = qb^T dO + (B ⊙ exp(c_C - c)) D,  dZ = T^T dU,  d(ab) = dZ U^T,  d(ak) = dZ V^T
    dV = qk^T dO + (K ⊙ exp(c_C - c)) D + ak^T dZ
    D <- exp(c_C) ⊙ D + (Q ⊙ exp(c))^T dO + (A ⊙ exp(c_{r-1}))^T dZ
and the scores' gradients go back to q, k, a, b through the same blocks. The gate's gradient
is, for each decay, the input times its gradient, summed back over the gates in the decay's sum
(the transposed mask). dQ, dK, dA, dB and dg sum over the value columns inside one program,
which loops over them; each program writes its own key columns (no parts to add).

Without a gate (gk=None) there are no decays: the scores are the causal products [Q K], [Q B],
[A K]', [A B]', and the kernel neither reads a gate nor splits the pairs into blocks.

A token whose key, value, a, b or gate is not finite poisons the outputs from it on (for a
value, in its column) and the state, as the recurrence does; the products inside the chunk run
over finite values.

Checked in triton's interpreter only; unmeasured on a GPU (benchmarks/RESULTS-gpu-static.md has
what each kernel compiles to for sm_90 and sm_100).
"""

import torch
import triton
import triton.language as tl

from mixc.backends.pytorch.kernels.common import _needs_grad
from mixc.backends.triton.kernels.common import (
    _tl_check_device,
    _tl_columns,
    _tl_dot,
    _tl_dot_precision,
    _tl_finite,
    _tl_gradients,
    _tl_key_gates,
    _tl_launch,
    _tl_levels,
    _tl_load_state,
    _tl_outputs,
    _tl_put_rows,
    _tl_rows,
    _tl_sizes,
    _tl_store_rows,
    _tl_store_state,
    _tl_strides,
    _tl_tile,
    _tl_tokens,
    _tl_unit_lower_inverse,
)
from mixc.backends.triton.kernels.dplr_scores import (
    _tl_dplr_d_scores,
    _tl_dplr_decays,
    _tl_dplr_decays_grad,
    _tl_dplr_dots,
    _tl_dplr_scores,
    _tl_dplr_scores_grad,
)


@triton.jit
def _tl_dplr_load(x, i, T, d, t, cols, mask):
    """The rows t and columns cols of item i of x [N, T, d] (contiguous), 0 where mask is False:
    what one of the forward's kernels wrote for the next (_tl_store_rows)."""
    return tl.load(x + (i * T + t[:, None]) * d + cols[None, :], mask=mask, other=0.0)


@triton.jit
def _tl_dplr_guard(k_c, a_c, b_c, g_c, HAS_G: tl.constexpr):
    """The guard of a chunk's key-side inputs: (k, a, b and g (read only if HAS_G) with their
    entries that are not finite read as 0, and the poison of their rows [BT]: 0 where every
    entry is finite, NaN where one is not). The products inside the chunk take the finite
    values; the poison reaches the outputs from its token on and the state."""
    k_c, k_poison = _tl_finite(k_c)
    a_c, a_poison = _tl_finite(a_c)
    b_c, b_poison = _tl_finite(b_c)
    poison = k_poison + a_poison + b_poison
    if HAS_G:
        g_c, g_poison = _tl_finite(g_c)
        poison += g_poison
    return k_c, a_c, b_c, g_c, tl.sum(poison, axis=1)


@triton.jit
def _tl_dplr_decayed(
    q_c, k_c, a_c, b_c, g_c, rows,
    HAS_G: tl.constexpr, BT: tl.constexpr, LEVELS: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """What a chunk's products read, from its inputs' columns and log-gates g_c (read only if
    HAS_G): (their parts of the decayed scores qk, qb, ak, ab (_tl_dplr_scores; without a gate
    the causal products), and the rows and columns that meet the state, Q ⊙ exp(c), A ⊙
    exp(c_{r-1}) and K, B ⊙ exp(c_C - c))."""
    if HAS_G:
        qk, qb, ak, ab = _tl_dplr_scores(q_c, k_c, a_c, b_c, g_c, rows, BT, LEVELS, DOT)
        from_start, from_before, to_end = _tl_dplr_decays(g_c, rows, BT)
        q_start, a_before = q_c * from_start, a_c * from_before
        k_end, b_end = k_c * to_end, b_c * to_end
    else:
        causal = rows[:, None] >= rows[None, :]
        strict = rows[:, None] > rows[None, :]
        qk, qb, ak, ab = _tl_dplr_dots(q_c, a_c, k_c, b_c, causal, strict, DOT)
        q_start, a_before, k_end, b_end = q_c, a_c, k_c, b_c
    return qk, qb, ak, ab, q_start, a_before, k_end, b_end


@triton.jit
def _tl_dplr_fwd_scores(
    q, k, a, b, g,  # read
    ts, qd, ad, kd, bd, decay, poison,  # written
    T, NH, K,
    sq_b, sq_h, sq_t, sq_d,
    sk_b, sk_h, sk_t, sk_d,
    sa_b, sa_h, sa_t, sa_d,
    sb_b, sb_h, sb_t, sb_d,
    sg_b, sg_h, sg_t, sg_d,
    HAS_G: tl.constexpr, BT: tl.constexpr, LEVELS: tl.constexpr, BK: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """The forward's first kernel, one program per (chunk, batch x head), the chunks at once:
    the chunk's T = (I - ab)^{-1} and scores qk, qb, ak into ts [B * NH, N, 4, BT, BT] (as the
    backward reads them, _tl_dplr_kept), its decayed rows Q ⊙ exp(c), A ⊙ exp(c_{r-1}), K and
    B ⊙ exp(c_C - c) into qd, ad, kd, bd [B * NH, T, K], its whole decay exp(c_C) into decay
    [B * NH, N, K] (if HAS_G) and the poison of its key-side rows into poison [B * NH, T];
    the key columns BK at a time, the scores summed over them."""
    i_n, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // NH, i_bh % NH
    rows = tl.arange(0, BT)
    t = i_n * BT + rows
    in_t = t < T
    qk = tl.zeros([BT, BT], dtype=poison.dtype.element_ty)
    qb, ak, ab, row_poison = qk, qk, qk, tl.sum(qk, axis=1)
    for i_k in range(0, tl.cdiv(K, BK)):
        cols = i_k * BK + tl.arange(0, BK)
        at = in_t[:, None] & (cols < K)[None, :]
        q_c = _tl_rows(q, sq_b, sq_h, sq_t, sq_d, i_b, i_h, t, cols, at)
        k_c = _tl_rows(k, sk_b, sk_h, sk_t, sk_d, i_b, i_h, t, cols, at)
        a_c = _tl_rows(a, sa_b, sa_h, sa_t, sa_d, i_b, i_h, t, cols, at)
        b_c = _tl_rows(b, sb_b, sb_h, sb_t, sb_d, i_b, i_h, t, cols, at)
        if HAS_G:
            g_c = _tl_key_gates(g, sg_b, sg_h, sg_t, sg_d, i_b, i_h, t, cols, at)
        else:
            g_c = tl.zeros((BT, BK), dtype=q_c.dtype)  # never read
        k_c, a_c, b_c, g_c, poison_k = _tl_dplr_guard(k_c, a_c, b_c, g_c, HAS_G)
        row_poison += poison_k
        decayed = _tl_dplr_decayed(q_c, k_c, a_c, b_c, g_c, rows, HAS_G, BT, LEVELS, DOT)
        qk_k, qb_k, ak_k, ab_k, q_start, a_before, k_end, b_end = decayed
        qk, qb, ak, ab = qk + qk_k, qb + qb_k, ak + ak_k, ab + ab_k
        _tl_store_rows(qd, i_bh, T, K, t, cols, at, q_start)
        _tl_store_rows(ad, i_bh, T, K, t, cols, at, a_before)
        _tl_store_rows(kd, i_bh, T, K, t, cols, at, k_end)
        _tl_store_rows(bd, i_bh, T, K, t, cols, at, b_end)
        if HAS_G:
            chunk = (i_bh * tl.cdiv(T, BT) + i_n) * K
            tl.store(decay + chunk + cols, tl.exp(tl.sum(g_c, axis=0)), mask=cols < K)
    tl.store(poison + i_bh * T + t, row_poison, mask=in_t)
    tiles = (i_bh * tl.cdiv(T, BT) + i_n) * 4
    tl.store(_tl_tile(ts, tiles + 1, rows), qk)
    tl.store(_tl_tile(ts, tiles + 2, rows), qb)
    tl.store(_tl_tile(ts, tiles + 3, rows), ak)
    tl.store(_tl_tile(ts, tiles, rows), _tl_unit_lower_inverse(-ab, rows, BT))  # (I - ab)^{-1}


@triton.jit
def _tl_dplr_fwd_states(
    v, ad, kd, bd, decay, poison, ts, h0,  # read
    u, ht, hs,  # written
    T, NH, K, V,
    sv_b, sv_h, sv_t, sv_d,
    HAS_G: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """The forward's second kernel, one program per (value block, batch x head): the chunks in
    order, the state in registers, from what _tl_dplr_fwd_scores wrote. Per chunk: the state S
    entering it into hs [B * NH, N, K, V], the state's reads U = T Z, Z = (A ⊙ exp(c_{r-1})) S
    + ak V, into u [B * NH, T, V] (NaN in a row that overflowed: _tl_dplr_fwd_outputs takes
    it as poison), and S <- exp(c_C) ⊙ S + (K ⊙ exp(c_C - c))^T V + (B ⊙ exp(c_C - c))^T U,
    plus the chunk's poison. h0, ht: [B * NH, K, V]."""
    i_bh = tl.program_id(1)
    i_b, i_h = i_bh // NH, i_bh % NH
    rows = tl.arange(0, BT)
    cols_k, cols_v, in_k, in_v = _tl_columns(K, V, BK, BV)
    state = _tl_load_state(h0, i_bh, K, V, cols_k, cols_v)
    n_chunks = tl.cdiv(T, BT)
    for n in range(0, n_chunks):
        t, in_t, at_k, at_v = _tl_tokens(n, rows, T, in_k, in_v)
        _tl_store_state(hs, i_bh * n_chunks + n, K, V, cols_k, cols_v, state)
        v_c, poison_c = _tl_finite(_tl_rows(v, sv_b, sv_h, sv_t, sv_d, i_b, i_h, t, cols_v, at_v))
        tiles = (i_bh * n_chunks + n) * 4
        reads = _tl_dot(_tl_dplr_load(ad, i_bh, T, K, t, cols_k, at_k), state, DOT)
        reads += _tl_dot(tl.load(_tl_tile(ts, tiles + 3, rows)), v_c, DOT)  # ak V
        # finite inputs can still overflow in a later token's row, which a product with the
        # inverse or the scores would carry back to the earlier ones: such a row poisons too
        reads, reads_poison = _tl_finite(reads)
        u_c = _tl_dot(tl.load(_tl_tile(ts, tiles, rows)), reads, DOT)  # u_r = a_r^T S_{r-1}
        u_c, u_poison = _tl_finite(u_c)
        poison_c += reads_poison + u_poison
        _tl_store_rows(u, i_bh, T, V, t, cols_v, at_v, u_c + reads_poison + u_poison)
        poison_c += tl.load(poison + i_bh * T + t, mask=in_t, other=0.0)[:, None]
        if HAS_G:
            whole = tl.load(decay + (i_bh * n_chunks + n) * K + cols_k, mask=in_k, other=0.0)
            state = state * whole[:, None]
        state += _tl_dot(tl.trans(_tl_dplr_load(kd, i_bh, T, K, t, cols_k, at_k)), v_c, DOT)
        state += _tl_dot(tl.trans(_tl_dplr_load(bd, i_bh, T, K, t, cols_k, at_k)), u_c, DOT)
        state += tl.sum(poison_c, axis=0)[None, :]
    _tl_store_state(ht, i_bh, K, V, cols_k, cols_v, state)


@triton.jit
def _tl_dplr_fwd_outputs(
    v, qd, u, poison, ts, hs,  # read
    o,  # written
    T, NH, K, V,
    sv_b, sv_h, sv_t, sv_d,
    so_b, so_h, so_t, so_d,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """The forward's last kernel, one program per (value block, batch x head, chunk), the
    chunks at once: O = (Q ⊙ exp(c)) S + qk V + qb U from the state S entering the chunk (hs),
    U (u) and what _tl_dplr_fwd_scores wrote, plus the poison of the chunk's inputs and of the
    rows of U that overflowed, from its token on."""
    i_bh, n = tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // NH, i_bh % NH
    rows = tl.arange(0, BT)
    cols_k, cols_v = tl.arange(0, BK), tl.program_id(0) * BV + tl.arange(0, BV)
    t, in_t, at_k, at_v = _tl_tokens(n, rows, T, cols_k < K, cols_v < V)
    state = _tl_load_state(hs, i_bh * tl.cdiv(T, BT) + n, K, V, cols_k, cols_v)
    v_c, poison_c = _tl_finite(_tl_rows(v, sv_b, sv_h, sv_t, sv_d, i_b, i_h, t, cols_v, at_v))
    u_c, u_poison = _tl_finite(_tl_dplr_load(u, i_bh, T, V, t, cols_v, at_v))
    poison_c += u_poison + tl.load(poison + i_bh * T + t, mask=in_t, other=0.0)[:, None]
    tiles = (i_bh * tl.cdiv(T, BT) + n) * 4
    out = _tl_dot(_tl_dplr_load(qd, i_bh, T, K, t, cols_k, at_k), state, DOT)
    out += _tl_dot(tl.load(_tl_tile(ts, tiles + 1, rows)), v_c, DOT)  # qk V
    out += _tl_dot(tl.load(_tl_tile(ts, tiles + 2, rows)), u_c, DOT)  # qb U
    out += tl.cumsum(poison_c, axis=0)
    _tl_put_rows(o, so_b, so_h, so_t, so_d, i_b, i_h, t, cols_v, at_v, out)


@triton.jit
def _tl_dplr_kept(ts, tiles, rows):
    """T and the scores qk, qb, ak of a chunk, as the forward kept them in tiles tiles, ...,
    tiles + 3 of ts (_tl_tile)."""
    inverse = tl.load(_tl_tile(ts, tiles, rows))
    qk = tl.load(_tl_tile(ts, tiles + 1, rows))
    qb = tl.load(_tl_tile(ts, tiles + 2, rows))
    ak = tl.load(_tl_tile(ts, tiles + 3, rows))
    return inverse, qk, qb, ak


@triton.jit
def _tl_dplr_bwd_states(
    do, qd, ad, kd, bd, decay, ts, dht,  # read
    dv, dz, dhs, dh0,  # written
    T, NH, K, V,
    sdo_b, sdo_h, sdo_t, sdo_d,
    HAS_G: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """The backward's first kernel, one program per (value block, batch x head): the chunks from
    the last, the gradient D of the state in registers, from what the forward kept. Per chunk:
    D (the gradient of the state leaving it) into dhs [B * NH, N, K, V], dZ = T^T dU with dU =
    qb^T dO + (B ⊙ exp(c_C - c)) D into dz [B * NH, T, V], dV = qk^T dO + (K ⊙ exp(c_C - c)) D
    + ak^T dZ into dv [B * NH, T, V], and D <- exp(c_C) ⊙ D + (Q ⊙ exp(c))^T dO + (A ⊙
    exp(c_{r-1}))^T dZ. dht, dh0: [B * NH, K, V]."""
    i_bh = tl.program_id(1)
    i_b, i_h = i_bh // NH, i_bh % NH
    rows = tl.arange(0, BT)
    cols_k, cols_v, in_k, in_v = _tl_columns(K, V, BK, BV)
    d_state = _tl_load_state(dht, i_bh, K, V, cols_k, cols_v)
    n_chunks = tl.cdiv(T, BT)
    for m in range(0, n_chunks):
        n = n_chunks - 1 - m
        t, _, at_k, at_v = _tl_tokens(n, rows, T, in_k, in_v)
        _tl_store_state(dhs, i_bh * n_chunks + n, K, V, cols_k, cols_v, d_state)
        do_c = _tl_rows(do, sdo_b, sdo_h, sdo_t, sdo_d, i_b, i_h, t, cols_v, at_v)
        inverse, qk, qb, ak = _tl_dplr_kept(ts, (i_bh * n_chunks + n) * 4, rows)
        d_u = _tl_dot(tl.trans(qb), do_c, DOT)
        d_u += _tl_dot(_tl_dplr_load(bd, i_bh, T, K, t, cols_k, at_k), d_state, DOT)
        d_reads = _tl_dot(tl.trans(inverse), d_u, DOT)
        _tl_store_rows(dz, i_bh, T, V, t, cols_v, at_v, d_reads)
        dv_c = _tl_dot(tl.trans(qk), do_c, DOT)
        dv_c += _tl_dot(_tl_dplr_load(kd, i_bh, T, K, t, cols_k, at_k), d_state, DOT)
        dv_c += _tl_dot(tl.trans(ak), d_reads, DOT)
        _tl_store_rows(dv, i_bh, T, V, t, cols_v, at_v, dv_c)
        if HAS_G:
            whole = tl.load(decay + (i_bh * n_chunks + n) * K + cols_k, mask=in_k, other=0.0)
            d_state = d_state * whole[:, None]
        q_start = _tl_dplr_load(qd, i_bh, T, K, t, cols_k, at_k)
        d_state += _tl_dot(tl.trans(q_start), do_c, DOT)
        a_before = _tl_dplr_load(ad, i_bh, T, K, t, cols_k, at_k)
        d_state += _tl_dot(tl.trans(a_before), d_reads, DOT)
    _tl_store_state(dh0, i_bh, K, V, cols_k, cols_v, d_state)


@triton.jit
def _tl_dplr_d_scores_sum(
    v, do, u, dz, i_b, i_h, i_bh, t, in_t, rows, T, V,
    sv_b, sv_h, sv_t, sv_d, sdo_b, sdo_h, sdo_t, sdo_d,
    BV: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """A chunk's scores' gradients on their support (_tl_dplr_d_scores), summed over the value
    columns BV at a time: d(qk), d(qb) = dO (V, U)^T, d(ak), d(ab) = dZ (V, U)^T."""
    d_qk = tl.zeros([rows.shape[0], rows.shape[0]], dtype=u.dtype.element_ty)
    d_qb, d_ak, d_ab = d_qk, d_qk, d_qk
    for i_v in range(0, tl.cdiv(V, BV)):
        cols = i_v * BV + tl.arange(0, BV)
        at = in_t[:, None] & (cols < V)[None, :]
        v_c = _tl_rows(v, sv_b, sv_h, sv_t, sv_d, i_b, i_h, t, cols, at)
        do_c = _tl_rows(do, sdo_b, sdo_h, sdo_t, sdo_d, i_b, i_h, t, cols, at)
        u_c = _tl_dplr_load(u, i_bh, T, V, t, cols, at)
        dz_c = _tl_dplr_load(dz, i_bh, T, V, t, cols, at)
        scores = _tl_dplr_d_scores(do_c, dz_c, v_c, u_c, rows, DOT)
        d_qk, d_qb = d_qk + scores[0], d_qb + scores[1]
        d_ak, d_ab = d_ak + scores[2], d_ab + scores[3]
    return d_qk, d_qb, d_ak, d_ab


@triton.jit
def _tl_dplr_through_states(
    v, do, u, dz, hs, dhs, i_b, i_h, i_bh, i_state, t, in_t, cols_k, T, K, V,
    sv_b, sv_h, sv_t, sv_d, sdo_b, sdo_h, sdo_t, sdo_d,
    BV: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """The gradients of a chunk's decayed rows through the states, for key columns cols_k,
    summed over the value columns BV at a time: (dO S^T, dZ S^T, V D^T, U D^T, and Σ_v S ⊙ D
    per key column), S the state entering the chunk (hs) and D the gradient of the one leaving
    it (dhs)."""
    zero = tl.zeros([t.shape[0], cols_k.shape[0]], dtype=u.dtype.element_ty)
    dq_c, da_c, dk_c, db_c, through = zero, zero, zero, zero, tl.sum(zero, axis=0)
    for i_v in range(0, tl.cdiv(V, BV)):
        cols = i_v * BV + tl.arange(0, BV)
        at = in_t[:, None] & (cols < V)[None, :]
        state = _tl_load_state(hs, i_state, K, V, cols_k, cols)
        d_state = _tl_load_state(dhs, i_state, K, V, cols_k, cols)
        do_c = _tl_rows(do, sdo_b, sdo_h, sdo_t, sdo_d, i_b, i_h, t, cols, at)
        dq_c += _tl_dot(do_c, tl.trans(state), DOT)
        da_c += _tl_dot(_tl_dplr_load(dz, i_bh, T, V, t, cols, at), tl.trans(state), DOT)
        v_c = _tl_rows(v, sv_b, sv_h, sv_t, sv_d, i_b, i_h, t, cols, at)
        dk_c += _tl_dot(v_c, tl.trans(d_state), DOT)
        db_c += _tl_dot(_tl_dplr_load(u, i_bh, T, V, t, cols, at), tl.trans(d_state), DOT)
        through += tl.sum(state * d_state, axis=1)
    return dq_c, da_c, dk_c, db_c, through


@triton.jit
def _tl_dplr_through_decays(
    dq_c, da_c, dk_c, db_c, through, q_c, a_c, k_c, b_c, g_c, rows,
    GATE_GRAD: tl.constexpr, BT: tl.constexpr,
):  # fmt: skip
    """The gradients of q, a, k and b from those of their decayed rows Q ⊙ exp(c), A ⊙
    exp(c_{r-1}), K and B ⊙ exp(c_C - c), and (if GATE_GRAD, else zeros) the gate's from those
    decays and from exp(c_C), through the sum of S ⊙ D per key column: each decay's log is a
    sum of gates under a mask, so its input times its gradient goes back to those gates
    through the transposed mask."""
    from_start, from_before, to_end = _tl_dplr_decays(g_c, rows, BT)
    dq_c, da_c = dq_c * from_start, da_c * from_before
    dk_c, db_c = dk_c * to_end, db_c * to_end
    dg_c = tl.zeros_like(dq_c)
    if GATE_GRAD:
        dg_c = _tl_dplr_decays_grad(q_c * dq_c, a_c * da_c, k_c * dk_c + b_c * db_c, rows, BT)
        dg_c += (through * tl.exp(tl.sum(g_c, axis=0)))[None, :]  # for exp(c_C)
    return dq_c, da_c, dk_c, db_c, dg_c


@triton.jit
def _tl_dplr_bwd_inputs(
    q, k, a, b, g, v, do, u, dz, hs, dhs,  # read
    dq, dk, da, db, dg,  # written
    T, NH, K, V,
    sq_b, sq_h, sq_t, sq_d,
    sk_b, sk_h, sk_t, sk_d,
    sa_b, sa_h, sa_t, sa_d,
    sb_b, sb_h, sb_t, sb_d,
    sg_b, sg_h, sg_t, sg_d,
    sv_b, sv_h, sv_t, sv_d,
    sdo_b, sdo_h, sdo_t, sdo_d,
    HAS_G: tl.constexpr, GATE_GRAD: tl.constexpr, BT: tl.constexpr, LEVELS: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """The backward's second kernel, one program per (chunk, batch x head, block of BK key
    columns), the chunks at once: the gradients of q, k, a, b and (if GATE_GRAD) the gate
    [B * NH, T, K] in its key columns, from the scores' gradients (_tl_dplr_d_scores_sum) and
    those of the decayed rows through the states (_tl_dplr_through_states), back through the
    decays and the scores' blocks (_tl_dplr_scores_grad) as the forward made them. Each key
    block's program makes the scores' gradients again: in a loop over the key blocks, triton
    hoists their level-masked copies (independent of the key block) out of the loop, and their
    shared-memory operands stay allocated together (403 KB on sm_90, which has 227 KB)."""
    i_n, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // NH, i_bh % NH
    rows = tl.arange(0, BT)
    t = i_n * BT + rows
    in_t = t < T
    sv = (sv_b, sv_h, sv_t, sv_d, sdo_b, sdo_h, sdo_t, sdo_d)
    d_qk, d_qb, d_ak, d_ab = _tl_dplr_d_scores_sum(
        v, do, u, dz, i_b, i_h, i_bh, t, in_t, rows, T, V, *sv, BV, DOT
    )
    i_k = tl.program_id(2)  # one block of key columns a program
    cols = i_k * BK + tl.arange(0, BK)
    at = in_t[:, None] & (cols < K)[None, :]
    q_c = _tl_rows(q, sq_b, sq_h, sq_t, sq_d, i_b, i_h, t, cols, at)
    k_c = _tl_rows(k, sk_b, sk_h, sk_t, sk_d, i_b, i_h, t, cols, at)
    a_c = _tl_rows(a, sa_b, sa_h, sa_t, sa_d, i_b, i_h, t, cols, at)
    b_c = _tl_rows(b, sb_b, sb_h, sb_t, sb_d, i_b, i_h, t, cols, at)
    dq_c, da_c, dk_c, db_c, through = _tl_dplr_through_states(
        v, do, u, dz, hs, dhs, i_b, i_h, i_bh, i_bh * tl.cdiv(T, BT) + i_n, t, in_t, cols,
        T, K, V, *sv, BV, DOT,
    )  # fmt: skip
    dg_c = tl.zeros_like(dq_c)
    if HAS_G:
        g_c = _tl_key_gates(g, sg_b, sg_h, sg_t, sg_d, i_b, i_h, t, cols, at)
        dq_c, da_c, dk_c, db_c, dg_c = _tl_dplr_through_decays(
            dq_c, da_c, dk_c, db_c, through, q_c, a_c, k_c, b_c, g_c, rows, GATE_GRAD, BT
        )
    else:
        g_c = dg_c  # never read
    dq_c, da_c, dk_c, db_c, dg_c = _tl_dplr_scores_grad(
        dq_c, da_c, dk_c, db_c, dg_c, d_qk, d_qb, d_ak, d_ab, q_c, a_c, k_c, b_c, g_c, rows,
        HAS_G, GATE_GRAD, LEVELS, DOT,
    )  # fmt: skip
    _tl_store_rows(dq, i_bh, T, K, t, cols, at, dq_c)
    _tl_store_rows(dk, i_bh, T, K, t, cols, at, dk_c)
    _tl_store_rows(da, i_bh, T, K, t, cols, at, da_c)
    _tl_store_rows(db, i_bh, T, K, t, cols, at, db_c)
    if GATE_GRAD:
        _tl_store_rows(dg, i_bh, T, K, t, cols, at, dg_c)


def _tl_dplr_forward(q, k, v, a, b, gk, initial_state, chunk_size, keep, dot):
    """(o [B, NH, T, V], final state [B, NH, K, V], and if keep the states entering each chunk
    [B, NH, N, K, V] and T and the scores qk, qb, ak of each chunk [B, NH, N, 4, C, C], else
    Nones): three launches, the chunks' scores and decayed rows (_tl_dplr_fwd_scores), the
    states (_tl_dplr_fwd_states), the outputs (_tl_dplr_fwd_outputs)."""
    batch, heads, length, d_k = q.shape
    d_v = v.shape[-1]
    block_t, block_k, block_v, grid, n_chunks = _tl_sizes(
        q, v, chunk_size, _tl_dplr_fwd_states, dot
    )
    initial_state, o, final, states = _tl_outputs(q, v, initial_state, n_chunks, True)
    # T, the scores and the decayed rows meet only products: with 16-bit products, kept in
    # that dtype (the rounding each product makes of them anyway; half the registers and
    # memory), computed in float32 (float64)
    kept = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dot, final.dtype)
    tiles = q.new_empty(batch, heads, n_chunks, 4, block_t, block_t, dtype=kept)
    qd, ad, kd, bd = (q.new_empty(batch, heads, length, d_k, dtype=kept) for _ in range(4))
    decay = final.new_empty(batch, heads, n_chunks, d_k) if gk is not None else final
    poison, u = final.new_empty(batch, heads, length), final.new_empty(batch, heads, length, d_v)
    has_g, levels = gk is not None, _tl_levels(block_t)
    scores_k = _tl_sizes(q, v, chunk_size, _tl_dplr_fwd_scores, dot)[1]
    _tl_dplr_fwd_scores[(n_chunks, batch * heads)](
        q, k, a, b, q if gk is None else gk,  # read
        tiles, qd, ad, kd, bd, decay, poison,  # written
        length, heads, d_k, *(stride for x in (q, k, a, b, gk) for stride in _tl_strides(x, 4)),
        HAS_G=has_g, BT=block_t, LEVELS=levels, BK=scores_k, DOT=dot,
        **_tl_launch(_tl_dplr_fwd_scores, dot),
    )  # fmt: skip
    _tl_dplr_fwd_states[grid](
        v, ad, kd, bd, decay, poison, tiles, initial_state,  # read
        u, final, states,  # written
        length, heads, d_k, d_v, *_tl_strides(v, 4),
        HAS_G=has_g, BT=block_t, BK=block_k, BV=block_v, DOT=dot,
        **_tl_launch(_tl_dplr_fwd_states, dot),
    )  # fmt: skip
    _tl_dplr_fwd_outputs[(grid[0], batch * heads, n_chunks)](
        v, qd, u, poison, tiles, states,  # read
        o,  # written
        length, heads, d_k, d_v, *_tl_strides(v, 4), *_tl_strides(o, 4),
        BT=block_t, BK=block_k, BV=block_v, DOT=dot, **_tl_launch(_tl_dplr_fwd_outputs, dot),
    )  # fmt: skip
    kept = (states, tiles, qd, ad, kd, bd, decay if gk is not None else tiles, u)
    return o, final, kept if keep else None


class _TlDplr(torch.autograd.Function):
    """The kernels under autograd: the forward keeps the inputs and what its launches wrote
    (the states entering each chunk, T and the scores, the decayed rows, the chunks' decays,
    U); the backward is two launches, the pass over the chunks from the last
    (_tl_dplr_bwd_states) and the key-side gradients of every chunk at once
    (_tl_dplr_bwd_inputs)."""

    @staticmethod
    def forward(ctx, q, k, v, a, b, gk, initial_state, chunk_size, operands):
        dot = _tl_dot_precision(q, _tl_dplr_fwd_states, operands)
        o, final, kept = _tl_dplr_forward(q, k, v, a, b, gk, initial_state, chunk_size, True, dot)
        ctx.save_for_backward(q, k, v, a, b, gk, *kept)
        ctx.chunk_size, ctx.dot = chunk_size, dot
        return o, final

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_o, d_final):
        q, k, v, a, b, gk, states, tiles, qd, ad, kd, bd, decay, u = ctx.saved_tensors
        batch, heads, length, d_k = q.shape
        d_v = v.shape[-1]
        block_t, block_k, block_v, grid, n_chunks = _tl_sizes(
            q, v, ctx.chunk_size, _tl_dplr_bwd_states, ctx.dot
        )
        d_o, d_final, dq, dk, dv, d_initial = _tl_gradients(q, v, d_o, d_final, 1)
        dq, dk = dq[0], dk[0]  # one part: the key-side gradients are not split by value block
        da, db, dz, d_states = (torch.empty_like(x) for x in (dq, dq, u, states))
        gate_grad = gk is not None and ctx.needs_input_grad[5]
        dg = torch.empty_like(dq) if gate_grad else dq
        _tl_dplr_bwd_states[grid](
            d_o, qd, ad, kd, bd, decay, tiles, d_final,  # read
            dv, dz, d_states, d_initial,  # written
            length, heads, d_k, d_v, *_tl_strides(d_o, 4),
            HAS_G=gk is not None, BT=block_t, BK=block_k, BV=block_v, DOT=ctx.dot,
            **_tl_launch(_tl_dplr_bwd_states, ctx.dot),
        )  # fmt: skip
        _, inputs_k, inputs_v, _, _ = _tl_sizes(q, v, ctx.chunk_size, _tl_dplr_bwd_inputs, ctx.dot)
        _tl_dplr_bwd_inputs[(n_chunks, batch * heads, triton.cdiv(d_k, inputs_k))](
            q, k, a, b, q if gk is None else gk, v, d_o, u, dz, states, d_states,  # read
            dq, dk, da, db, dg,  # written
            length, heads, d_k, d_v,
            *(stride for x in (q, k, a, b, gk, v, d_o) for stride in _tl_strides(x, 4)),
            HAS_G=gk is not None, GATE_GRAD=gate_grad, BT=block_t, LEVELS=_tl_levels(block_t),
            BK=inputs_k, BV=inputs_v, DOT=ctx.dot, **_tl_launch(_tl_dplr_bwd_inputs, ctx.dot),
        )  # fmt: skip
        d_gate = dg if gate_grad else None
        d_initial = d_initial if ctx.needs_input_grad[6] else None  # None: no initial state
        return dq, dk, dv, da, db, d_gate, d_initial, None, None


def chunk_dplr(
    q, k, v, a, b, gk=None, initial_state=None, chunk_size=64, gk_min=None, operands=None
):
    """Chunked S_t = (diag(exp(gk_t)) + b_t a_t^T) S_{t-1} + k_t v_t^T, o_t = q_t S_t, as fused
    Triton kernels, forward and backward.

    a, b: [B, NH, T, K]; gk: the log-gate [B, NH, T, K] or [B, NH, T, 1] (one per token, for
    every channel), None: no decay. gk_min (a lower bound of gk, as the PyTorch kernel takes)
    is not needed: the fused kernels' factors are measured from sub-chunk boundaries whatever
    the gate. operands: the dtype of the caller's inputs where they were widened to q's
    (_tl_dot_precision), None for q's. Returns (o [B, NH, T, V], final state [B, NH, K, V]).
    """
    _tl_check_device(_tl_dplr_fwd_states, q)
    gk = None if gk is None else gk.expand_as(k)
    if _needs_grad(q, k, v, a, b, gk, initial_state):
        return _TlDplr.apply(q, k, v, a, b, gk, initial_state, chunk_size, operands)
    dot = _tl_dot_precision(q, _tl_dplr_fwd_states, operands)
    o, final, _ = _tl_dplr_forward(q, k, v, a, b, gk, initial_state, chunk_size, False, dot)
    return o, final
