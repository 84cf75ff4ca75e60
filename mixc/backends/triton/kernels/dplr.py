"""The Triton kernel of the diagonal-plus-low-rank class: S_t = (diag(exp(g_t)) + b_t a_t^T)
S_{t-1} + k_t v_t^T, o_t = q_t S_t, with a log-gate g_t per key channel (KDA, RWKV-7). The same
chunked form as the PyTorch kernel (docs/algorithms.md, "Diagonal plus low rank"), fused: one
program per (batch, head, block of value columns) walks the chunks in order, keeping the state
in registers.

Forward, per chunk, with c the gates' running sum inside the chunk (per channel):
    qk, qb = [Q K], [Q B] (j <= r),  ak, ab = [A K]', [A B]' (j < r): the decayed scores
    T = (I - ab)^{-1}  (forward substitution),  Z = (A ⊙ exp(c_{r-1})) S + ak V,  U = T Z
    O = (Q ⊙ exp(c)) S + qk V + qb U
    S <- exp(c_C) ⊙ S + (K ⊙ exp(c_C - c))^T V + (B ⊙ exp(c_C - c))^T U
U holds the state's reads u_r = a_r^T S_{r-1}. Every decay is the exponential of a sum of gates
of one sign, each sum one matmul of the gates with a 0/1 mask, never a difference of running
sums. A score's decay exp(c_r - c_j) per channel is never split into exp(c_r) exp(-c_j) (which
overflows for gates near 0): each pair j < r lies in one aligned block of 2, 4, ..., C tokens with
j in its left half and r in its right half, and the decay is split at the boundary between the
halves, both factors <= 1 (one matmul of decayed rows and columns per block size and score).

Backward, from the last chunk, with D the gradient of the state leaving the chunk:
    dU = qb^T dO + (B ⊙ exp(c_C - c)) D,  dZ = T^T dU,  d(ab) = dZ U^T,  d(ak) = dZ V^T
    dV = qk^T dO + (K ⊙ exp(c_C - c)) D + ak^T dZ
    D <- exp(c_C) ⊙ D + (Q ⊙ exp(c))^T dO + (A ⊙ exp(c_{r-1}))^T dZ
and the scores' gradients go back to q, k, a, b through the same blocks. The gate's gradient
is, for each decay, the input times its gradient, summed back over the gates in the decay's sum
(the transposed mask). dQ, dK, dA, dB and dg sum over the value columns: each block of columns
writes its part and the parts are added after the launch.

A token whose key, value, a, b or gate is not finite poisons the outputs from it on (for a
value, in its column) and the state, as the recurrence does; the products inside the chunk run
over finite values.

Checked in triton's interpreter only; unmeasured on a GPU. At d_k = 128 and 64-token chunks a
program holds a dozen [64, 128] tiles (the inputs and their decays), more than a GPU's registers:
the first measurement will say whether it needs smaller chunks or the key columns split.
"""

import torch
import triton
import triton.language as tl

from mixc.backends.pytorch.kernels.common import _needs_grad
from mixc.backends.triton.kernels.common import (
    _tl_check_device,
    _tl_new_like_callers,
    _tl_rows,
    _tl_sizes,
    _tl_strides,
    _tl_unit_lower_inverse,
)


@triton.jit
def _tl_dplr_sums(mask, g):
    """The sums Σ_l mask[i, l] g[l, :] of log-gates g [BT, BK] over a 0/1 mask [BT, BT]: each
    one of gates of one sign (a matmul whose products are a gate times 1 or 0)."""
    return tl.dot(mask.to(g.dtype), g, input_precision="ieee")


