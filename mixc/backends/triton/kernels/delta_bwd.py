"""The backward of the delta-rule Triton kernels (delta.py), in five launches split as
flash-linear-attention splits it, each small enough for its registers. Per chunk, with D the
gradient of the state leaving it, M = tril(Q K^T ⊙ Gamma) and the forward's T, W and V_new:

    dV_new = M^T dO + diag(exp(b_C - b)) K D
    D <- exp(b_C) D + (diag(exp(b)) Q)^T dO - W^T dV_new
    dQ = (dO V_new^T ⊙ Gamma) K + diag(exp(b)) dO S^T,  dW = -dV_new S^T
    dK = (dO V_new^T ⊙ Gamma)^T Q + diag(exp(b_C - b)) V_new D^T + (through T, W and U = T V)

_tl_delta_bwd_local (a program per chunk and value block) writes M^T dO;
_tl_delta_bwd_states (a program per value block) walks the chunks from the last with D's
columns in registers, writing the D leaving each chunk and adding diag(exp(b_C - b)) K D to
dV_new; _tl_delta_bwd_grads (a program per chunk and key block) sums over the value columns
dQ, the keys' gradient through the scores and the state, and dW; _tl_delta_bwd_wy (a program
per chunk) takes dW and dU = dV_new through the UT transform to dV, dA = -T^T dT T^T on A's
support and W's parts of dK, dbeta and dg; _tl_delta_bwd_gram (a program per chunk) takes dA
through A = tril(diag(beta) (K K^T ⊙ Gamma), -1) to the rest of dK, dbeta and dg (one kernel
with both spilled on sm_90: the solve's [BT, BT] tiles beside K K^T and Gamma). The gates'
gradient is a sum of what each decay factor passes on (_tl_pair_grads, _tl_gate_grads): the key
blocks of _tl_delta_bwd_grads write their parts, the UT transform's kernels add theirs to the
first, and the parts are added after the launches.
"""

import torch
import triton
import triton.language as tl

from mixc.backends.triton.kernels.common import (
    _tl_chunk_decays,
    _tl_dot,
    _tl_gate_grads,
    _tl_gates,
    _tl_gradients,
    _tl_launch,
    _tl_load_state,
    _tl_operand,
    _tl_pair_grads,
    _tl_rows,
    _tl_sizes,
    _tl_store_state,
    _tl_strides,
    _tl_tile,
    _tl_tokens,
    _tl_wide,
    _tl_wide_dot,
)


@triton.jit
def _tl_delta_bwd_local(
    q, k, g, do,  # read
    dvn,  # written
    T, NH, K, V,
    sq_b, sq_h, sq_t, sq_d,
    sk_b, sk_h, sk_t, sk_d,
    sg_b, sg_h, sg_t,
    sdo_b, sdo_h, sdo_t, sdo_d,
    HAS_G: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    DOT: tl.constexpr,
):  # fmt: skip
    """One (value block, batch x head, chunk) program, the chunks in parallel: the part of dV_new
    inside the chunk, M^T dO with M = tril(Q K^T ⊙ Gamma), to dvn [B * NH, T, V] (contiguous)."""
    i_bh, n = tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // NH, i_bh % NH
    rows = tl.arange(0, BT)
    cols_k, cols_v = tl.arange(0, BK), tl.program_id(0) * BV + tl.arange(0, BV)
    t, in_t, at_k, at_v = _tl_tokens(n, rows, T, cols_k < K, cols_v < V)
    q_c = _tl_operand(_tl_rows(q, sq_b, sq_h, sq_t, sq_d, i_b, i_h, t, cols_k, at_k), DOT)
    k_c = _tl_operand(_tl_rows(k, sk_b, sk_h, sk_t, sk_d, i_b, i_h, t, cols_k, at_k), DOT)
    scores = _tl_dot(q_c, tl.trans(k_c), DOT)
    if HAS_G:
        gamma, _, _, _ = _tl_chunk_decays(_tl_gates(g, sg_b, sg_h, sg_t, i_b, i_h, t, in_t), rows)
        scores = scores * gamma
    scores = tl.where(rows[:, None] >= rows[None, :], scores, 0.0)
    do_c = _tl_operand(_tl_rows(do, sdo_b, sdo_h, sdo_t, sdo_d, i_b, i_h, t, cols_v, at_v), DOT)
    at = dvn + (i_bh * T + t[:, None]) * V + cols_v[None, :]
    tl.store(at, _tl_dot(tl.trans(scores), do_c, DOT), mask=at_v)


