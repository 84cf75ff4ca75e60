"""The Triton kernel of the diagonal-plus-low-rank class: S_t = (diag(exp(g_t)) + b_t a_t^T)
S_{t-1} + k_t v_t^T, o_t = q_t S_t, with a log-gate g_t per key channel (KDA, RWKV-7). The same
chunked form as the PyTorch kernel (docs/algorithms.md, "Diagonal plus low rank").

The forward is three launches, as flash-linear-attention splits its DPLR kernels, so that no
program holds more than a few tiles (registers on sm_90, tensor memory on sm_100):
_tl_dplr_fwd_scores, every chunk at once, makes each chunk's scores, T and decayed rows, key
columns a block at a time; _tl_dplr_fwd_states, one program per (batch, head, block of value
columns), walks the chunks in order with the state in registers and writes the state entering
each chunk and U; _tl_dplr_fwd_outputs, every chunk at once, makes the outputs. The backward is
four (dplr_bwd.py): _tl_dplr_bwd_states, one program per (batch, head, block of value
columns), walks the chunks back with the state's gradient in registers; _tl_dplr_bwd_scores,
every chunk at once, writes the scores' gradients; _tl_dplr_bwd_inputs, one program per (chunk,
batch x head, block of key columns), makes the key-side gradients and the terms of the gate's;
_tl_dplr_bwd_gates sums those.

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
(the transposed mask).

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
from mixc.backends.triton.kernels.dplr_bwd import _tl_dplr_backward
from mixc.backends.triton.kernels.dplr_scores import (
    _tl_dplr_decays,
    _tl_dplr_dots,
    _tl_dplr_load,
    _tl_dplr_scores,
)


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
    x_c, k_c, b_c, g_c, rows, side,
    HAS_G: tl.constexpr, BT: tl.constexpr, LEVELS: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """What a chunk's products read, from its rows x_c (side 0: q, side 1: a), columns k_c,
    b_c and log-gates g_c (read only if HAS_G): (their parts of the decayed scores xk, xb
    (_tl_dplr_scores; without a gate the products for j <= r (side 0) or j < r (side 1)), and
    the rows and columns that meet the state, Q ⊙ exp(c) (side 0) or A ⊙ exp(c_{r-1}) (side
    1), and K, B ⊙ exp(c_C - c))."""
    if HAS_G:
        xk, xb = _tl_dplr_scores(x_c, k_c, b_c, g_c, rows, side, LEVELS, DOT)
        from_start, from_before, to_end = _tl_dplr_decays(g_c, rows, BT)
        x_state = x_c * tl.where(side == 0, from_start, from_before)
        k_end, b_end = k_c * to_end, b_c * to_end
    else:
        pairs = rows[:, None] + 1 - side > rows[None, :]  # j <= r (side 0), j < r (side 1)
        xk, xb = _tl_dplr_dots(x_c, k_c, b_c, pairs, DOT)
        x_state, k_end, b_end = x_c, k_c, b_c
    return xk, xb, x_state, k_end, b_end


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
    """The forward's first kernel, two programs per (chunk, batch x head), the chunks at once:
    side 0 the chunk's scores qk, qb, side 1 its ak and T = (I - ab)^{-1}, into ts
    [B * NH, N, 4, BT, BT] (as the backward reads them, _tl_dplr_bwd_states), the key
    columns BK at a time, the scores summed over them (two [BT, BT] sums a program: four
    spilled). Side 0 also writes the decayed rows Q ⊙ exp(c), K and B ⊙ exp(c_C - c) into qd,
    kd, bd [B * NH, T, K], the whole decay exp(c_C) into decay [B * NH, N, K] (if HAS_G) and the
    poison of the key-side rows into poison [B * NH, T]; side 1 A ⊙ exp(c_{r-1}) into ad."""
    i_n, i_bh, side = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // NH, i_bh % NH
    rows = tl.arange(0, BT)
    t = i_n * BT + rows
    in_t = t < T
    on_q = (rows * 0 + side) == 0  # [BT], as a mask (the interpreter's masks are tensors)
    xk = tl.zeros([BT, BT], dtype=poison.dtype.element_ty)
    xb, row_poison = xk, tl.sum(xk, axis=1)
    for i_k in range(0, tl.cdiv(K, BK)):
        cols = i_k * BK + tl.arange(0, BK)
        at = in_t[:, None] & (cols < K)[None, :]
        q_c = _tl_rows(q, sq_b, sq_h, sq_t, sq_d, i_b, i_h, t, cols, at & on_q[:, None])
        k_c = _tl_rows(k, sk_b, sk_h, sk_t, sk_d, i_b, i_h, t, cols, at)
        a_c = _tl_rows(a, sa_b, sa_h, sa_t, sa_d, i_b, i_h, t, cols, at)
        b_c = _tl_rows(b, sb_b, sb_h, sb_t, sb_d, i_b, i_h, t, cols, at)
        if HAS_G:
            g_c = _tl_key_gates(g, sg_b, sg_h, sg_t, sg_d, i_b, i_h, t, cols, at)
        else:
            g_c = tl.zeros((BT, BK), dtype=k_c.dtype)  # never read
        k_c, a_c, b_c, g_c, poison_k = _tl_dplr_guard(k_c, a_c, b_c, g_c, HAS_G)
        row_poison += poison_k
        x_c = tl.where(side == 0, q_c, a_c)
        decayed = _tl_dplr_decayed(x_c, k_c, b_c, g_c, rows, side, HAS_G, BT, LEVELS, DOT)
        xk_k, xb_k, x_state, k_end, b_end = decayed
        xk, xb = xk + xk_k, xb + xb_k
        _tl_store_rows(qd, i_bh, T, K, t, cols, at & on_q[:, None], x_state)
        _tl_store_rows(ad, i_bh, T, K, t, cols, at & ~on_q[:, None], x_state)
        _tl_store_rows(kd, i_bh, T, K, t, cols, at & on_q[:, None], k_end)
        _tl_store_rows(bd, i_bh, T, K, t, cols, at & on_q[:, None], b_end)
        if HAS_G:
            chunk = (i_bh * tl.cdiv(T, BT) + i_n) * K
            whole = tl.exp(tl.sum(g_c, axis=0))
            tl.store(decay + chunk + cols, whole, mask=(cols < K) & (cols * 0 + side == 0))
    tl.store(poison + i_bh * T + t, row_poison, mask=in_t & on_q)
    tiles = (i_bh * tl.cdiv(T, BT) + i_n) * 4
    tl.store(_tl_tile(ts, tiles + 1 + 2 * side, rows), xk)  # qk or ak
    if side == 0:
        tl.store(_tl_tile(ts, tiles + 2, rows), xb)  # qb
    else:
        tl.store(_tl_tile(ts, tiles, rows), _tl_unit_lower_inverse(-xb, rows, BT))  # (I - ab)^-1


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
    _tl_dplr_fwd_scores[(n_chunks, batch * heads, 2)](
        q, k, a, b, q if gk is None else gk,  # read
        tiles, qd, ad, kd, bd, decay, poison,  # written
        length, heads, d_k, *(stride for x in (q, k, a, b, gk) for stride in _tl_strides(x, 4)),
        HAS_G=has_g, BT=block_t, LEVELS=levels, BK=scores_k,
        **_tl_launch(_tl_dplr_fwd_scores, dot),
    )  # fmt: skip
    _tl_dplr_fwd_states[grid](
        v, ad, kd, bd, decay, poison, tiles, initial_state,  # read
        u, final, states,  # written
        length, heads, d_k, d_v, *_tl_strides(v, 4),
        HAS_G=has_g, BT=block_t, BK=block_k, BV=block_v,
        **_tl_launch(_tl_dplr_fwd_states, dot),
    )  # fmt: skip
    _tl_dplr_fwd_outputs[(grid[0], batch * heads, n_chunks)](
        v, qd, u, poison, tiles, states,  # read
        o,  # written
        length, heads, d_k, d_v, *_tl_strides(v, 4), *_tl_strides(o, 4),
        BT=block_t, BK=block_k, BV=block_v, **_tl_launch(_tl_dplr_fwd_outputs, dot),
    )  # fmt: skip
    kept = (states, tiles, qd, ad, kd, bd, decay if gk is not None else tiles, u)
    return o, final, kept if keep else None


class _TlDplr(torch.autograd.Function):
    """The kernels under autograd: the forward keeps the inputs and what its launches wrote
    (the states entering each chunk, T and the scores, the decayed rows, the chunks' decays,
    U); the backward is dplr_bwd.py's three launches (_tl_dplr_backward)."""

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
        q, k, v, a, b, gk, *kept = ctx.saved_tensors
        gate_grad = gk is not None and ctx.needs_input_grad[5]
        grads = _tl_dplr_backward(
            q, k, v, a, b, gk, kept, d_o, d_final, ctx.chunk_size, ctx.dot, gate_grad
        )
        d_initial = grads[-1] if ctx.needs_input_grad[6] else None  # None: no initial state
        return *grads[:-1], d_initial, None, None


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