@triton.jit
def _tl_dplr_level(g, rows, HALF: tl.constexpr):
    """The aligned blocks of 2 * HALF tokens: (pairs [BT, BT], r in a block's right half and j
    in its left half; the masks [BT, BT] of the gates in the rows' decays from the boundary,
    exp(c_r - c_m) and exp(c_{r-1} - c_m), and in the columns' decays to it, exp(c_m - c_j),
    with m the last token of the left half; and those decays [BT, BK], 1 outside the half they
    belong to)."""
    block = rows // (2 * HALF)
    right = (rows % (2 * HALF)) >= HALF
    left = (rows % (2 * HALF)) < HALF
    same = block[:, None] == block[None, :]
    in_right = same & right[:, None] & right[None, :]  # [r, l]: l in r's right half
    in_left = same & left[:, None] & left[None, :]  # [j, l]: l in j's left half
    row_mask = in_right & (rows[None, :] <= rows[:, None])
    row_before_mask = in_right & (rows[None, :] < rows[:, None])
    col_mask = in_left & (rows[None, :] > rows[:, None])
    pairs = same & right[:, None] & left[None, :]
    return (
        pairs,
        row_mask,
        row_before_mask,
        col_mask,
        tl.exp(_tl_dplr_sums(row_mask, g)),
        tl.exp(_tl_dplr_sums(row_before_mask, g)),
        tl.exp(_tl_dplr_sums(col_mask, g)),
    )


@triton.jit
def _tl_dplr_scores(q, k, a, b, g, rows, BT: tl.constexpr, LEVELS: tl.constexpr):
    """The decayed scores of a chunk [BT, BT]: qk[r, j] = Σ_c q_rc exp(c_rc - c_jc) k_jc and qb
    (the same with b) for j <= r, ak[r, j] = Σ_c a_rc exp(c_{r-1,c} - c_jc) k_jc and ab (the
    same with b) for j < r, 0 elsewhere; block by block (_tl_dplr_level), the pairs r = j
    undecayed."""
    diagonal = rows[:, None] == rows[None, :]
    qk = tl.where(diagonal, tl.sum(q * k, axis=1)[:, None], 0.0)
    qb = tl.where(diagonal, tl.sum(q * b, axis=1)[:, None], 0.0)
    ak = tl.zeros([BT, BT], dtype=q.dtype)
    ab = tl.zeros([BT, BT], dtype=q.dtype)
    for level in tl.static_range(LEVELS):
        pairs, _, _, _, row, row_before, col = _tl_dplr_level(g, rows, 1 << level)
        q_row, a_row, k_col, b_col = q * row, a * row_before, tl.trans(k * col), tl.trans(b * col)
        qk += tl.where(pairs, tl.dot(q_row, k_col, input_precision="ieee"), 0.0)
        qb += tl.where(pairs, tl.dot(q_row, b_col, input_precision="ieee"), 0.0)
        ak += tl.where(pairs, tl.dot(a_row, k_col, input_precision="ieee"), 0.0)
        ab += tl.where(pairs, tl.dot(a_row, b_col, input_precision="ieee"), 0.0)
    return qk, qb, ak, ab


@triton.jit
def _tl_dplr_decays(g, rows):
    """The decays of a chunk from its log-gates g [BT, BK]: (the masks [BT, BT] of l <= r, l < r
    and l > j; exp(c_r), exp(c_{r-1}) and exp(c_C - c_j) [BT, BK]; the chunk's exp(c_C) [BK])."""
    up_to = rows[None, :] <= rows[:, None]
    before = rows[None, :] < rows[:, None]
    after = rows[None, :] > rows[:, None]
    from_start = tl.exp(_tl_dplr_sums(up_to, g))
    from_before = tl.exp(_tl_dplr_sums(before, g))
    to_end = tl.exp(_tl_dplr_sums(after, g))
    return up_to, before, after, from_start, from_before, to_end, tl.exp(tl.sum(g, axis=0))


