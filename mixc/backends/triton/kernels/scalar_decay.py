"""The Triton kernel of the scalar-decay class: S_t = exp(g_t) S_{t-1} + k_t v_t^T,
o_t = q_t S_t, one log-gate g_t per token and head (g None: linear attention). The same chunked
form as the PyTorch kernel (docs/algorithms.md, "Scalar decay"), fused: one program per
(batch, head, block of value columns, block of key rows) walks the chunks in order, keeping its
tile of the state in registers; the key rows are independent, so each key block's output is its
part of O (Q K^T and Q S are sums over the key columns), and the parts are added after the
launch, as are those of dV.

Forward, per chunk, with b the gates' running sum inside the chunk:
    O = (Q K^T ⊙ Gamma) V + diag(exp(b)) Q S,    S <- exp(b_C) S + (diag(exp(b_C - b)) K)^T V
Backward, from the last chunk, with the states entering each chunk kept by the forward and D the
gradient of the state leaving the chunk (the same formulas as the PyTorch kernel's backward):
    dV = P^T dO + diag(exp(b_C - b)) K D        dQ = dA K + diag(exp(b)) dO S^T
    dK = dA^T Q + diag(exp(b_C - b)) V D^T      D <- exp(b_C) D + (diag(exp(b)) Q)^T dO
with P = Q K^T ⊙ Gamma and dA = (dO V^T) ⊙ Gamma; the gate's gradient sums what each decay
factor passes on, as the PyTorch kernel's _gate_grads does. dQ, dK and dg sum over the value
columns: each block of columns writes its part and the parts are added after the launch.

Masks select (tl.where), never multiply by 0; a value that is not finite poisons its column's
outputs from its token on and the state, as the recurrence does, without reaching earlier tokens
through the products inside the chunk.
"""

import torch
import triton
import triton.language as tl

from mixc.backends.pytorch.kernels.common import _needs_grad
from mixc.backends.triton.kernels.common import (
    _tl_check_device,
    _tl_chunk_decays,
    _tl_columns,
    _tl_dot,
    _tl_dot_precision,
    _tl_finite,
    _tl_gate_grads,
    _tl_gates,
    _tl_gradients,
    _tl_launch,
    _tl_load_state,
    _tl_operand,
    _tl_outputs,
    _tl_pair_grads,
    _tl_put_rows,
    _tl_round_bf16,
    _tl_rows,
    _tl_sizes,
    _tl_store_rows,
    _tl_store_state,
    _tl_strides,
    _tl_sum_parts,
    _tl_tokens,
    _tl_wide_dot,
)


@triton.jit
def _tl_scalar_decay_chunk(q_c, k_c, v_c, g_c, state, rows, HAS_G: tl.constexpr, DOT: tl.constexpr):
    """One chunk of the forward: (its outputs O = (Q K^T ⊙ Gamma) V + diag(exp(b)) Q S, the
    state leaving it exp(b_C) S + (diag(exp(b_C - b)) K)^T V), from its queries, keys and values,
    its log-gates g_c [BT] (read only if HAS_G) and the state S entering it. A value that is not
    finite poisons its column's outputs from its token on and the state."""
    causal = rows[:, None] >= rows[None, :]
    scores = _tl_dot(q_c, tl.trans(k_c), DOT)
    v_c, poison = _tl_finite(v_c)  # the poison reaches the outputs from its token on
    from_state = _tl_dot(q_c, state, DOT)  # Q S
    written = v_c
    if HAS_G:
        # the decays scale the rows of the products (diag(exp(b)) (Q S), K^T (diag(exp(b_C -
        # b)) V)), not the [BT, BK] queries and keys: fewer registers, the same sums
        gamma, from_start, to_end, chunk_decay = _tl_chunk_decays(g_c, rows)
        scores = scores * gamma
        from_state = from_state * from_start
        written = v_c * to_end
        state = state * chunk_decay
    scores = tl.where(causal, scores, 0.0)
    out = _tl_dot(scores, v_c, DOT) + from_state
    out += tl.cumsum(poison, axis=0)
    state += _tl_dot(tl.trans(k_c), written, DOT)
    state += tl.sum(poison, axis=0)[None, :]
    return out, state


