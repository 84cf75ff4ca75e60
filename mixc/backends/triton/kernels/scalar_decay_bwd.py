"""The backward of the scalar-decay Triton kernel (scalar_decay.py), in two launches as the
diagonal backward (diagonal_bwd.py), each small enough for its registers; one fused launch
spilled on sm_90 in bfloat16. Per chunk, with S the state entering it (kept by the forward), D
the gradient of the state leaving it, b the gates' running sum inside the chunk,
P = Q K^T ⊙ Gamma and dA = (dO V^T) ⊙ Gamma (the same formulas as the PyTorch kernel's
backward):

    D <- exp(b_C) D + (diag(exp(b)) Q)^T dO
    dV = P^T dO + diag(exp(b_C - b)) K D        dQ = dA K + diag(exp(b)) dO S^T
    dK = dA^T Q + diag(exp(b_C - b)) V D^T

The launches are the diagonal's (_tl_diagonal_backward): the pass over the chunks from the last
is its _tl_diagonal_bwd_states (SCALAR: one log-gate a token); _tl_scalar_decay_bwd_grads (a program
per chunk and key block, the chunks in parallel) sums dO V^T, dO S^T, V D^T and the rows of
S ⊙ D over the value columns, BV at a time (_tl_chunk_value_sums), writes dQ and dK whole and
its key block's part of the gate's gradient, then, the value columns again, its key block's
part of dV (_tl_chunk_value_grads); the parts are added after the launch. The gate's gradient
sums what each decay factor passes on, as the PyTorch kernel's _gate_grads does.
"""

import triton
import triton.language as tl

from mixc.backends.triton.kernels.common import (
    _tl_chunk_decays,
    _tl_dot,
    _tl_gate_grads,
    _tl_gates,
    _tl_operand,
    _tl_pair_grads,
    _tl_rows,
    _tl_store_rows,
    _tl_tokens,
)
from mixc.backends.triton.kernels.diagonal_bwd import _tl_chunk_value_grads, _tl_chunk_value_sums