@triton.jit
def _tl_dplr_fwd(
    q,
    k,
    v,
    a,
    b,
    g,
    h0,
    o,
    ht,
    hs,
    ts,
    T,
    NH,
    K,
    V,
    sq_b,
    sq_h,
    sq_t,
    sq_d,
    sk_b,
    sk_h,
    sk_t,
    sk_d,
    sv_b,
    sv_h,
    sv_t,
    sv_d,
    sa_b,
    sa_h,
    sa_t,
    sa_d,
    sb_b,
    sb_h,
    sb_t,
    sb_d,
    sg_b,
    sg_h,
    sg_t,
    sg_d,
    so_b,
    so_h,
    so_t,
    so_d,
    KEEP: tl.constexpr,
    BT: tl.constexpr,
    LEVELS: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
):
    """One (value block, batch x head) program: the chunks in order, the state in registers.
    h0, ht: [B * NH, K, V]; hs (KEEP): the states entering each chunk [B * NH, N, K, V]; ts
    (KEEP): T of each chunk [B * NH, N, BT, BT], written by the first value block; contiguous."""
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // NH, i_bh % NH
    rows = tl.arange(0, BT)
    cols_k = tl.arange(0, BK)
    cols_v = i_v * BV + tl.arange(0, BV)
    in_k, in_v = cols_k < K, cols_v < V
    state_at = cols_k[:, None] * V + cols_v[None, :]
    state_in = in_k[:, None] & in_v[None, :]
    state = tl.load(h0 + i_bh * K * V + state_at, mask=state_in, other=0.0)
    n_chunks = tl.cdiv(T, BT)
    for n in range(0, n_chunks):
        t = n * BT + rows
        in_t = t < T
        at_k = in_t[:, None] & in_k[None, :]
        at_v = in_t[:, None] & in_v[None, :]
        q_c = _tl_rows(q, sq_b, sq_h, sq_t, sq_d, i_b, i_h, t, cols_k, at_k)
        k_c = _tl_rows(k, sk_b, sk_h, sk_t, sk_d, i_b, i_h, t, cols_k, at_k)
        v_c = _tl_rows(v, sv_b, sv_h, sv_t, sv_d, i_b, i_h, t, cols_v, at_v)
        a_c = _tl_rows(a, sa_b, sa_h, sa_t, sa_d, i_b, i_h, t, cols_k, at_k)
        b_c = _tl_rows(b, sb_b, sb_h, sb_t, sb_d, i_b, i_h, t, cols_k, at_k)
        g_c = _tl_rows(g, sg_b, sg_h, sg_t, sg_d, i_b, i_h, t, cols_k, at_k)
        # a gate below -1e30 (a hard reset, -inf) is read as -1e30: its decay is still 0, and
        # the sums of gates stay finite (a matmul's 0 times -inf would be NaN)
        g_c = tl.where(g_c < -1e30, -1e30, g_c)
        # 0 for a finite token, NaN from a non-finite key, a, b or gate (the whole row) or
        # value (its column); the products inside the chunk take the finite values
        poison = tl.sum(k_c + a_c + b_c + tl.exp(g_c), axis=1) * 0.0
        poison = poison[:, None] + v_c * 0.0
        k_c = tl.where(k_c * 0.0 == 0.0, k_c, 0.0)
        a_c = tl.where(a_c * 0.0 == 0.0, a_c, 0.0)
        b_c = tl.where(b_c * 0.0 == 0.0, b_c, 0.0)
        g_c = tl.where(g_c * 0.0 == 0.0, g_c, 0.0)
        v_c = tl.where(v_c * 0.0 == 0.0, v_c, 0.0)
        _, _, _, from_start, from_before, to_end, chunk_decay = _tl_dplr_decays(g_c, rows)
        qk, qb, ak, ab = _tl_dplr_scores(q_c, k_c, a_c, b_c, g_c, rows, BT, LEVELS)
        inverse = _tl_unit_lower_inverse(-ab, rows, BT)  # (I - ab)^{-1}
        if KEEP:
            tl.store(hs + (i_bh * n_chunks + n) * K * V + state_at, state, mask=state_in)
            if i_v == 0:
                t_at = ts + (i_bh * n_chunks + n) * BT * BT + rows[:, None] * BT + rows[None, :]
                tl.store(t_at, inverse)
        reads = tl.dot(a_c * from_before, state.to(a_c.dtype), input_precision="ieee")
        reads += tl.dot(ak, v_c, input_precision="ieee")
        u = tl.dot(inverse, reads, input_precision="ieee")  # u_r = a_r^T S_{r-1}
        out = tl.dot(q_c * from_start, state.to(q_c.dtype), input_precision="ieee")
        out += tl.dot(qk, v_c, input_precision="ieee")
        out += tl.dot(qb, u, input_precision="ieee")
        out += tl.cumsum(poison, axis=0)
        o_at = o + i_b * so_b + i_h * so_h + t[:, None] * so_t + cols_v[None, :] * so_d
        tl.store(o_at, out, mask=at_v)
        state = state * chunk_decay[:, None]
        state += tl.dot(tl.trans(k_c * to_end), v_c, input_precision="ieee")
        state += tl.dot(tl.trans(b_c * to_end), u, input_precision="ieee")
        state += tl.sum(poison, axis=0)[None, :]
    tl.store(ht + i_bh * K * V + state_at, state, mask=state_in)


