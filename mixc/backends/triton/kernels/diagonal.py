"""The Triton kernel of the diagonal-gate class: S_t = diag(exp(gk_t)) S_{t-1} + k_t v_t^T,
o_t = q_t S_t, one log-gate per token, head and key channel (GLA, RWKV-6). The same chunked form
as the PyTorch kernel (docs/algorithms.md, "Diagonal gates"), fused: one program per (batch,
head, block of value columns, block of key rows) walks the chunks in order, keeping its tile of
the state in registers; each key block's output (and dV) is its part, the sum over its key
columns, and the parts are added after the launch.

A decay that differs per channel is no mask on the scores Q K^T, so the pairs j < i inside a
chunk are split by the aligned blocks of 2, 4, ..., C tokens, as in the PyTorch kernel: each
pair lies in exactly one block with j in its left half and i in its right half, and its decay is
measured from the boundary r between the halves, q_i ⊙ exp(b_i - b_r) and k_j ⊙ exp(b_r - b_j),
both exponents <= 0 whatever the gates (no exp(-b), which overflows for decays near 0). One
level of blocks is one matmul of the decayed queries and keys, kept where the pairs are that
level's; the pairs i = j need no decay. The chunk level carries the state:
    O = A V + (Q ⊙ exp(b)) S,    S <- diag(exp(b_C)) S + (K ⊙ exp(b_C - b))^T V
Every exponent is a sum of the gates' own terms (common._tl_run_sums).

Backward (diagonal_bwd.py): two launches, as flash-linear-attention splits GLA's: the
gradients of the states leaving the chunks, from the last, then the chunks in parallel. dA =
dO V^T on A's support, dV = A^T dO + (K ⊙ exp(b_C - b)) D, each level hands its part of dA back
to its decayed queries and keys, and D <- diag(exp(b_C)) D + (Q ⊙ exp(b))^T dO. The gate's
gradient, per channel, sums what each decay factor passes on.

Value-side gates (gv) run the PyTorch kernel's chunked form (no shipped spec has them).

A token whose gate or value is not finite poisons the outputs from it on (for a value, in its
column) and the state, as the recurrence does; the products inside the chunk run over finite
values.
"""

import torch
import triton
import triton.language as tl

from mixc.backends.pytorch.kernels.common import _guarded_spans, _needs_grad
from mixc.backends.pytorch.kernels.diagonal import _diagonal_span
from mixc.backends.triton.kernels.common import (
    _tl_check_device,
    _tl_columns,
    _tl_dot,
    _tl_dot_precision,
    _tl_finite,
    _tl_launch,
    _tl_levels,
    _tl_load_state,
    _tl_operand,
    _tl_outputs,
    _tl_put_rows,
    _tl_rows,
    _tl_run_sums,
    _tl_sizes,
    _tl_store_state,
    _tl_strides,
    _tl_sum_parts,
    _tl_tokens,
)
from mixc.backends.triton.kernels.diagonal_bwd import (
    _tl_diagonal_backward,
    _tl_diagonal_bwd_grads,
    _tl_diagonal_gates,
    _tl_diagonal_scores,
)

#: The keyword arguments this kernel leaves to the PyTorch kernel's chunked form, and what they
#: are (for explain; not copied into a generated module, which takes only definitions).
PYTORCH_ARGS = {"gv": "value-side gates"}


@triton.jit
def _tl_diagonal_chunk(
    q_c,
    k_c,
    v_c,
    g_c,
    gate_poison,
    state,
    rows,
    LEVELS: tl.constexpr,
    BT: tl.constexpr,
    DOT: tl.constexpr,
):
    """One chunk of the forward, from its queries, keys, values, log-gates g_c [BT, BK] (zeros
    without a gate), the poison of its tokens' gates [BT] and the state S entering it: (its
    outputs O = A V + (Q ⊙ exp(b)) S, the state leaving it diag(exp(b_C)) S + (K ⊙ exp(b_C -
    b))^T V), the products over the finite values, the poison reaching the outputs from its
    token on and the state. The values' poison is made again from v_c at the end, not held
    through the chunk's products (a [BT, BV] float32 tile: the registers a program runs short
    of on sm_90)."""
    scores = _tl_diagonal_scores(q_c, k_c, g_c, rows, LEVELS, DOT)
    from_start, to_end = _tl_run_sums(g_c, rows, BT)
    finite, _ = _tl_finite(v_c)
    out = _tl_dot(scores.to(v_c.dtype), finite, DOT)
    out += _tl_dot(q_c * tl.exp(from_start), state.to(q_c.dtype), DOT)
    state = state * tl.exp(tl.sum(g_c, axis=0))[:, None]
    state += _tl_dot(tl.trans(k_c * tl.exp(to_end)), finite, DOT)
    _, poison = _tl_finite(v_c)
    poison += gate_poison[:, None]
    out += tl.cumsum(poison, axis=0)
    state += tl.sum(poison, axis=0)[None, :]
    return out, state