@triton.jit
def _tl_delta_bwd_states(
    q, k, g, do, w, dht,  # read
    dvn, dhs, dh0,  # written (dvn read first: the local part)
    T, NH, K, V,
    sq_b, sq_h, sq_t, sq_d,
    sk_b, sk_h, sk_t, sk_d,
    sg_b, sg_h, sg_t,
    sdo_b, sdo_h, sdo_t, sdo_d,
    sw_b, sw_h, sw_t, sw_d,
    HAS_G: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    DOT: tl.constexpr,
):  # fmt: skip
    """One (value block, batch x head) program: the chunks from the last, D's BV columns in
    registers. Per chunk: D (the gradient of the state leaving it) to dhs [B * NH, N, K, V],
    dV_new = M^T dO (dvn, as _tl_delta_bwd_local wrote it) + diag(exp(b_C - b)) K D back to
    dvn, then D <- exp(b_C) D + (diag(exp(b)) Q)^T dO - W^T dV_new. dht, dh0: [B * NH, K, V];
    all contiguous."""
    i_bh = tl.program_id(1)
    i_b, i_h = i_bh // NH, i_bh % NH
    rows = tl.arange(0, BT)
    cols_k, cols_v = tl.arange(0, BK), tl.program_id(0) * BV + tl.arange(0, BV)
    in_k, in_v = cols_k < K, cols_v < V
    d_state = _tl_load_state(dht, i_bh, K, V, cols_k, cols_v)
    n_chunks = (T + BT - 1) // BT
    for m in range(0, n_chunks):
        n = n_chunks - 1 - m
        t, in_t, at_k, at_v = _tl_tokens(n, rows, T, in_k, in_v)
        _tl_store_state(dhs, i_bh * n_chunks + n, K, V, cols_k, cols_v, d_state)
        q_c = _tl_operand(_tl_rows(q, sq_b, sq_h, sq_t, sq_d, i_b, i_h, t, cols_k, at_k), DOT)
        k_c = _tl_operand(_tl_rows(k, sk_b, sk_h, sk_t, sk_d, i_b, i_h, t, cols_k, at_k), DOT)
        w_c = _tl_operand(_tl_rows(w, sw_b, sw_h, sw_t, sw_d, i_b, i_h, t, cols_k, at_k), DOT)
        do_c = _tl_operand(_tl_rows(do, sdo_b, sdo_h, sdo_t, sdo_d, i_b, i_h, t, cols_v, at_v), DOT)
        at = dvn + (i_bh * T + t[:, None]) * V + cols_v[None, :]
        d_v_new = tl.load(at, mask=at_v, other=0.0)
        if HAS_G:
            g_c = _tl_gates(g, sg_b, sg_h, sg_t, i_b, i_h, t, in_t)
            _, from_start, to_end, chunk_decay = _tl_chunk_decays(g_c, rows)
            d_v_new += _tl_dot(k_c * to_end, d_state, DOT)
            d_state = d_state * chunk_decay
            d_state += _tl_dot(tl.trans(q_c * from_start), do_c, DOT)
        else:
            d_v_new += _tl_dot(k_c, d_state, DOT)
            d_state += _tl_dot(tl.trans(q_c), do_c, DOT)
        tl.store(at, d_v_new, mask=at_v)
        d_state -= _tl_dot(tl.trans(w_c), d_v_new, DOT)
    _tl_store_state(dh0, i_bh, K, V, cols_k, cols_v, d_state)


@triton.jit
def _tl_delta_output_gate_grads(
    q_c, k_c, d_scores, from_q, from_k, whole, gamma, chunk_decay, rows, DOT: tl.constexpr
):  # fmt: skip
    """A key block's part of the gates' gradient [BT] (_tl_gate_grads) from Gamma in M (its
    part of M ⊙ dM: Q K^T ⊙ Gamma over its columns), exp(b) in Q S (from_q: dO S^T decayed),
    exp(b_C - b) in the state's write (from_k: V_new D^T decayed) and exp(b_C) (whole: the
    rows of S ⊙ D, summed over the value columns)."""
    scores = _tl_dot(q_c, tl.trans(k_c), DOT) * gamma
    scores = tl.where(rows[:, None] >= rows[None, :], scores, 0.0)
    starts = tl.sum(_tl_wide(q_c) * from_q, axis=1)
    ends = tl.sum(_tl_wide(k_c) * from_k, axis=1)
    pairs = _tl_pair_grads(d_scores * scores, rows)
    return _tl_gate_grads(pairs, starts, ends, tl.sum(whole, axis=0) * chunk_decay, rows)