@triton.jit
def _tl_dplr_bwd(
    q,
    k,
    v,
    a,
    b,
    g,
    do,
    hs,
    ts,
    dht,
    dq,
    dk,
    dv,
    da,
    db,
    dg,
    dh0,
    T,
    NH,
    K,
    V,
    sq_b,
    sq_h,
    sq_t,
    sq_d,
    sk_b,
    sk_h,
    sk_t,
    sk_d,
    sv_b,
    sv_h,
    sv_t,
    sv_d,
    sa_b,
    sa_h,
    sa_t,
    sa_d,
    sb_b,
    sb_h,
    sb_t,
    sb_d,
    sg_b,
    sg_h,
    sg_t,
    sg_d,
    sdo_b,
    sdo_h,
    sdo_t,
    sdo_d,
    GATE_GRAD: tl.constexpr,
    BT: tl.constexpr,
    LEVELS: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
):
    """One (value block, batch x head) program: the chunks from the last, the gradient of the
    state in registers. dq, dk, da, db, dg: this block's parts [NV, B * NH, T, K]; dv
    [B * NH, T, V]; dht, dh0 [B * NH, K, V]; all contiguous."""
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // NH, i_bh % NH
    rows = tl.arange(0, BT)
    cols_k = tl.arange(0, BK)
    cols_v = i_v * BV + tl.arange(0, BV)
    in_k, in_v = cols_k < K, cols_v < V
    diagonal = rows[:, None] == rows[None, :]
    state_at = cols_k[:, None] * V + cols_v[None, :]
    state_in = in_k[:, None] & in_v[None, :]
    d_state = tl.load(dht + i_bh * K * V + state_at, mask=state_in, other=0.0)
    n_chunks = tl.cdiv(T, BT)
    part = i_v * tl.num_programs(1) + i_bh  # this block's part of dq, dk, da, db, dg
    for m in range(0, n_chunks):
        n = n_chunks - 1 - m
        t = n * BT + rows
        in_t = t < T
        at_k = in_t[:, None] & in_k[None, :]
        at_v = in_t[:, None] & in_v[None, :]
        q_c = _tl_rows(q, sq_b, sq_h, sq_t, sq_d, i_b, i_h, t, cols_k, at_k)
        k_c = _tl_rows(k, sk_b, sk_h, sk_t, sk_d, i_b, i_h, t, cols_k, at_k)
        v_c = _tl_rows(v, sv_b, sv_h, sv_t, sv_d, i_b, i_h, t, cols_v, at_v)
        a_c = _tl_rows(a, sa_b, sa_h, sa_t, sa_d, i_b, i_h, t, cols_k, at_k)
        b_c = _tl_rows(b, sb_b, sb_h, sb_t, sb_d, i_b, i_h, t, cols_k, at_k)
        g_c = _tl_rows(g, sg_b, sg_h, sg_t, sg_d, i_b, i_h, t, cols_k, at_k)
        g_c = tl.where(g_c < -1e30, -1e30, g_c)
        do_c = _tl_rows(do, sdo_b, sdo_h, sdo_t, sdo_d, i_b, i_h, t, cols_v, at_v)
        state = tl.load(hs + (i_bh * n_chunks + n) * K * V + state_at, mask=state_in, other=0.0)
        t_at = ts + (i_bh * n_chunks + n) * BT * BT + rows[:, None] * BT + rows[None, :]
        inverse = tl.load(t_at)
        up_to, before, after, from_start, from_before, to_end, chunk_decay = _tl_dplr_decays(
            g_c, rows
        )
        qk, qb, ak, _ = _tl_dplr_scores(q_c, k_c, a_c, b_c, g_c, rows, BT, LEVELS)  # T is kept
        q_start, a_before = q_c * from_start, a_c * from_before
        k_end, b_end = k_c * to_end, b_c * to_end
        reads = tl.dot(a_before, state, input_precision="ieee")
        reads += tl.dot(ak, v_c, input_precision="ieee")
        u = tl.dot(inverse, reads, input_precision="ieee")
        # dU = qb^T dO + (B ⊙ exp(c_C - c)) D, dZ = T^T dU
        d_u = tl.dot(tl.trans(qb), do_c, input_precision="ieee")
        d_u += tl.dot(b_end, d_state, input_precision="ieee")
        d_reads = tl.dot(tl.trans(inverse), d_u, input_precision="ieee")
        causal = rows[:, None] >= rows[None, :]
        d_qk = tl.where(causal, tl.dot(do_c, tl.trans(v_c), input_precision="ieee"), 0.0)
        d_qb = tl.where(causal, tl.dot(do_c, tl.trans(u), input_precision="ieee"), 0.0)
        strict = rows[:, None] > rows[None, :]
        d_ak = tl.where(strict, tl.dot(d_reads, tl.trans(v_c), input_precision="ieee"), 0.0)
        d_ab = tl.where(strict, tl.dot(d_reads, tl.trans(u), input_precision="ieee"), 0.0)
        dv_c = tl.dot(tl.trans(qk), do_c, input_precision="ieee")
        dv_c += tl.dot(k_end, d_state, input_precision="ieee")
        dv_c += tl.dot(tl.trans(ak), d_reads, input_precision="ieee")
        tl.store(dv + (i_bh * T + t[:, None]) * V + cols_v[None, :], dv_c, mask=at_v)
        # through the decayed inputs: Q ⊙ exp(c), A ⊙ exp(c_{r-1}), K and B ⊙ exp(c_C - c)
        dq_c = tl.dot(do_c, tl.trans(state), input_precision="ieee") * from_start
        da_c = tl.dot(d_reads, tl.trans(state), input_precision="ieee") * from_before
        dk_c = tl.dot(v_c, tl.trans(d_state), input_precision="ieee") * to_end
        db_c = tl.dot(u, tl.trans(d_state), input_precision="ieee") * to_end
        if GATE_GRAD:
            # each decay's log is a sum of gates under a mask: its input times its gradient
            # goes back to those gates through the transposed mask
            dg_c = _tl_dplr_sums(tl.trans(up_to), q_c * dq_c)
            dg_c += _tl_dplr_sums(tl.trans(before), a_c * da_c)
            dg_c += _tl_dplr_sums(tl.trans(after), k_c * dk_c + b_c * db_c)
            through_state = tl.sum(state * d_state, axis=1) * chunk_decay  # exp(c_C) [BK]
            dg_c += through_state[None, :]
        # the scores' pairs r = j, undecayed
        d_qk_diag = tl.sum(tl.where(diagonal, d_qk, 0.0), axis=1)[:, None]
        d_qb_diag = tl.sum(tl.where(diagonal, d_qb, 0.0), axis=1)[:, None]
        dq_c += d_qk_diag * k_c + d_qb_diag * b_c
        dk_c += d_qk_diag * q_c
        db_c += d_qb_diag * q_c
        # and block by block, as _tl_dplr_scores builds them
        for level in tl.static_range(LEVELS):
            pairs, row_mask, row_before_mask, col_mask, row, row_before, col = _tl_dplr_level(
                g_c, rows, 1 << level
            )
            q_row, a_row, k_col, b_col = q_c * row, a_c * row_before, k_c * col, b_c * col
            d_qk_l, d_qb_l = tl.where(pairs, d_qk, 0.0), tl.where(pairs, d_qb, 0.0)
            d_ak_l, d_ab_l = tl.where(pairs, d_ak, 0.0), tl.where(pairs, d_ab, 0.0)
            dq_l = tl.dot(d_qk_l, k_col, input_precision="ieee")
            dq_l += tl.dot(d_qb_l, b_col, input_precision="ieee")
            dq_l *= row
            da_l = tl.dot(d_ak_l, k_col, input_precision="ieee")
            da_l += tl.dot(d_ab_l, b_col, input_precision="ieee")
            da_l *= row_before
            dk_l = tl.dot(tl.trans(d_qk_l), q_row, input_precision="ieee")
            dk_l += tl.dot(tl.trans(d_ak_l), a_row, input_precision="ieee")
            dk_l *= col
            db_l = tl.dot(tl.trans(d_qb_l), q_row, input_precision="ieee")
            db_l += tl.dot(tl.trans(d_ab_l), a_row, input_precision="ieee")
            db_l *= col
            if GATE_GRAD:
                dg_c += _tl_dplr_sums(tl.trans(row_mask), q_c * dq_l)
                dg_c += _tl_dplr_sums(tl.trans(row_before_mask), a_c * da_l)
                dg_c += _tl_dplr_sums(tl.trans(col_mask), k_c * dk_l + b_c * db_l)
            dq_c += dq_l
            da_c += da_l
            dk_c += dk_l
            db_c += db_l
        at = (part * T + t[:, None]) * K + cols_k[None, :]
        tl.store(dq + at, dq_c, mask=at_k)
        tl.store(dk + at, dk_c, mask=at_k)
        tl.store(da + at, da_c, mask=at_k)
        tl.store(db + at, db_c, mask=at_k)
        if GATE_GRAD:
            tl.store(dg + at, dg_c, mask=at_k)
        # D <- exp(c_C) ⊙ D + (Q ⊙ exp(c))^T dO + (A ⊙ exp(c_{r-1}))^T dZ
        d_state = d_state * chunk_decay[:, None]
        d_state += tl.dot(tl.trans(q_start), do_c, input_precision="ieee")
        d_state += tl.dot(tl.trans(a_before), d_reads, input_precision="ieee")
    tl.store(dh0 + i_bh * K * V + state_at, d_state, mask=state_in)


