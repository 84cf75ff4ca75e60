"""The Triton kernel of the scalar-decay class: S_t = exp(g_t) S_{t-1} + k_t v_t^T,
o_t = q_t S_t, one log-gate g_t per token and head (g None: linear attention). The same chunked
form as the PyTorch kernel (docs/algorithms.md, "Scalar decay"), fused: one program per
(batch, head, block of value columns, block of key rows) walks the chunks in order, keeping its
tile of the state in registers; the key rows are independent, so each key block's output is its
part of O (Q K^T and Q S are sums over the key columns), and the parts are added after the
launch, as are those of dV.

Forward, per chunk, with b the gates' running sum inside the chunk:
    O = (Q K^T ⊙ Gamma) V + diag(exp(b)) Q S,    S <- exp(b_C) S + (diag(exp(b_C - b)) K)^T V
Backward (scalar_decay_bwd.py, two launches), with the states entering each chunk kept by the
forward and D the gradient of the state leaving the chunk (the same formulas as the PyTorch
kernel's backward):
    dV = P^T dO + diag(exp(b_C - b)) K D        dQ = dA K + diag(exp(b)) dO S^T
    dK = dA^T Q + diag(exp(b_C - b)) V D^T      D <- exp(b_C) D + (diag(exp(b)) Q)^T dO
with P = Q K^T ⊙ Gamma and dA = (dO V^T) ⊙ Gamma; the gate's gradient sums what each decay
factor passes on, as the PyTorch kernel's _gate_grads does.

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
    _tl_gates,
    _tl_launch,
    _tl_load_state,
    _tl_operand,
    _tl_outputs,
    _tl_put_rows,
    _tl_rows,
    _tl_sizes,
    _tl_split_dot,
    _tl_store_state,
    _tl_strides,
    _tl_sum_parts,
    _tl_tokens,
)
from mixc.backends.triton.kernels.diagonal_bwd import _tl_diagonal_backward
from mixc.backends.triton.kernels.scalar_decay_bwd import _tl_scalar_decay_bwd_grads


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
    if HAS_G and (DOT == "bf16" or DOT == "bf16 emulated" or DOT == "fp16"):
        # the decayed values at about float32's accuracy (_tl_split_dot): rounded, the states
        # the backward keeps carry a second rounding of V, which the gate's gradient sums
        # against terms they cancel (Mamba-2's A at a tiny A)
        state += _tl_split_dot(tl.trans(k_c), written, DOT)
    else:
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
        **_tl_launch(_tl_scalar_decay_fwd, dot),
    )
    return _tl_sum_parts(o, n_k, q.dtype), final, kept if keep else None


class _TlScalarDecay(torch.autograd.Function):
    """The fused kernel under autograd: the forward keeps the inputs and the states entering each
    chunk; the backward is two launches (scalar_decay_bwd.py)."""

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
        gate_grad = g is not None and ctx.needs_input_grad[3]
        dq, dk, dv, d_gate, d_initial = _tl_diagonal_backward(
            q, k, v, g, kept, d_o, d_final, ctx.chunk_size, ctx.dot, gate_grad,
            _tl_scalar_decay_bwd_grads,
        )  # fmt: skip
        if not ctx.needs_input_grad[4]:  # no initial state, or one without a gradient
            d_initial = None
        return dq, dk, dv, d_gate, d_initial, None, None


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