@triton.jit
def _tl_delta_bwd_grads(
    q, k, g, do, hs, dhs, v_new, dvn,  # read
    dq, dk, dw, dg,  # written
    T, NH, K, V,
    sq_b, sq_h, sq_t, sq_d,
    sk_b, sk_h, sk_t, sk_d,
    sg_b, sg_h, sg_t,
    sdo_b, sdo_h, sdo_t, sdo_d,
    su_b, su_h, su_t, su_d,
    HAS_G: tl.constexpr, GATE_GRAD: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """One (key block, batch x head, chunk) program, the chunks in parallel, the value columns
    BV at a time: dQ, the keys' gradient through the scores and the state (dk; the UT
    transform's part is added later), dW = -dV_new S^T (at float32's accuracy: the solve's
    gradients cancel) and, if GATE_GRAD, this key block's part of the gates' gradient
    (_tl_delta_output_gate_grads). dq, dk, dw [B * NH, T, K], dg [NK, B * NH, T]: contiguous."""
    i_k, i_bh, n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h, i_state = i_bh // NH, i_bh % NH, i_bh * ((T + BT - 1) // BT) + n
    rows = tl.arange(0, BT)
    cols_k = i_k * BK + tl.arange(0, BK)
    t, in_t, at_k, _ = _tl_tokens(n, rows, T, cols_k < K, cols_k < K)
    d_scores = tl.zeros((BT, BT), dtype=hs.dtype.element_ty)  # dM = dO V_new^T
    zeros = tl.zeros((BT, BK), dtype=d_scores.dtype)
    from_q, from_k, d_w = zeros, zeros, zeros  # dO S^T, V_new D^T, dW
    whole = tl.zeros((BK,), dtype=d_scores.dtype)  # the rows of S ⊙ D, summed over the columns
    for j in range(0, (V + BV - 1) // BV):
        cols_v = j * BV + tl.arange(0, BV)
        at_v = in_t[:, None] & (cols_v < V)[None, :]
        do_j = _tl_operand(_tl_rows(do, sdo_b, sdo_h, sdo_t, sdo_d, i_b, i_h, t, cols_v, at_v), DOT)
        vn_j = _tl_operand(_tl_rows(v_new, su_b, su_h, su_t, su_d, i_b, i_h, t, cols_v, at_v), DOT)
        state = _tl_load_state(hs, i_state, K, V, cols_k, cols_v)
        d_state = _tl_load_state(dhs, i_state, K, V, cols_k, cols_v)
        d_scores += _tl_dot(do_j, tl.trans(vn_j), DOT)
        from_q += _tl_dot(do_j, tl.trans(state), DOT)
        from_k += _tl_dot(vn_j, tl.trans(d_state), DOT)
        d_v_new = tl.load(dvn + (i_bh * T + t[:, None]) * V + cols_v[None, :], mask=at_v, other=0.0)
        d_w -= _tl_wide_dot(d_v_new, tl.trans(state), DOT)
        whole += tl.sum(state * d_state, axis=1)
    at = (i_bh * T + t[:, None]) * K + cols_k[None, :]  # in dq, dk and dw
    tl.store(dw + at, d_w, mask=at_k)
    q_c = _tl_operand(_tl_rows(q, sq_b, sq_h, sq_t, sq_d, i_b, i_h, t, cols_k, at_k), DOT)
    k_c = _tl_operand(_tl_rows(k, sk_b, sk_h, sk_t, sk_d, i_b, i_h, t, cols_k, at_k), DOT)
    causal = rows[:, None] >= rows[None, :]
    if HAS_G:
        gates = _tl_gates(g, sg_b, sg_h, sg_t, i_b, i_h, t, in_t)
        gamma, from_start, to_end, chunk_decay = _tl_chunk_decays(gates, rows)
        d_qk = tl.where(causal, d_scores * gamma, 0.0)
        from_q = from_q * from_start
        from_k = from_k * to_end
    else:
        d_qk = tl.where(causal, d_scores, 0.0)
    tl.store(dq + at, _tl_dot(d_qk, k_c, DOT) + from_q, mask=at_k)
    tl.store(dk + at, _tl_dot(tl.trans(d_qk), q_c, DOT) + from_k, mask=at_k)
    if HAS_G:
        if GATE_GRAD:
            d_g = _tl_delta_output_gate_grads(
                q_c, k_c, d_scores, from_q, from_k, whole, gamma, chunk_decay, rows, DOT
            )  # fmt: skip
            tl.store(dg + (i_k * tl.num_programs(1) + i_bh) * T + t, d_g, mask=in_t)


@triton.jit
def _tl_delta_loop_inverse(inverse_t, ts, i_tile, rows, DOT: tl.constexpr):
    """T^T of a chunk (tile i_tile of ts) for a product inside a loop: inverse_t, loaded once
    before it, where the products take their operand from shared memory (the tensor cores);
    loaded again for IEEE products, whose operand fragments, in registers, were otherwise held
    across the loop (float32 spilled 36 / 4 B on sm_90 / sm_100 at parts of 32, 0 / 12 B at
    16; loaded again, 0 / 0 B)."""
    if DOT == "ieee" or DOT == "ieee16":
        inverse_t = tl.trans(tl.load(_tl_tile(ts, i_tile, rows)))
    return inverse_t


@triton.jit
def _tl_delta_bwd_wy(
    k, v, beta, g, ts, dw, dvn,  # read
    dk, dv, dbeta, das,  # written (dk added to)
    T, NH, K, V,
    sk_b, sk_h, sk_t, sk_d,
    sv_b, sv_h, sv_t, sv_d,
    sb_b, sb_h, sb_t,
    sg_b, sg_h, sg_t,
    HAS_G: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """One (chunk, batch x head) program, the chunks in parallel: the gradients through the UT
    transform W = T diag(beta exp(b)) K, U = T V, T = (I + A)^{-1} from dW (dw) and
    dU = dV_new (dvn), BV columns at a time: dT = dU V^T + dW (diag(beta exp(b)) K)^T,
    dV = T^T dU, the keys' gradient through diag(beta exp(b)) K (added to dk), beta's through
    it (to dbeta; the gates' through its exp(b) follows from it, in _tl_delta_bwd_gram) and
    dA = -T^T dT T^T on A's strictly lower support, to das [B * NH, N, BT, BT] (contiguous).
    The solve's products at float32's accuracy (_tl_wide_dot)."""
    n, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // NH, i_bh % NH
    rows = tl.arange(0, BT)
    t = n * BT + rows
    in_t = t < T
    beta_c = _tl_wide(tl.load(beta + i_b * sb_b + i_h * sb_h + t * sb_t, mask=in_t, other=0.0))
    i_tile = i_bh * ((T + BT - 1) // BT) + n  # the chunk's tile in ts and das
    inverse_t = tl.trans(tl.load(_tl_tile(ts, i_tile, rows)))
    if HAS_G:
        g_c = _tl_gates(g, sg_b, sg_h, sg_t, i_b, i_h, t, in_t)
        from_start = tl.exp(tl.cumsum(g_c, axis=0))[:, None]
    else:
        from_start = 1.0
    scale = beta_c[:, None] * from_start  # the rows of diag(beta exp(b)) K
    d_t = tl.zeros((BT, BT), dtype=inverse_t.dtype)
    for j in range(0, (V + BV - 1) // BV):
        cols = j * BV + tl.arange(0, BV)
        at = in_t[:, None] & (cols < V)[None, :]
        at_rows = (i_bh * T + t[:, None]) * V + cols[None, :]  # in dvn and dv
        d_u = tl.load(dvn + at_rows, mask=at, other=0.0)
        v_j = _tl_rows(v, sv_b, sv_h, sv_t, sv_d, i_b, i_h, t, cols, at)
        d_t += _tl_wide_dot(d_u, tl.trans(v_j), DOT)
        inverse_j = _tl_delta_loop_inverse(inverse_t, ts, i_tile, rows, DOT)
        tl.store(dv + at_rows, _tl_wide_dot(inverse_j, d_u, DOT), mask=at)
    beta_in_w = tl.zeros((BT,), dtype=inverse_t.dtype)  # beta in diag(beta exp(b)) K
    for j in range(0, (K + BV - 1) // BV):
        cols = j * BV + tl.arange(0, BV)
        at = in_t[:, None] & (cols < K)[None, :]
        k_j = _tl_rows(k, sk_b, sk_h, sk_t, sk_d, i_b, i_h, t, cols, at)
        at_rows = (i_bh * T + t[:, None]) * K + cols[None, :]  # in dw and dk
        d_w = tl.load(dw + at_rows, mask=at, other=0.0)
        d_t += _tl_wide_dot(d_w, tl.trans(k_j * scale), DOT)
        inverse_j = _tl_delta_loop_inverse(inverse_t, ts, i_tile, rows, DOT)
        d_k_scaled = _tl_wide_dot(inverse_j, d_w, DOT)
        beta_in_w += tl.sum(d_k_scaled * (k_j * from_start), axis=1)
        dk_j = tl.load(dk + at_rows, mask=at, other=0.0) + d_k_scaled * scale
        tl.store(dk + at_rows, dk_j, mask=at)
    tl.store(dbeta + i_bh * T + t, beta_in_w, mask=in_t)
    d_a = -_tl_wide_dot(inverse_t, _tl_wide_dot(d_t, inverse_t, DOT), DOT)
    d_a = tl.where(rows[:, None] > rows[None, :], d_a, 0.0)
    tl.store(_tl_tile(das, i_tile, rows), d_a)


@triton.jit
def _tl_delta_bwd_gram(
    k, beta, g, das,  # read
    dk, dbeta, dg,  # added to (dg: its first part)
    T, NH, K, V,
    sk_b, sk_h, sk_t, sk_d,
    sb_b, sb_h, sb_t,
    sg_b, sg_h, sg_t,
    HAS_G: tl.constexpr, GATE_GRAD: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
    DOT: tl.constexpr,
):  # fmt: skip
    """One (chunk, batch x head) program, the chunks in parallel: from dA (das, as
    _tl_delta_bwd_wy wrote it) the gradients through A = tril(diag(beta) (K K^T ⊙ Gamma), -1):
    beta's (added to dbeta), the keys' (added to dk) and the gates' from Gamma and from exp(b)
    in W (beta's part through W, dbeta as _tl_delta_bwd_wy wrote it, times beta), added to dg's
    first part. K K^T and the keys' gradient BV key columns at a time (the whole [BT, K] keys
    beside the [BT, BT] tiles spilled in float32)."""
    n, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // NH, i_bh % NH
    rows = tl.arange(0, BT)
    t = n * BT + rows
    in_t = t < T
    beta_c = _tl_wide(tl.load(beta + i_b * sb_b + i_h * sb_h + t * sb_t, mask=in_t, other=0.0))
    d_a = tl.load(_tl_tile(das, i_bh * ((T + BT - 1) // BT) + n, rows))
    beta_in_w = tl.load(dbeta + i_bh * T + t, mask=in_t, other=0.0)  # W's part
    kk = tl.zeros((BT, BT), dtype=d_a.dtype)  # K K^T, BV key columns at a time
    for j in range(0, (K + BV - 1) // BV):
        cols = j * BV + tl.arange(0, BV)
        at = in_t[:, None] & (cols < K)[None, :]
        k_j = _tl_operand(_tl_rows(k, sk_b, sk_h, sk_t, sk_d, i_b, i_h, t, cols, at), DOT)
        kk += _tl_dot(k_j, tl.trans(k_j), DOT)
    d_kk = d_a * beta_c[:, None]  # the gradient of K K^T ⊙ Gamma
    if HAS_G:
        gamma, _, _, _ = _tl_chunk_decays(_tl_gates(g, sg_b, sg_h, sg_t, i_b, i_h, t, in_t), rows)
        kk = kk * gamma
        d_kk_raw = d_kk * gamma
        if GATE_GRAD:
            starts = beta_in_w * beta_c  # [i, l]: exp(b_i) in W holds g_l for l <= i
            d_g = _tl_pair_grads(d_kk * kk, rows)
            d_g += tl.sum(tl.where(rows[:, None] >= rows[None, :], starts[:, None], 0.0), axis=0)
            d_g += tl.load(dg + i_bh * T + t, mask=in_t, other=0.0)
            tl.store(dg + i_bh * T + t, d_g, mask=in_t)
    else:
        d_kk_raw = d_kk
    tl.store(dbeta + i_bh * T + t, tl.sum(d_a * kk, axis=1) + beta_in_w, mask=in_t)
    d_kk_raw = d_kk_raw + tl.trans(d_kk_raw)
    for j in range(0, (K + BV - 1) // BV):
        cols = j * BV + tl.arange(0, BV)
        at = in_t[:, None] & (cols < K)[None, :]
        k_j = _tl_rows(k, sk_b, sk_h, sk_t, sk_d, i_b, i_h, t, cols, at)
        at_rows = (i_bh * T + t[:, None]) * K + cols[None, :]
        dk_j = tl.load(dk + at_rows, mask=at, other=0.0) + _tl_dot(d_kk_raw, k_j, DOT)
        tl.store(dk + at_rows, dk_j, mask=at)


def _tl_delta_backward(q, k, v, beta, g, kept, d_o, d_final, chunk_size, dot, gate_grad):
    """The gradients (dq, dk, dv, dbeta, dg or None, d_initial) of chunk_delta's inputs from
    d_o and d_final, what the forward kept (kept: the states entering each chunk, T, W, V_new)
    and its products' precision dot: five launches (see the module's docstring)."""
    states, inverses, w, v_new = kept
    batch, heads, length, d_k = q.shape
    sizes = (length, heads, d_k, v.shape[-1])
    d_o, d_final, dq, dk, dv, d_initial = _tl_gradients(q, v, d_o, d_final, 1)
    dq, dk, d_v_new, d_states = dq[0], dk[0], torch.empty_like(dv), torch.empty_like(states)
    d_w, dbeta = torch.empty_like(dk), dv.new_empty(batch, heads, length)
    gate, gate_strides = q if g is None else g, _tl_strides(g, 3)
    common = {"HAS_G": g is not None}
    local, states_pass = _tl_delta_bwd_local, _tl_delta_bwd_states
    block_t, block_k, block_v, grid, n_chunks = _tl_sizes(q, v, chunk_size, local, dot)
    common["BT"] = block_t
    local[(grid[0], batch * heads, n_chunks)](
        q, k, gate, d_o, d_v_new, *sizes, *q.stride(), *k.stride(), *gate_strides,
        *d_o.stride(), BK=block_k, BV=block_v, **common, **_tl_launch(local, dot),
    )  # fmt: skip
    _, block_k, block_v, grid, _ = _tl_sizes(q, v, chunk_size, states_pass, dot)
    states_pass[grid[:2]](
        q, k, gate, d_o, w, d_final, d_v_new, d_states, d_initial, *sizes, *q.stride(),
        *k.stride(), *gate_strides, *d_o.stride(), *w.stride(),
        BK=block_k, BV=block_v, **common, **_tl_launch(states_pass, dot),
    )  # fmt: skip
    grads, wy = _tl_delta_bwd_grads, _tl_delta_bwd_wy
    _, block_k, block_v, grid, _ = _tl_sizes(q, v, chunk_size, grads, dot)
    dg = dv.new_empty(grid[2], batch, heads, length) if gate_grad else dbeta
    grads[(grid[2], batch * heads, n_chunks)](
        q, k, gate, d_o, states, d_states, v_new, d_v_new, dq, dk, d_w, dg, *sizes,
        *q.stride(), *k.stride(), *gate_strides, *d_o.stride(), *v_new.stride(),
        GATE_GRAD=gate_grad, BK=block_k, BV=block_v, **common, **_tl_launch(grads, dot),
    )  # fmt: skip
    d_as = torch.empty_like(inverses)
    wy[(n_chunks, batch * heads)](
        k, v, beta, gate, inverses, d_w, d_v_new, dk, dv, dbeta, d_as, *sizes, *k.stride(),
        *v.stride(), *beta.stride(), *gate_strides,
        BV=_tl_sizes(q, v, chunk_size, wy, dot)[2], **common, **_tl_launch(wy, dot),
    )  # fmt: skip
    gram = _tl_delta_bwd_gram
    gram[(n_chunks, batch * heads)](
        k, beta, gate, d_as, dk, dbeta, dg, *sizes, *k.stride(), *beta.stride(), *gate_strides,
        GATE_GRAD=gate_grad, BV=_tl_sizes(q, v, chunk_size, gram, dot)[2], **common,
        **_tl_launch(gram, dot),
    )  # fmt: skip
    return dq, dk, dv, dbeta, dg.sum(0) if gate_grad else None, d_initial