def _tl_dplr_forward(q, k, v, a, b, gk, initial_state, chunk_size, keep):
    """(o [B, NH, T, V], final state [B, NH, K, V], and if keep the states entering each chunk
    [B, NH, N, K, V] and T of each chunk [B, NH, N, C, C], else Nones)."""
    batch, heads, length, d_k = q.shape
    d_v = v.shape[-1]
    block_t, block_k, block_v, n_v, n_chunks = _tl_sizes(q, v, chunk_size)
    if initial_state is None:
        initial_state = q.new_zeros(batch, heads, d_k, d_v)
    initial_state = initial_state.to(q.dtype).contiguous()
    o = _tl_new_like_callers(q, d_v)
    final = torch.empty_like(initial_state)
    states = q.new_empty(batch, heads, n_chunks, d_k, d_v) if keep else final
    inverses = q.new_empty(batch, heads, n_chunks, block_t, block_t) if keep else final
    _tl_dplr_fwd[(n_v, batch * heads)](
        q,
        k,
        v,
        a,
        b,
        gk,
        initial_state,
        o,
        final,
        states,
        inverses,
        length,
        heads,
        d_k,
        d_v,
        *_tl_strides(q, 4),
        *_tl_strides(k, 4),
        *_tl_strides(v, 4),
        *_tl_strides(a, 4),
        *_tl_strides(b, 4),
        *_tl_strides(gk, 4),
        *_tl_strides(o, 4),
        KEEP=keep,
        BT=block_t,
        LEVELS=block_t.bit_length() - 1,
        BK=block_k,
        BV=block_v,
    )
    return o, final, (states, inverses) if keep else (None, None)