@triton.jit
def _tl_scalar_decay_chunk_grad(
    q_c, k_c, g_c, d_probs, from_q, from_k, whole, rows,
    HAS_G: tl.constexpr, GATE_GRAD: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """One chunk's gradients over a program's key columns, from its queries and keys q_c, k_c
    [BT, BK], its log-gates g_c [BT] (read only if HAS_G) and the sums over the value columns
    (_tl_chunk_value_sums: dO V^T, dO S^T, V D^T, the rows of S ⊙ D): (dQ, dK, this key block's
    part of the gate's gradient [BT] (zeros unless GATE_GRAD), P in float32 (dV's P^T dO splits
    it, _tl_chunk_value_grads: rounded once, a token's own score cost Mamba-2's dt gradient
    6.1e-3 against the bfloat16 bound 5.1e-3), and exp(b_C - b) [BT, 1])."""
    causal = rows[:, None] >= rows[None, :]  # [i, j]: i >= j
    probs = _tl_dot(q_c, tl.trans(k_c), DOT)
    dg_c = tl.zeros((rows.shape[0],), dtype=d_probs.dtype)
    to_end = tl.full((rows.shape[0], 1), 1.0, dtype=d_probs.dtype)
    if HAS_G:
        # the decays scale the rows of the products, not the [BT, BK] queries and keys
        gamma, from_start, to_end, chunk_decay = _tl_chunk_decays(g_c, rows)
        probs = tl.where(causal, probs * gamma, 0.0)
        from_q, from_k = from_q * from_start, from_k * to_end
        if GATE_GRAD:
            # g_l is in Gamma_ij for j < l <= i, in exp(b_i) for l <= i (q_i . (dO S^T)_i,
            # which sums against terms it cancels: dO S^T at about float32's accuracy, else
            # Mamba-2's dt fails the bfloat16 fuzz), in exp(b_C - b_j) for j < l
            # (k_j . (V D^T)_j), in exp(b_C) for every l
            pairs = _tl_pair_grads(d_probs * probs, rows)
            starts = tl.sum(q_c * from_q, axis=1)
            ends = tl.sum(k_c * from_k, axis=1)
            whole = tl.sum(whole, axis=0) * chunk_decay
            dg_c = _tl_gate_grads(pairs, starts, ends, whole, rows)
        d_probs = d_probs * gamma
    else:
        probs = tl.where(causal, probs, 0.0)
    d_scores = _tl_operand(tl.where(causal, d_probs, 0.0), DOT)  # dA, rounded once
    dq_c = _tl_dot(d_scores, k_c, DOT) + from_q
    dk_c = _tl_dot(tl.trans(d_scores), q_c, DOT) + from_k
    return dq_c, dk_c, dg_c, probs, to_end


@triton.jit
def _tl_scalar_decay_bwd_grads(
    q, k, v, g, do, hs, dhs,  # read
    dq, dk, dv, dg,  # written
    T, NH, K, V,
    sq_b, sq_h, sq_t, sq_d,
    sk_b, sk_h, sk_t, sk_d,
    sv_b, sv_h, sv_t, sv_d,
    sg_b, sg_h, sg_t,
    sdo_b, sdo_h, sdo_t, sdo_d,
    HAS_G: tl.constexpr, GATE_GRAD: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """One (key block, batch x head, chunk) program, the value columns BV at a time: dQ and dK
    [B * NH, T, K], this key block's part of dg [NK * B * NH, T] (GATE_GRAD), then its part of
    dV [NK * B * NH, T, V]; hs, dhs: the states entering, gradients leaving each chunk
    [B * NH, N, K, V]; all contiguous."""
    i_k, i_bh, n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h, i_state = i_bh // NH, i_bh % NH, i_bh * tl.cdiv(T, BT) + n
    part = i_k * tl.num_programs(1) + i_bh  # this key block's of dg and dv
    rows, cols_k = tl.arange(0, BT), i_k * BK + tl.arange(0, BK)
    t, in_t, at_k, _ = _tl_tokens(n, rows, T, cols_k < K, cols_k < K)
    d_probs, from_q, from_k, whole = _tl_chunk_value_sums(
        v, do, hs, dhs, sv_b, sv_h, sv_t, sv_d, sdo_b, sdo_h, sdo_t, sdo_d, i_b, i_h, i_state,
        t, in_t, cols_k, K, V, GATE_GRAD, BV, DOT,
    )  # fmt: skip
    q_c = _tl_operand(_tl_rows(q, sq_b, sq_h, sq_t, sq_d, i_b, i_h, t, cols_k, at_k), DOT)
    k_c = _tl_operand(_tl_rows(k, sk_b, sk_h, sk_t, sk_d, i_b, i_h, t, cols_k, at_k), DOT)
    if HAS_G:
        g_c = _tl_gates(g, sg_b, sg_h, sg_t, i_b, i_h, t, in_t)
    else:
        g_c = tl.zeros((BT,), dtype=d_probs.dtype)  # never read
    dq_c, dk_c, dg_c, probs, to_end = _tl_scalar_decay_chunk_grad(
        q_c, k_c, g_c, d_probs, from_q, from_k, whole, rows, HAS_G, GATE_GRAD, DOT
    )
    _tl_store_rows(dq, i_bh, T, K, t, cols_k, at_k, dq_c)
    _tl_store_rows(dk, i_bh, T, K, t, cols_k, at_k, dk_c)
    if GATE_GRAD:
        tl.store(dg + part * T + t, dg_c, mask=in_t)
    k_end = _tl_operand(k_c * to_end, DOT)  # diag(exp(b_C - b)) K
    _tl_chunk_value_grads(
        do, dhs, dv, sdo_b, sdo_h, sdo_t, sdo_d, i_b, i_h, i_state, part, t, in_t, cols_k, T, K,
        V, probs, k_end, True, BV, DOT,
    )  # fmt: skip