@triton.jit
def _tl_scalar_decay_fwd(
    q, k, v, g, h0,  # read
    o, ht, hs,  # written
    T, NH, K, V,
    sq_b, sq_h, sq_t, sq_d,
    sk_b, sk_h, sk_t, sk_d,
    sv_b, sv_h, sv_t, sv_d,
    sg_b, sg_h, sg_t,
    so_b, so_h, so_t, so_d,
    HAS_G: tl.constexpr, KEEP: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """One (value block, batch x head, key block) program: the chunks in order, its block of
    the state in registers (_tl_scalar_decay_chunk). o: one part per key block [NK * B, NH, T,
    V] (strided); h0, ht: [B * NH, K, V] contiguous; hs (KEEP): the states entering each chunk,
    [B * NH, N, K, V]."""
    i_bh = tl.program_id(1)
    i_b, i_h = i_bh // NH, i_bh % NH
    rows = tl.arange(0, BT)
    cols_k, cols_v, in_k, in_v = _tl_columns(K, V, BK, BV)
    state = _tl_load_state(h0, i_bh, K, V, cols_k, cols_v)
    n_chunks = tl.cdiv(T, BT)
    part = tl.program_id(2) * (tl.num_programs(1) // NH) + i_b  # this key block's part of o
    for n in range(0, n_chunks):
        t, in_t, at_k, at_v = _tl_tokens(n, rows, T, in_k, in_v)
        q_c = _tl_operand(_tl_rows(q, sq_b, sq_h, sq_t, sq_d, i_b, i_h, t, cols_k, at_k), DOT)
        k_c = _tl_operand(_tl_rows(k, sk_b, sk_h, sk_t, sk_d, i_b, i_h, t, cols_k, at_k), DOT)
        v_c = _tl_operand(_tl_rows(v, sv_b, sv_h, sv_t, sv_d, i_b, i_h, t, cols_v, at_v), DOT)
        if HAS_G:
            g_c = _tl_gates(g, sg_b, sg_h, sg_t, i_b, i_h, t, in_t)
        else:
            g_c = tl.zeros((BT,), dtype=state.dtype)  # never read
        if KEEP:
            _tl_store_state(hs, i_bh * n_chunks + n, K, V, cols_k, cols_v, state)
        out, state = _tl_scalar_decay_chunk(q_c, k_c, v_c, g_c, state, rows, HAS_G, DOT)
        _tl_put_rows(o, so_b, so_h, so_t, so_d, part, i_h, t, cols_v, at_v, out)
    _tl_store_state(ht, i_bh, K, V, cols_k, cols_v, state)


@triton.jit
def _tl_split_dot(a, b, DOT: tl.constexpr):
    """a @ b for an a exact in DOT's 16-bit dtype (a 16-bit input) and a float32 b, at about
    float32's accuracy: for bfloat16 operands b is the sum of two bfloat16 parts (16 bits of its
    mantissa), two products on the tensor cores, emulated as such under the interpreter; for
    the others as _tl_wide_dot."""
    if DOT == "bf16":
        high = b.to(tl.bfloat16)
        low = (b - high.to(tl.float32)).to(tl.bfloat16)
        product = tl.dot(a.to(tl.bfloat16), high, out_dtype=tl.float32)
        product = tl.dot(a.to(tl.bfloat16), low, acc=product, out_dtype=tl.float32)
    elif DOT == "bf16 emulated":
        high = _tl_round_bf16(b)
        product = _tl_dot(a, high, DOT) + _tl_dot(a, b - high, DOT)
    else:
        product = _tl_wide_dot(a, b, DOT)
    return product


@triton.jit
def _tl_scalar_decay_chunk_grad(
    q_c, k_c, v_c, do_c, g_c, state, d_state, rows,
    HAS_G: tl.constexpr, GATE_GRAD: tl.constexpr, BT: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """One chunk of the backward, from its inputs, the output gradient do_c, the state S
    entering it (kept by the forward) and the gradient D of the state leaving it: (dQ, dK, dV,
    the gate's gradient dg [BT] (zeros unless GATE_GRAD), the gradient of the state entering
    the chunk). With P = Q K^T ⊙ Gamma and dA = (dO V^T) ⊙ Gamma:
        dV = P^T dO + diag(exp(b_C - b)) K D        dQ = dA K + diag(exp(b)) dO S^T
        dK = dA^T Q + diag(exp(b_C - b)) V D^T      D <- exp(b_C) D + (diag(exp(b)) Q)^T dO
    """
    causal = rows[:, None] >= rows[None, :]  # [i, j]: i >= j
    # the decays scale the rows of the products, not the [BT, BK] queries and keys (fewer
    # registers, the same sums), and the [BT, BT] tiles are used up before the state's products
    probs = _tl_dot(q_c, tl.trans(k_c), DOT)
    d_probs = _tl_dot(do_c, tl.trans(v_c), DOT)  # dP = dO V^T
    dg_c = tl.zeros((BT,), dtype=state.dtype)
    if HAS_G:
        gamma, from_start, to_end, chunk_decay = _tl_chunk_decays(g_c, rows)
        probs = tl.where(causal, probs * gamma, 0.0)
        if GATE_GRAD:  # g_l is in Gamma_ij for j < l <= i
            dg_c = _tl_pair_grads(d_probs * probs, rows)
        d_probs = d_probs * gamma
    else:
        probs = tl.where(causal, probs, 0.0)
    dv_c = _tl_dot(tl.trans(probs), do_c, DOT)
    d_scores = tl.where(causal, d_probs, 0.0)
    dq_c = _tl_dot(d_scores, k_c, DOT)
    dk_c = _tl_dot(tl.trans(d_scores), q_c, DOT)
    sixteen: tl.constexpr = DOT == "bf16" or DOT == "bf16 emulated"  # 16-bit operands
    if GATE_GRAD and not sixteen:  # dO S^T at float32's accuracy (below)
        from_q = _tl_wide_dot(do_c, tl.trans(state), DOT)
    else:
        from_q = _tl_dot(do_c, tl.trans(state), DOT)  # dO S^T
    from_k = _tl_dot(v_c, tl.trans(d_state), DOT)  # V D^T
    to_state = _tl_dot(k_c, d_state, DOT)  # K D
    do_start = do_c
    if HAS_G:
        if GATE_GRAD:
            # and in exp(b_i) for l <= i (q_i . (dO S^T)_i, which sums against terms it
            # cancels: at float32's accuracy, else Mamba-2's dt fails the bfloat16 fuzz;
            # 16-bit: as dO_i . (Q S)_i, S in two bfloat16 parts, fewer registers), in
            # exp(b_C - b_j) for j < l (k_j . (V D^T)_j = v_j . (K D)_j), in exp(b_C) for all l
            if sixteen:
                from_state = _tl_split_dot(q_c, state, DOT)  # Q S
                starts = tl.sum(do_c * from_state, axis=1)
            else:
                starts = tl.sum(q_c * from_q, axis=1)
            starts = starts * tl.reshape(from_start, (BT,))
            ends = tl.sum(v_c * to_state, axis=1) * tl.reshape(to_end, (BT,))
            whole = tl.sum(tl.sum(state * d_state, axis=1), axis=0) * chunk_decay
            dg_c = _tl_gate_grads(dg_c, starts, ends, whole, rows)
        from_q, do_start = from_q * from_start, do_c * from_start
        from_k, to_state = from_k * to_end, to_state * to_end
        d_state = d_state * chunk_decay
    dv_c += to_state
    dq_c += from_q
    dk_c += from_k
    d_state += _tl_dot(tl.trans(q_c), do_start, DOT)
    return dq_c, dk_c, dv_c, dg_c, d_state


@triton.jit
def _tl_scalar_decay_bwd(
    q, k, v, g, do, hs, dht,  # read
    dq, dk, dv, dg, dh0,  # written
    T, NH, K, V,
    sq_b, sq_h, sq_t, sq_d,
    sk_b, sk_h, sk_t, sk_d,
    sv_b, sv_h, sv_t, sv_d,
    sg_b, sg_h, sg_t,
    sdo_b, sdo_h, sdo_t, sdo_d,
    HAS_G: tl.constexpr, GATE_GRAD: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """One (value block, batch x head, key block) program: the chunks from the last, its
    block of the state's gradient in registers (_tl_scalar_decay_chunk_grad). dq, dk: one part
    per value block [NV, B * NH, T, K]; dv: one per key block [NK * B * NH, T, V]; dg: one per
    program [NK * NV * B * NH, T]; dht, dh0 [B * NH, K, V]; all contiguous."""
    i_bh = tl.program_id(1)
    i_b, i_h = i_bh // NH, i_bh % NH
    rows = tl.arange(0, BT)
    cols_k, cols_v, in_k, in_v = _tl_columns(K, V, BK, BV)
    d_state = _tl_load_state(dht, i_bh, K, V, cols_k, cols_v)
    n_chunks = tl.cdiv(T, BT)
    part = tl.program_id(0) * tl.num_programs(1) + i_bh  # this value block's of dq, dk
    key_part = tl.program_id(2) * tl.num_programs(1) + i_bh  # this key block's of dv
    own = tl.program_id(2) * tl.num_programs(0) * tl.num_programs(1) + part  # of dg
    for m in range(0, n_chunks):
        n = n_chunks - 1 - m
        t, in_t, at_k, at_v = _tl_tokens(n, rows, T, in_k, in_v)
        q_c = _tl_operand(_tl_rows(q, sq_b, sq_h, sq_t, sq_d, i_b, i_h, t, cols_k, at_k), DOT)
        k_c = _tl_operand(_tl_rows(k, sk_b, sk_h, sk_t, sk_d, i_b, i_h, t, cols_k, at_k), DOT)
        v_c = _tl_operand(_tl_rows(v, sv_b, sv_h, sv_t, sv_d, i_b, i_h, t, cols_v, at_v), DOT)
        do_c = _tl_operand(_tl_rows(do, sdo_b, sdo_h, sdo_t, sdo_d, i_b, i_h, t, cols_v, at_v), DOT)
        state = _tl_load_state(hs, i_bh * n_chunks + n, K, V, cols_k, cols_v)
        if HAS_G:
            g_c = _tl_gates(g, sg_b, sg_h, sg_t, i_b, i_h, t, in_t)
        else:
            g_c = tl.zeros((BT,), dtype=d_state.dtype)  # never read
        dq_c, dk_c, dv_c, dg_c, d_state = _tl_scalar_decay_chunk_grad(
            q_c, k_c, v_c, do_c, g_c, state, d_state, rows, HAS_G, GATE_GRAD, BT, DOT
        )
        _tl_store_rows(dv, key_part, T, V, t, cols_v, at_v, dv_c)
        _tl_store_rows(dq, part, T, K, t, cols_k, at_k, dq_c)
        _tl_store_rows(dk, part, T, K, t, cols_k, at_k, dk_c)
        if HAS_G:
            if GATE_GRAD:
                tl.store(dg + own * T + t, dg_c, mask=in_t)
    _tl_store_state(dh0, i_bh, K, V, cols_k, cols_v, d_state)


def _tl_scalar_decay_forward(q, k, v, g, initial_state, chunk_size, keep, dot):
    """(o [B, NH, T, V], final state [B, NH, K, V], the states entering each chunk
    [B, NH, N, K, V] if keep else None), the products as dot says (_tl_dot_precision)."""
    heads, length, d_k = q.shape[1:]
    d_v = v.shape[-1]
    block_t, block_k, block_v, grid, n_chunks = _tl_sizes(
        q, v, chunk_size, _tl_scalar_decay_fwd, dot
    )
    n_k = grid[2]
    initial_state, o, final, kept = _tl_outputs(q, v, initial_state, n_chunks, keep, n_k)
    _tl_scalar_decay_fwd[grid](
        q,
        k,
        v,
        q if g is None else g,
        initial_state,
        o,
        final,
        kept,
        length,
        heads,
        d_k,
        d_v,
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *_tl_strides(g, 3),
        *o.stride(),
        HAS_G=g is not None,
        KEEP=keep,
        BT=block_t,
        BK=block_k,
        BV=block_v,
        DOT=dot,
        **_tl_launch(_tl_scalar_decay_fwd, dot),
    )
    return _tl_sum_parts(o, n_k, q.dtype), final, kept if keep else None


class _TlScalarDecay(torch.autograd.Function):
    """The fused kernel under autograd: the forward keeps the inputs and the states entering each
    chunk; the backward is one launch of _tl_scalar_decay_bwd."""

    @staticmethod
    def forward(ctx, q, k, v, g, initial_state, chunk_size, operands):
        dot = _tl_dot_precision(q, _tl_scalar_decay_fwd, operands)
        o, final, kept = _tl_scalar_decay_forward(q, k, v, g, initial_state, chunk_size, True, dot)
        ctx.save_for_backward(q, k, v, g, kept)
        ctx.chunk_size, ctx.dot = chunk_size, dot
        return o, final

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_o, d_final):
        q, k, v, g, kept = ctx.saved_tensors
        batch, heads, length, d_k = q.shape
        d_v = v.shape[-1]
        block_t, block_k, block_v, grid, _ = _tl_sizes(
            q, v, ctx.chunk_size, _tl_scalar_decay_bwd, ctx.dot
        )
        n_v, _, n_k = grid
        d_o, d_final, dq, dk, dv, d_initial = _tl_gradients(q, v, d_o, d_final, n_v, n_k)
        gate_grad = g is not None and ctx.needs_input_grad[3]
        dg = dv.new_empty(n_k * n_v, batch, heads, length) if gate_grad else dv
        _tl_scalar_decay_bwd[grid](
            q,
            k,
            v,
            q if g is None else g,
            d_o,
            kept,
            d_final,
            dq,
            dk,
            dv,
            dg,
            d_initial,
            length,
            heads,
            d_k,
            d_v,
            *q.stride(),
            *k.stride(),
            *v.stride(),
            *_tl_strides(g, 3),
            *d_o.stride(),
            HAS_G=g is not None,
            GATE_GRAD=gate_grad,
            BT=block_t,
            BK=block_k,
            BV=block_v,
            DOT=ctx.dot,
            **_tl_launch(_tl_scalar_decay_bwd, ctx.dot),
        )
        if not ctx.needs_input_grad[4]:  # no initial state, or one without a gradient
            d_initial = None
        dv = _tl_sum_parts(dv, n_k, dv.dtype)
        d_gate = dg.sum(0) if gate_grad else None
        return dq.sum(0), dk.sum(0), dv, d_gate, d_initial, None, None


def chunk_scalar_decay(q, k, v, g=None, initial_state=None, chunk_size=64, operands=None):
    """Chunked S_t = exp(g_t) S_{t-1} + k_t v_t^T, o_t = q_t S_t (g=None: linear attention), as
    fused Triton kernels, forward and backward; operands: the dtype of the caller's inputs
    where they were widened to q's (_tl_dot_precision), None for q's.

    Returns (o [B, NH, T, V], final state [B, NH, K, V]).
    """
    _tl_check_device(_tl_scalar_decay_fwd, q)
    if _needs_grad(q, k, v, g, initial_state):
        return _TlScalarDecay.apply(q, k, v, g, initial_state, chunk_size, operands)
    dot = _tl_dot_precision(q, _tl_scalar_decay_fwd, operands)
    o, final, _ = _tl_scalar_decay_forward(q, k, v, g, initial_state, chunk_size, False, dot)
    return o, final
