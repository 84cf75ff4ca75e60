"""The Triton kernels of the delta-rule class: S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} +
k_t v_t^T, o_t = q_t S_t, v the write value already scaled by beta (g None: DeltaNet; with g:
Gated DeltaNet). The same chunked form as the PyTorch kernel (docs/algorithms.md, "Delta
rule").

Forward, per chunk, with b the gates' running sum inside the chunk:
    A = tril(diag(beta) (K K^T ⊙ Gamma), -1),  T = (I + A)^{-1}  (blocks of 16, then merged)
    W = T diag(beta exp(b)) K,  U = T V,  V_new = U - W S
    O = diag(exp(b)) Q S + (Q K^T ⊙ Gamma) V_new,  S <- exp(b_C) S + (diag(exp(b_C - b)) K)^T V_new
in three kernels, as flash-linear-attention splits it, each small enough for its registers:
_tl_delta_fwd_wy (a program per chunk: T, W, U), _tl_delta_fwd_states (a program per
(batch, head, block of value columns) walks the chunks in order, the state's columns in
registers: the states entering each chunk and V_new) and _tl_delta_fwd_out (a program per
chunk and value block: O). The forward keeps the states entering each chunk, T, W and
V_new. The backward (delta_bwd.py), by the PyTorch kernel's formulas (see _delta_grads_span
there), W and V_new read as the forward wrote them, is five launches: the chunks' local
M^T dO, the pass over the chunks from the last carrying D (the gradient of the state leaving
a chunk) that completes dV_new, the chunks' dQ, dK and dW, and the UT transform's backward in
two (dT to dA, dV and W's parts; then A's).

A token whose key, beta, gate or value is not finite poisons the outputs from it on (for a
value, in its column) and the state, as the recurrence does; the products inside the chunk run
over finite values.
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
    _tl_store_state,
    _tl_strides,
    _tl_tile,
    _tl_tokens,
    _tl_wide,
    _tl_wide_dot,
)
from mixc.backends.triton.kernels.delta_bwd import _tl_delta_backward


@triton.jit
def _tl_delta_gram(
    k, u, sk_b, sk_h, sk_t, sk_d, i_b, i_h, t, in_t, K, BT: tl.constexpr, BV: tl.constexpr,
    DOT: tl.constexpr,
):  # fmt: skip
    """A chunk's K K^T [BT, BT] summed over slices of BV key columns, the keys that are not
    finite read as 0, and the keys' poison [BT] (NaN for a token with a key that is not finite,
    else 0), both in the dtype of u (float32, float64 for float64 inputs): a slice of the keys
    at a time is live, not the whole [BT, K] tile."""
    kk = tl.zeros((BT, BT), dtype=u.dtype.element_ty)
    poison = tl.zeros((BT,), dtype=u.dtype.element_ty)
    for j in range(0, tl.cdiv(K, BV)):
        cols = j * BV + tl.arange(0, BV)
        at = in_t[:, None] & (cols < K)[None, :]
        k_j = _tl_operand(_tl_rows(k, sk_b, sk_h, sk_t, sk_d, i_b, i_h, t, cols, at), DOT)
        poison += tl.sum(_tl_wide(k_j), axis=1) * 0.0
        k_j, _ = _tl_finite(k_j)
        kk += _tl_dot(k_j, tl.trans(k_j), DOT)
    return kk, poison


@triton.jit
def _tl_delta_inputs(
    k, beta, g, u, sk_b, sk_h, sk_t, sk_d, sb_b, sb_h, sb_t, sg_b, sg_h, sg_t,
    i_b, i_h, t, in_t, K, HAS_G: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
    DOT: tl.constexpr,
):  # fmt: skip
    """A chunk's K K^T (_tl_delta_gram), betas and gates, guarded: (K K^T, beta and the gates
    with their entries that are not finite read as 0, a token's gate also 0 where its key or
    beta is not; the poison [BT], NaN for a token whose key, beta or gate is not finite, else
    0)."""
    kk, poison = _tl_delta_gram(k, u, sk_b, sk_h, sk_t, sk_d, i_b, i_h, t, in_t, K, BT, BV, DOT)
    beta_c = _tl_wide(tl.load(beta + i_b * sb_b + i_h * sb_h + t * sb_t, mask=in_t, other=0.0))
    poison += beta_c * 0.0
    if HAS_G:
        g_c = _tl_gates(g, sg_b, sg_h, sg_t, i_b, i_h, t, in_t)
        poison += tl.exp(g_c) * 0.0
        g_c = tl.where(poison == 0.0, g_c, 0.0)
    else:
        g_c = tl.zeros_like(beta_c)  # never read
    beta_c, _ = _tl_finite(beta_c)
    return kk, beta_c, g_c, poison


@triton.jit
def _tl_delta_inverse(a, rows, BT: tl.constexpr, DOT: tl.constexpr):
    """(I + a)^{-1} for a strictly lower-triangular a [BT, BT] (BT a multiple of 16), in blocks
    of 16 rows: D, the inverses of the diagonal blocks, by forward substitution in every block
    at once (row r of each block in one step, its sum a product), then, with P = -D a_off (a_off
    the part of a below the diagonal blocks, so P^n = 0 for n blocks), (I + a)^{-1} =
    (I + P + ... + P^{n-1}) D by Horner's rule. 15 steps where row-by-row substitution takes
    BT - 1; the products at float32's accuracy (_tl_wide_dot), as the sums they replace."""
    same = (rows // 16)[:, None] == (rows // 16)[None, :]
    eye = tl.where(rows[:, None] == rows[None, :], 1.0, 0.0).to(a.dtype)
    inverse = eye
    for r in range(1, 16):
        step = (rows % 16 == r)[:, None]  # row r of every block: its earlier rows are done
        update = _tl_wide_dot(tl.where(step & same, a, 0.0), inverse, DOT)
        inverse = tl.where(step, eye - update, inverse)
    if BT > 16:
        p = -_tl_wide_dot(inverse, tl.where(same, 0.0, a), DOT)
        blocks = inverse
        for _ in tl.static_range(1, BT // 16):
            blocks = inverse + _tl_wide_dot(p, blocks, DOT)
        inverse = blocks
    return inverse


@triton.jit
def _tl_delta_keys(
    k, g, sk_b, sk_h, sk_t, sk_d, sg_b, sg_h, sg_t, i_b, i_h, t, in_t, cols_k, at_k,
    HAS_G: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """A chunk's keys (as the products take them) and gates (g read only if HAS_G), their
    entries that are not finite read as 0, for the kernels after _tl_delta_fwd_wy: the
    poison is in U, so they leave beta unread (and a token's gate as it is where its key or
    beta is not finite: what it changes is poisoned)."""
    k_c = _tl_operand(_tl_rows(k, sk_b, sk_h, sk_t, sk_d, i_b, i_h, t, cols_k, at_k), DOT)
    k_c, _ = _tl_finite(k_c)
    if HAS_G:
        g_c = _tl_gates(g, sg_b, sg_h, sg_t, i_b, i_h, t, in_t)
        g_c = tl.where(tl.exp(g_c) * 0.0 == 0.0, g_c, 0.0)
    else:
        g_c = tl.zeros((t.shape[0],), dtype=tl.float32)  # never read
    return k_c, g_c


@triton.jit
def _tl_delta_fwd_wy(
    k, v, beta, g,  # read
    w, u, ts,  # written
    T, NH, K, V,
    sk_b, sk_h, sk_t, sk_d,
    sv_b, sv_h, sv_t, sv_d,
    sb_b, sb_h, sb_t,
    sg_b, sg_h, sg_t,
    sw_b, sw_h, sw_t, sw_d,
    su_b, su_h, su_t, su_d,
    HAS_G: tl.constexpr, KEEP: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """One (chunk, batch x head) program, the chunks in parallel: the chunk's UT transform
    T = (I + A)^{-1}, A = tril(diag(beta) (K K^T ⊙ Gamma), -1) (forward substitution), and
    W = T diag(beta exp(b)) K [BT, K], U = T V [BT, V], BV columns at a time. U is
    NaN where the guard poisons (a token's row for its key, beta or gate, an entry for its
    value): the later kernels read the poison there. ts (KEEP): T of each chunk
    [B * NH, N, BT, BT], contiguous."""
    n, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // NH, i_bh % NH
    rows = tl.arange(0, BT)
    cols_k = tl.arange(0, BK)
    t, in_t, _, _ = _tl_tokens(n, rows, T, cols_k < K, cols_k < K)
    kk, beta_c, g_c, poison = _tl_delta_inputs(
        k, beta, g, u, sk_b, sk_h, sk_t, sk_d, sb_b, sb_h, sb_t, sg_b, sg_h, sg_t,
        i_b, i_h, t, in_t, K, HAS_G, BT, BV, DOT,
    )  # fmt: skip
    scale = beta_c[:, None]  # the rows of diag(beta exp(b)) K
    if HAS_G:
        gamma, from_start, _, _ = _tl_chunk_decays(g_c, rows)
        kk = kk * gamma
        scale = scale * from_start
    strict = rows[:, None] > rows[None, :]
    inverse = _tl_delta_inverse(tl.where(strict, beta_c[:, None] * kk, 0.0), rows, BT, DOT)
    if KEEP:
        tl.store(_tl_tile(ts, i_bh * tl.cdiv(T, BT) + n, rows), inverse)
    # W and U BV columns at a time, the keys loaded again: the whole [BT, K] keys, W and the
    # inverse's steps do not fit in registers together
    for j in range(0, tl.cdiv(K, BV)):
        cols = j * BV + tl.arange(0, BV)
        at = in_t[:, None] & (cols < K)[None, :]
        k_j = _tl_operand(_tl_rows(k, sk_b, sk_h, sk_t, sk_d, i_b, i_h, t, cols, at), DOT)
        k_j, _k_poison = _tl_finite(k_j)  # the poison is in U
        w_j = _tl_dot(inverse, k_j * scale, DOT)
        _tl_put_rows(w, sw_b, sw_h, sw_t, sw_d, i_b, i_h, t, cols, at, w_j)
    for j in range(0, tl.cdiv(V, BV)):
        cols_v = j * BV + tl.arange(0, BV)
        at_v = in_t[:, None] & (cols_v < V)[None, :]
        v_c = _tl_operand(_tl_rows(v, sv_b, sv_h, sv_t, sv_d, i_b, i_h, t, cols_v, at_v), DOT)
        v_finite, v_poison = _tl_finite(v_c)
        u_c = _tl_dot(inverse, v_finite, DOT) + (poison[:, None] + v_poison)
        _tl_put_rows(u, su_b, su_h, su_t, su_d, i_b, i_h, t, cols_v, at_v, u_c)


@triton.jit
def _tl_delta_fwd_states(
    k, g, w, u, h0,  # read
    v_new, hs, ht,  # written
    T, NH, K, V,
    sk_b, sk_h, sk_t, sk_d,
    sg_b, sg_h, sg_t,
    sw_b, sw_h, sw_t, sw_d,
    su_b, su_h, su_t, su_d,
    HAS_G: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    DOT: tl.constexpr,
):  # fmt: skip
    """One (value block, batch x head) program: the chunks in order, the state's BV columns in
    registers. Per chunk: the state entering it to hs [B * NH, N, K, V] (contiguous),
    V_new = U - W S to v_new (laid out as u; its entries not finite where the chunk's poison
    is), then S <- exp(b_C) S + (diag(exp(b_C - b)) K)^T V_new, the poison added. h0, ht:
    [B * NH, K, V], contiguous."""
    i_bh = tl.program_id(1)
    i_b, i_h = i_bh // NH, i_bh % NH
    rows = tl.arange(0, BT)
    cols_k, cols_v, in_k, in_v = _tl_columns(K, V, BK, BV)
    state = _tl_load_state(h0, i_bh, K, V, cols_k, cols_v)
    n_chunks = tl.cdiv(T, BT)
    for n in range(0, n_chunks):
        t, in_t, at_k, at_v = _tl_tokens(n, rows, T, in_k, in_v)
        _tl_store_state(hs, i_bh * n_chunks + n, K, V, cols_k, cols_v, state)
        k_c, g_c = _tl_delta_keys(
            k, g, sk_b, sk_h, sk_t, sk_d, sg_b, sg_h, sg_t, i_b, i_h, t, in_t, cols_k, at_k,
            HAS_G, DOT,
        )  # fmt: skip
        w_c = _tl_operand(_tl_rows(w, sw_b, sw_h, sw_t, sw_d, i_b, i_h, t, cols_k, at_k), DOT)
        u_c = _tl_rows(u, su_b, su_h, su_t, su_d, i_b, i_h, t, cols_v, at_v)
        # finite inputs can still overflow in a later token's row: such an entry poisons too
        v_new_c = u_c - _tl_dot(w_c, state, DOT)
        _tl_put_rows(v_new, su_b, su_h, su_t, su_d, i_b, i_h, t, cols_v, at_v, v_new_c)
        v_new_c, poison = _tl_finite(v_new_c)
        if HAS_G:
            _, _, to_end, chunk_decay = _tl_chunk_decays(g_c, rows)
            state = state * chunk_decay
            v_new_c = v_new_c * to_end  # (diag(exp(b_C - b)) K)^T V_new
        state += _tl_dot(tl.trans(k_c), v_new_c, DOT)
        state += tl.sum(poison, axis=0)[None, :]
    _tl_store_state(ht, i_bh, K, V, cols_k, cols_v, state)


@triton.jit
def _tl_delta_fwd_out(
    q, k, g, hs, v_new,  # read
    o,  # written
    T, NH, K, V,
    sq_b, sq_h, sq_t, sq_d,
    sk_b, sk_h, sk_t, sk_d,
    sg_b, sg_h, sg_t,
    su_b, su_h, su_t, su_d,
    so_b, so_h, so_t, so_d,
    HAS_G: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    DOT: tl.constexpr,
):  # fmt: skip
    """One (value block, batch x head, chunk) program, the chunks in parallel: the outputs
    O = diag(exp(b)) Q S + (Q K^T ⊙ Gamma) V_new from the state S entering the chunk (hs) and
    V_new (v_new, laid out as u), the poison where V_new is not finite added from its token
    on."""
    i_bh, n = tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // NH, i_bh % NH
    rows = tl.arange(0, BT)
    cols_k, cols_v = tl.arange(0, BK), tl.program_id(0) * BV + tl.arange(0, BV)
    in_k, in_v = cols_k < K, cols_v < V
    t, in_t, at_k, at_v = _tl_tokens(n, rows, T, in_k, in_v)
    q_c = _tl_operand(_tl_rows(q, sq_b, sq_h, sq_t, sq_d, i_b, i_h, t, cols_k, at_k), DOT)
    k_c, g_c = _tl_delta_keys(
        k, g, sk_b, sk_h, sk_t, sk_d, sg_b, sg_h, sg_t, i_b, i_h, t, in_t, cols_k, at_k,
        HAS_G, DOT,
    )  # fmt: skip
    scores = _tl_dot(q_c, tl.trans(k_c), DOT)
    state = _tl_load_state(hs, i_bh * tl.cdiv(T, BT) + n, K, V, cols_k, cols_v)
    out = _tl_dot(q_c, state, DOT)  # Q S
    if HAS_G:
        gamma, from_start, _, _ = _tl_chunk_decays(g_c, rows)
        scores = scores * gamma
        out = out * from_start
    scores = tl.where(rows[:, None] >= rows[None, :], scores, 0.0)
    v_new_c, poison = _tl_finite(_tl_rows(v_new, su_b, su_h, su_t, su_d, i_b, i_h, t, cols_v, at_v))
    out += _tl_dot(scores, v_new_c, DOT)
    out += tl.cumsum(poison, axis=0)
    _tl_put_rows(o, so_b, so_h, so_t, so_d, i_b, i_h, t, cols_v, at_v, out)


def _tl_delta_forward(q, k, v, beta, g, initial_state, chunk_size, keep, dot):
    """(o [B, NH, T, V], final state [B, NH, K, V], and if keep the states entering each chunk
    [B, NH, N, K, V], T of each chunk [B, NH, N, C, C], W [B, NH, T, K] and V_new
    [B, NH, T, V], else Nones): three launches, the
    UT transform of every chunk (_tl_delta_fwd_wy), the pass over the chunks that carries the
    state (_tl_delta_fwd_states) and the outputs of every chunk (_tl_delta_fwd_out)."""
    batch, heads, length, d_k = q.shape
    block_t, block_k, block_v, grid, n_chunks = _tl_sizes(
        q, v, chunk_size, _tl_delta_fwd_states, dot
    )
    initial_state, o, final, states = _tl_outputs(q, v, initial_state, n_chunks, True)
    inverses = final.new_empty(batch, heads, n_chunks, block_t, block_t) if keep else final
    w = final.new_empty(batch, heads, length, d_k)
    u, v_new = final.new_empty(2, batch, heads, length, v.shape[-1])
    sizes = (length, heads, d_k, v.shape[-1])
    gate, gate_strides = q if g is None else g, _tl_strides(g, 3)
    common = {"HAS_G": g is not None, "BT": block_t, "BK": block_k}
    wy = _tl_delta_fwd_wy
    wy[(n_chunks, batch * heads)](
        k, v, beta, gate, w, u, inverses, *sizes,
        *k.stride(), *v.stride(), *beta.stride(), *gate_strides, *w.stride(), *u.stride(),
        KEEP=keep, BV=_tl_sizes(q, v, chunk_size, wy, dot)[2], **common, **_tl_launch(wy, dot),
    )  # fmt: skip
    _tl_delta_fwd_states[grid](
        k, gate, w, u, initial_state, v_new, states, final, *sizes,
        *k.stride(), *gate_strides, *w.stride(), *u.stride(),
        BV=block_v, **common, **_tl_launch(_tl_delta_fwd_states, dot),
    )  # fmt: skip
    out = _tl_delta_fwd_out
    out_block_v, out_grid = _tl_sizes(q, v, chunk_size, out, dot)[2:4]
    out[(out_grid[0], batch * heads, n_chunks)](
        q, k, gate, states, v_new, o, *sizes,
        *q.stride(), *k.stride(), *gate_strides, *u.stride(), *o.stride(),
        BV=out_block_v, **common, **_tl_launch(out, dot),
    )  # fmt: skip
    return o, final, (states, inverses, w, v_new) if keep else (None,) * 4


class _TlDelta(torch.autograd.Function):
    """The kernels under autograd: the forward keeps the inputs, the states entering each
    chunk, T, W and V_new; the backward is five launches (delta_bwd.py)."""

    @staticmethod
    def forward(ctx, q, k, v, beta, g, initial_state, chunk_size, operands):
        dot = _tl_dot_precision(q, _tl_delta_fwd_states, operands)
        o, final, kept = _tl_delta_forward(q, k, v, beta, g, initial_state, chunk_size, True, dot)
        ctx.save_for_backward(q, k, v, beta, g, *kept)
        ctx.chunk_size, ctx.dot = chunk_size, dot
        return o, final

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_o, d_final):
        q, k, v, beta, g, *kept = ctx.saved_tensors
        gate_grad = g is not None and ctx.needs_input_grad[4]
        dq, dk, dv, dbeta, d_gate, d_initial = _tl_delta_backward(
            q, k, v, beta, g, kept, d_o, d_final, ctx.chunk_size, ctx.dot, gate_grad
        )
        if not ctx.needs_input_grad[5]:  # no initial state, or one without a gradient
            d_initial = None
        return dq, dk, dv, dbeta, d_gate, d_initial, None, None


def chunk_delta(q, k, v, beta, g=None, initial_state=None, chunk_size=64, operands=None):
    """Chunked S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + k_t v_t^T, o_t = q_t S_t, as fused
    Triton kernels, forward and backward.

    v is the already-scaled write value (beta * v); beta only enters the transition. g=None:
    plain DeltaNet. operands: the dtype of the caller's inputs where they were widened to q's
    (_tl_dot_precision), None for q's. Returns (o [B, NH, T, V], final state [B, NH, K, V]).
    """
    _tl_check_device(_tl_delta_fwd_states, q)
    if _needs_grad(q, k, v, beta, g, initial_state):
        return _TlDelta.apply(q, k, v, beta, g, initial_state, chunk_size, operands)
    dot = _tl_dot_precision(q, _tl_delta_fwd_states, operands)
    o, final, _ = _tl_delta_forward(q, k, v, beta, g, initial_state, chunk_size, False, dot)
    return o, final