class _TlDplr(torch.autograd.Function):
    """The fused kernel under autograd: the forward keeps the inputs, the states entering each
    chunk and T; the backward is one launch of _tl_dplr_bwd."""

    @staticmethod
    def forward(ctx, q, k, v, a, b, gk, initial_state, chunk_size):
        o, final, kept = _tl_dplr_forward(q, k, v, a, b, gk, initial_state, chunk_size, True)
        ctx.save_for_backward(q, k, v, a, b, gk, *kept)
        ctx.chunk_size = chunk_size
        return o, final

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_o, d_final):
        q, k, v, a, b, gk, states, inverses = ctx.saved_tensors
        batch, heads, length, d_k = q.shape
        d_v = v.shape[-1]
        block_t, block_k, block_v, n_v, _ = _tl_sizes(q, v, ctx.chunk_size)
        d_final = d_final.to(q.dtype).contiguous()
        d_o = d_o.to(q.dtype)
        parts = [q.new_empty(n_v, batch, heads, length, d_k) for _ in range(4)]
        gate_grad = ctx.needs_input_grad[5]
        dg = q.new_empty(n_v, batch, heads, length, d_k) if gate_grad else parts[0]
        dv = q.new_empty(batch, heads, length, d_v)
        d_initial = torch.empty_like(d_final)
        _tl_dplr_bwd[(n_v, batch * heads)](
            q,
            k,
            v,
            a,
            b,
            gk,
            d_o,
            states,
            inverses,
            d_final,
            *parts[:2],
            dv,
            *parts[2:],
            dg,
            d_initial,
            length,
            heads,
            d_k,
            d_v,
            *_tl_strides(q, 4),
            *_tl_strides(k, 4),
            *_tl_strides(v, 4),
            *_tl_strides(a, 4),
            *_tl_strides(b, 4),
            *_tl_strides(gk, 4),
            *_tl_strides(d_o, 4),
            GATE_GRAD=gate_grad,
            BT=block_t,
            LEVELS=block_t.bit_length() - 1,
            BK=block_k,
            BV=block_v,
        )
        dq, dk, da, db = (x.sum(0) for x in parts)
        d_gate = dg.sum(0) if gate_grad else None
        d_initial = d_initial if ctx.needs_input_grad[6] else None  # None: no initial state
        return dq, dk, dv, da, db, d_gate, d_initial, None


def chunk_dplr(q, k, v, a, b, gk=None, initial_state=None, chunk_size=64):
    """Chunked S_t = (diag(exp(gk_t)) + b_t a_t^T) S_{t-1} + k_t v_t^T, o_t = q_t S_t, as fused
    Triton kernels, forward and backward.

    a, b: [B, NH, T, K]; gk: the log-gate [B, NH, T, K] or [B, NH, T, 1] (one per token, for
    every channel), None: no decay. Returns (o [B, NH, T, V], final state [B, NH, K, V]).
    """
    _tl_check_device(_tl_dplr_fwd, q)
    gk = torch.zeros_like(k) if gk is None else gk.expand_as(k)
    if _needs_grad(q, k, v, a, b, gk, initial_state):
        return _TlDplr.apply(q, k, v, a, b, gk, initial_state, chunk_size)
    o, final, _ = _tl_dplr_forward(q, k, v, a, b, gk, initial_state, chunk_size, False)
    return o, final