@triton.jit
def _tl_diagonal_fwd(
    q, k, v, g, h0,  # read
    o, ht, hs,  # written
    T, NH, K, V,
    sq_b, sq_h, sq_t, sq_d,
    sk_b, sk_h, sk_t, sk_d,
    sv_b, sv_h, sv_t, sv_d,
    sg_b, sg_h, sg_t, sg_d,
    so_b, so_h, so_t, so_d,
    HAS_G: tl.constexpr, KEEP: tl.constexpr, LEVELS: tl.constexpr, BT: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """One (value block, batch x head, key block) program: the chunks in order, its block of
    the state in registers (_tl_diagonal_chunk). o: one part per key block [NK * B, NH, T, V]
    (strided); h0, ht: [B * NH, K, V] contiguous; hs (KEEP): the states entering each chunk,
    [B * NH, N, K, V]; LEVELS = log2(BT), the levels of blocks inside a chunk."""
    i_bh = tl.program_id(1)
    i_b, i_h = i_bh // NH, i_bh % NH
    rows = tl.arange(0, BT)
    cols_k, cols_v, in_k, in_v = _tl_columns(K, V, BK, BV)
    state = _tl_load_state(h0, i_bh, K, V, cols_k, cols_v)
    n_chunks = tl.cdiv(T, BT)
    part = tl.program_id(2) * (tl.num_programs(1) // NH) + i_b  # this key block's part of o
    for n in range(0, n_chunks):
        t, _, at_k, at_v = _tl_tokens(n, rows, T, in_k, in_v)
        q_c = _tl_operand(_tl_rows(q, sq_b, sq_h, sq_t, sq_d, i_b, i_h, t, cols_k, at_k), DOT)
        k_c = _tl_operand(_tl_rows(k, sk_b, sk_h, sk_t, sk_d, i_b, i_h, t, cols_k, at_k), DOT)
        v_c = _tl_operand(_tl_rows(v, sv_b, sv_h, sv_t, sv_d, i_b, i_h, t, cols_v, at_v), DOT)
        if KEEP:
            _tl_store_state(hs, i_bh * n_chunks + n, K, V, cols_k, cols_v, state)
        if HAS_G:  # a gate that is not finite poisons its whole row
            g_c, gate_poison = _tl_diagonal_gates(
                g, sg_b, sg_h, sg_t, sg_d, i_b, i_h, t, cols_k, at_k
            )
        else:
            g_c = tl.zeros((BT, BK), dtype=state.dtype)
            gate_poison = tl.zeros((BT,), dtype=state.dtype)
        out, state = _tl_diagonal_chunk(
            q_c, k_c, v_c, g_c, gate_poison, state, rows, LEVELS, BT, DOT
        )
        _tl_put_rows(o, so_b, so_h, so_t, so_d, part, i_h, t, cols_v, at_v, out)
    _tl_store_state(ht, i_bh, K, V, cols_k, cols_v, state)


def _tl_diagonal_forward(q, k, v, gk, initial_state, chunk_size, keep, dot):
    """(o [B, NH, T, V], final state [B, NH, K, V], the states entering each chunk
    [B, NH, N, K, V] if keep else None), the products as dot says (_tl_dot_precision)."""
    heads, length, d_k = q.shape[1:]
    d_v = v.shape[-1]
    block_t, block_k, block_v, grid, n_chunks = _tl_sizes(q, v, chunk_size, _tl_diagonal_fwd, dot)
    n_k = grid[2]
    initial_state, o, final, kept = _tl_outputs(q, v, initial_state, n_chunks, keep, n_k)
    _tl_diagonal_fwd[grid](
        q,
        k,
        v,
        q if gk is None else gk,
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
        *_tl_strides(gk, 4),
        *o.stride(),
        HAS_G=gk is not None,
        KEEP=keep,
        LEVELS=_tl_levels(block_t),
        BT=block_t,
        BK=block_k,
        BV=block_v,
        **_tl_launch(_tl_diagonal_fwd, dot),
    )
    return _tl_sum_parts(o, n_k, q.dtype), final, kept if keep else None


class _TlDiagonal(torch.autograd.Function):
    """The fused kernel under autograd: the forward keeps the inputs and the states entering each
    chunk; the backward is two launches (diagonal_bwd.py)."""

    @staticmethod
    def forward(ctx, q, k, v, gk, initial_state, chunk_size, operands):
        dot = _tl_dot_precision(q, _tl_diagonal_fwd, operands)
        o, final, kept = _tl_diagonal_forward(q, k, v, gk, initial_state, chunk_size, True, dot)
        ctx.save_for_backward(q, k, v, gk, kept)
        ctx.chunk_size, ctx.dot = chunk_size, dot
        return o, final

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_o, d_final):
        q, k, v, gk, kept = ctx.saved_tensors
        gate_grad = gk is not None and ctx.needs_input_grad[3]
        dq, dk, dv, dg, d_initial = _tl_diagonal_backward(
            q, k, v, gk, kept, d_o, d_final, ctx.chunk_size, ctx.dot, gate_grad,
            _tl_diagonal_bwd_grads,
        )  # fmt: skip
        if not ctx.needs_input_grad[4]:  # no initial state, or one without a gradient
            d_initial = None
        return dq, dk, dv, dg, d_initial, None, None


def chunk_diagonal(q, k, v, gk=None, gv=None, initial_state=None, chunk_size=64, operands=None):
    """Chunked S_t = diag(exp(gk_t)) S_{t-1} diag(exp(gv_t)) + k_t v_t^T, o_t = q_t S_t, as fused
    Triton kernels, forward and backward, for key-side gates gk [B, NH, T, K] (or None);
    value-side gates gv [B, NH, T, V] run the PyTorch kernel's chunked form, through autograd.
    operands: the dtype of the caller's inputs where they were widened to q's
    (_tl_dot_precision), None for q's.

    Returns (o [B, NH, T, V], final state [B, NH, K, V]).
    """
    if gv is not None:
        seqs = [q, k, v, gk, gv]
        (o,), state, _ = _guarded_spans(_diagonal_span, seqs, initial_state, chunk_size)
        return o, state
    _tl_check_device(_tl_diagonal_fwd, q)
    if _needs_grad(q, k, v, gk, initial_state):
        return _TlDiagonal.apply(q, k, v, gk, initial_state, chunk_size, operands)
    dot = _tl_dot_precision(q, _tl_diagonal_fwd, operands)
    o, final, _ = _tl_diagonal_forward(q, k, v, gk, initial_state, chunk_size, False, dot)
    return o, final
