"""The backward of the diagonal-plus-low-rank Triton kernels (dplr.py), in four launches (the
first three split as flash-linear-attention splits its DPLR backward), each small enough for
its registers. From the last chunk, with T and the scores as the forward kept them (four
[C, C] tiles a chunk) and D the gradient of the state leaving the chunk:

    dU = qb^T dO + (B ⊙ exp(c_C - c)) D,  dZ = T^T dU,  d(ab) = dZ U^T,  d(ak) = dZ V^T
    dV = qk^T dO + (K ⊙ exp(c_C - c)) D + ak^T dZ
    D <- exp(c_C) ⊙ D + (Q ⊙ exp(c))^T dO + (A ⊙ exp(c_{r-1}))^T dZ

_tl_dplr_bwd_states (a program per value block) walks the chunks back with D's columns in
registers, writing D, dZ and dV; _tl_dplr_bwd_scores (two programs per chunk, a side each)
writes the scores' gradients, summed over the value columns; _tl_dplr_bwd_inputs (a program
per chunk and key block) takes them, a tile and a level at a time, and the decayed rows'
gradients through the states back to q, k, a and b, through the same blocks as the forward
made the scores, side 0 (q) and side 1 (a) in two programs, each its part of dk and db (added
after the launch).

The gate's gradient is, for each decay, the input times its gradient, summed back over the
gates in the decay's sum (the transposed mask): a decay of a run of rows passes on to the gates
of other rows by scans along the run, one a level of blocks for the rows' decays and one for
the columns'. Inside _tl_dplr_bwd_inputs the scans of the levels' blocks spilled registers
(44 B on sm_90 in bfloat16; without them it takes 184 registers), so it writes their terms,
float32 [BT, BK] tiles, a side's LEVELS planes [T, K]: the rest of its part of the gradient
(the states' decays' scans, side 0's own rows' terms, exp(c_C)'s), then one a level of blocks
from the second (a level's rows are the right halves of its blocks and its columns the left
halves: the rows' terms are 0 in the left, the columns' in the right); _tl_dplr_bwd_gates (a
program per chunk and key block) adds the sides' terms and scans them.
"""

import torch
import triton
import triton.language as tl

from mixc.backends.triton.kernels.common import (
    _tl_columns,
    _tl_dot,
    _tl_gradients,
    _tl_key_gates,
    _tl_launch,
    _tl_levels,
    _tl_load_state,
    _tl_rows,
    _tl_sizes,
    _tl_store_rows,
    _tl_store_state,
    _tl_strides,
    _tl_tile,
    _tl_tokens,
)
from mixc.backends.triton.kernels.dplr_scores import (
    _tl_dplr_d_scores,
    _tl_dplr_decays,
    _tl_dplr_decays_grad,
    _tl_dplr_load,
    _tl_dplr_right_half,
    _tl_dplr_scores_grad,
)


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
        # T and the scores as the forward kept them (T, qk, qb, ak: four tiles a chunk), each
        # loaded where it is multiplied (held all four, float32's spilled)
        tiles = (i_bh * n_chunks + n) * 4
        d_u = _tl_dot(tl.trans(tl.load(_tl_tile(ts, tiles + 2, rows))), do_c, DOT)  # qb^T dO
        d_u += _tl_dot(_tl_dplr_load(bd, i_bh, T, K, t, cols_k, at_k), d_state, DOT)
        d_reads = _tl_dot(tl.trans(tl.load(_tl_tile(ts, tiles, rows))), d_u, DOT)  # T^T dU
        _tl_store_rows(dz, i_bh, T, V, t, cols_v, at_v, d_reads)
        dv_c = _tl_dot(tl.trans(tl.load(_tl_tile(ts, tiles + 1, rows))), do_c, DOT)  # qk^T dO
        dv_c += _tl_dot(_tl_dplr_load(kd, i_bh, T, K, t, cols_k, at_k), d_state, DOT)
        dv_c += _tl_dot(tl.trans(tl.load(_tl_tile(ts, tiles + 3, rows))), d_reads, DOT)
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
    v, do, u, dz, i_b, i_h, i_bh, t, in_t, rows, side, T, V,
    sv_b, sv_h, sv_t, sv_d, sdo_b, sdo_h, sdo_t, sdo_d,
    BV: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """A side's two scores' gradients of a chunk on their support (_tl_dplr_d_scores), summed
    over the value columns BV at a time: side 0 d(qk), d(qb) = dO (V, U)^T, side 1 d(ak),
    d(ab) = dZ (V, U)^T. Each side loads only its own rows' gradients (the other's masked
    off)."""
    on_q = (t * 0 + side) == 0
    d_xv = tl.zeros([rows.shape[0], rows.shape[0]], dtype=u.dtype.element_ty)
    d_xu = d_xv
    for i_v in range(0, tl.cdiv(V, BV)):
        cols = i_v * BV + tl.arange(0, BV)
        at = in_t[:, None] & (cols < V)[None, :]
        v_c = _tl_rows(v, sv_b, sv_h, sv_t, sv_d, i_b, i_h, t, cols, at)
        u_c = _tl_dplr_load(u, i_bh, T, V, t, cols, at)
        d_rows = _tl_rows(do, sdo_b, sdo_h, sdo_t, sdo_d, i_b, i_h, t, cols, at & on_q[:, None])
        d_rows += _tl_dplr_load(dz, i_bh, T, V, t, cols, at & ~on_q[:, None])  # dO or dZ
        scores = _tl_dplr_d_scores(d_rows, v_c, u_c, rows, side, DOT)
        d_xv, d_xu = d_xv + scores[0], d_xu + scores[1]
    return d_xv, d_xu


@triton.jit
def _tl_dplr_bwd_scores(
    v, do, u, dz,  # read
    dts,  # written
    T, NH, V,
    sv_b, sv_h, sv_t, sv_d,
    sdo_b, sdo_h, sdo_t, sdo_d,
    BT: tl.constexpr, BV: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """The backward's second kernel, two programs per (chunk, batch x head), the chunks at
    once: side 0 the chunk's d(qk), d(qb), side 1 its d(ak), d(ab) on their support
    (_tl_dplr_d_scores_sum; four [BT, BT] sums in one program spilled float32's registers)
    into dts [B * NH, N, 4, BT, BT] (in the dtype of the kept scores, 16 bits for 16-bit
    products, which round them so anyway, and but for d(qk) and d(qb)'s diagonals, which
    multiply elementwise), for _tl_dplr_bwd_inputs to read a tile at a time."""
    i_n, i_bh, side = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // NH, i_bh % NH
    rows = tl.arange(0, BT)
    t = i_n * BT + rows
    sv = (sv_b, sv_h, sv_t, sv_d, sdo_b, sdo_h, sdo_t, sdo_d)
    d_xv, d_xu = _tl_dplr_d_scores_sum(
        v, do, u, dz, i_b, i_h, i_bh, t, t < T, rows, side, T, V, *sv, BV, DOT
    )
    tiles = (i_bh * tl.cdiv(T, BT) + i_n) * 4 + 2 * side
    tl.store(_tl_tile(dts, tiles, rows), d_xv)
    tl.store(_tl_tile(dts, tiles + 1, rows), d_xu)


@triton.jit
def _tl_dplr_through_states(
    v, do, u, dz, hs, dhs, i_b, i_h, i_bh, i_state, t, in_t, cols_k, side, T, K, V,
    sv_b, sv_h, sv_t, sv_d, sdo_b, sdo_h, sdo_t, sdo_d,
    BV: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """A side's gradients of a chunk's decayed rows through the states, for key columns
    cols_k, summed over the value columns BV at a time: side 0 (dO S^T, V D^T, Σ_v S ⊙ D per
    key column), side 1 (dZ S^T, U D^T, 0), S the state entering
    the chunk (hs) and D the gradient of the one leaving it (dhs). Each side loads only its
    own rows (the other's masked off)."""
    on_q = (t * 0 + side) == 0
    zero = tl.zeros([t.shape[0], cols_k.shape[0]], dtype=u.dtype.element_ty)
    dx_c, dy_c, through = zero, zero, tl.sum(zero, axis=0)
    for i_v in range(0, tl.cdiv(V, BV)):
        cols = i_v * BV + tl.arange(0, BV)
        at = in_t[:, None] & (cols < V)[None, :]
        at_q, at_a = at & on_q[:, None], at & ~on_q[:, None]
        state = _tl_load_state(hs, i_state, K, V, cols_k, cols)
        d_state = _tl_load_state(dhs, i_state, K, V, cols_k, cols)
        reads = _tl_rows(do, sdo_b, sdo_h, sdo_t, sdo_d, i_b, i_h, t, cols, at_q)
        reads += _tl_dplr_load(dz, i_bh, T, V, t, cols, at_a)  # dO or dZ
        dx_c += _tl_dot(reads, tl.trans(state), DOT)
        values = _tl_rows(v, sv_b, sv_h, sv_t, sv_d, i_b, i_h, t, cols, at_q)
        values += _tl_dplr_load(u, i_bh, T, V, t, cols, at_a)  # V or U
        dy_c += _tl_dot(values, tl.trans(d_state), DOT)
        through += tl.sum(state * d_state, axis=1)
    return dx_c, dy_c, tl.where(side == 0, through, 0.0)


@triton.jit
def _tl_dplr_through_decays(
    dx_c, dy_c, through, x_c, y_c, g_c, rows, side, GATE_GRAD: tl.constexpr, BT: tl.constexpr
):
    """A side's gradients of x (side 0: q, side 1: a) and y (k, b) from those of their decayed
    rows Q ⊙ exp(c) or A ⊙ exp(c_{r-1}), and K or B ⊙ exp(c_C - c), and (if GATE_GRAD, else
    zeros) what those decays and exp(c_C) pass on to the gate: through the decays' scans
    (_tl_dplr_decays_grad), side 0's own terms and exp(c_C)'s, through the sum of S ⊙ D per
    key column (0 on side 1)."""
    from_start, from_before, to_end = _tl_dplr_decays(g_c, rows, BT)
    dx_c = dx_c * tl.where(side == 0, from_start, from_before)
    dy_c = dy_c * to_end
    own = tl.zeros_like(dx_c)
    if GATE_GRAD:
        d_row = x_c * dx_c
        own = tl.where(side == 0, d_row, 0.0) + (through * tl.exp(tl.sum(g_c, axis=0)))[None, :]
        own += _tl_dplr_decays_grad(d_row, y_c * dy_c, BT)
    return dx_c, dy_c, own


@triton.jit
def _tl_dplr_bwd_inputs(
    q, k, a, b, g, v, do, u, dz, hs, dhs, dts,  # read
    dq, dk, da, db, pieces,  # written
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
    """The backward's third kernel, two programs per (chunk, batch x head, block of BK key
    columns): side 0 the gradient of q [B * NH, T, K] in its key columns, side 1 that of a,
    each its part of those of k and b [2 * B * NH, T, K], from its scores' gradients (dts) and
    those of the decayed rows through the states, back through the decays and the scores'
    blocks (_tl_dplr_scores_grad) as the forward made them; if GATE_GRAD, what the decays
    pass on to the gate, in the side's LEVELS planes of pieces (_tl_dplr_bwd_gates)."""
    i_n, i_bh = tl.program_id(0), tl.program_id(1)
    i_k, side = tl.program_id(2) // 2, tl.program_id(2) % 2
    i_b, i_h = i_bh // NH, i_bh % NH
    rows = tl.arange(0, BT)
    t = i_n * BT + rows
    in_t = t < T
    on_q = (rows * 0 + side) == 0  # [BT], as a mask (the interpreter's masks are tensors)
    sv = (sv_b, sv_h, sv_t, sv_d, sdo_b, sdo_h, sdo_t, sdo_d)
    cols = i_k * BK + tl.arange(0, BK)
    at = in_t[:, None] & (cols < K)[None, :]
    at_q, at_a = at & on_q[:, None], at & ~on_q[:, None]
    chunk = i_bh * tl.cdiv(T, BT) + i_n
    part = side * tl.num_programs(1) + i_bh
    x_c = _tl_rows(q, sq_b, sq_h, sq_t, sq_d, i_b, i_h, t, cols, at_q)
    x_c += _tl_rows(a, sa_b, sa_h, sa_t, sa_d, i_b, i_h, t, cols, at_a)  # q or a
    k_c = _tl_rows(k, sk_b, sk_h, sk_t, sk_d, i_b, i_h, t, cols, at)
    b_c = _tl_rows(b, sb_b, sb_h, sb_t, sb_d, i_b, i_h, t, cols, at)
    dx_c, dy_c, through = _tl_dplr_through_states(
        v, do, u, dz, hs, dhs, i_b, i_h, i_bh, chunk, t, in_t, cols, side, T, K, V, *sv, BV, DOT
    )
    own = tl.zeros_like(dx_c)  # the gate's gradient but the scans' terms (in pieces)
    slot = part * LEVELS  # own's plane of pieces, then one a level from the second
    if HAS_G:
        g_c = _tl_key_gates(g, sg_b, sg_h, sg_t, sg_d, i_b, i_h, t, cols, at)
        y_c = tl.where(side == 0, k_c, b_c)
        dx_c, dy_c, own = _tl_dplr_through_decays(
            dx_c, dy_c, through, x_c, y_c, g_c, rows, side, GATE_GRAD, BT
        )
    else:
        g_c = own  # never read
    dk_c, db_c = tl.where(side == 0, dy_c, 0.0), tl.where(side == 0, 0.0, dy_c)
    dx_c, dk_c, db_c = _tl_dplr_scores_grad(
        dx_c, dk_c, db_c, own, dts, chunk * 4, x_c, k_c, b_c, g_c, rows, side,
        pieces, slot, T, K, t, cols, at, HAS_G, GATE_GRAD, LEVELS, DOT,
    )  # fmt: skip
    _tl_store_rows(dq, i_bh, T, K, t, cols, at_q, dx_c)
    _tl_store_rows(da, i_bh, T, K, t, cols, at_a, dx_c)
    _tl_store_rows(dk, part, T, K, t, cols, at, dk_c)
    _tl_store_rows(db, part, T, K, t, cols, at, db_c)


@triton.jit
def _tl_dplr_bwd_gates(
    pieces,  # read
    dg,  # written
    T, K,
    BT: tl.constexpr, LEVELS: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    """The backward's last kernel, one program per (chunk, batch x head, block of BK key
    columns): the gate's gradient dg [B * NH, T, K] from the pieces [2 * B * NH * LEVELS, T,
    K] that _tl_dplr_bwd_inputs wrote, the two sides' added: the rest of the gradient, then
    through their scans (_tl_dplr_decays_grad) the terms of each level's decays (runs of 2,
    4, ..., BT / 2 rows: the rows' terms in the right halves of its blocks, the columns' in
    the left)."""
    i_n, i_bh, i_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = tl.arange(0, BT)
    t = i_n * BT + rows
    cols = i_k * BK + tl.arange(0, BK)
    at = (t < T)[:, None] & (cols < K)[None, :]
    slot, other = i_bh * LEVELS, tl.num_programs(1) * LEVELS  # side 1's planes: other on
    dg_c = _tl_dplr_load(pieces, slot, T, K, t, cols, at)
    dg_c += _tl_dplr_load(pieces, slot + other, T, K, t, cols, at)
    for level in tl.static_range(1, LEVELS):
        right = _tl_dplr_right_half(rows, 1 << level)
        terms = _tl_dplr_load(pieces, slot + level, T, K, t, cols, at)
        dg_c += tl.where(right, terms, 0.0)  # side 0's own rows' terms
        terms += _tl_dplr_load(pieces, slot + other + level, T, K, t, cols, at)
        d_row, d_col = tl.where(right, terms, 0.0), tl.where(right, 0.0, terms)
        dg_c += _tl_dplr_decays_grad(d_row, d_col, 1 << level)
    _tl_store_rows(dg, i_bh, T, K, t, cols, at, dg_c)


def _tl_dplr_backward(q, k, v, a, b, gk, kept, d_o, d_final, chunk_size, dot, gate_grad):
    """The gradients (dq, dk, dv, da, db, the gate's (None unless gate_grad), the initial
    state's) from those of the outputs and the final state, and what the forward kept
    (_tl_dplr_forward): three launches, the pass over the chunks from the last
    (_tl_dplr_bwd_states), the scores' gradients (_tl_dplr_bwd_scores) and the key-side
    gradients of every chunk at once (_tl_dplr_bwd_inputs), then, for the gate's, a fourth
    (_tl_dplr_bwd_gates)."""
    states, tiles, qd, ad, kd, bd, decay, u = kept
    batch, heads, length, d_k = q.shape
    d_v = v.shape[-1]
    block_t, block_k, block_v, grid, n_chunks = _tl_sizes(
        q, v, chunk_size, _tl_dplr_bwd_states, dot
    )
    levels = _tl_levels(block_t)
    d_o, d_final, dq, dk, dv, d_initial = _tl_gradients(q, v, d_o, d_final, 2)
    dq, da = dq[0], dq[1]  # written by _tl_dplr_bwd_inputs' two sides; dk: a part a side
    db, dz, d_states = (torch.empty_like(x) for x in (dk, u, states))
    pieces = dk  # never written without gate_grad
    if gate_grad:  # the gate's gradient's terms, `levels` planes a side [T, K] (float32)
        pieces = dk.new_empty(2 * batch * heads * levels, length, d_k)
    _tl_dplr_bwd_states[grid](
        d_o, qd, ad, kd, bd, decay, tiles, d_final,  # read
        dv, dz, d_states, d_initial,  # written
        length, heads, d_k, d_v, *_tl_strides(d_o, 4),
        HAS_G=gk is not None, BT=block_t, BK=block_k, BV=block_v,
        **_tl_launch(_tl_dplr_bwd_states, dot),
    )  # fmt: skip
    d_tiles = torch.empty_like(tiles)  # kept as T and the scores are (_tl_dplr_forward)
    scores_v = _tl_sizes(q, v, chunk_size, _tl_dplr_bwd_scores, dot)[2]
    _tl_dplr_bwd_scores[(n_chunks, batch * heads, 2)](
        v, d_o, u, dz,  # read
        d_tiles,  # written
        length, heads, d_v, *_tl_strides(v, 4), *_tl_strides(d_o, 4),
        BT=block_t, BV=scores_v, **_tl_launch(_tl_dplr_bwd_scores, dot),
    )  # fmt: skip
    _, inputs_k, inputs_v, _, _ = _tl_sizes(q, v, chunk_size, _tl_dplr_bwd_inputs, dot)
    _tl_dplr_bwd_inputs[(n_chunks, batch * heads, 2 * triton.cdiv(d_k, inputs_k))](
        q, k, a, b, q if gk is None else gk, v, d_o, u, dz, states, d_states, d_tiles,  # read
        dq, dk, da, db, pieces,  # written
        length, heads, d_k, d_v,
        *(stride for x in (q, k, a, b, gk, v, d_o) for stride in _tl_strides(x, 4)),
        HAS_G=gk is not None, GATE_GRAD=gate_grad, BT=block_t, LEVELS=levels,
        BK=inputs_k, BV=inputs_v, **_tl_launch(_tl_dplr_bwd_inputs, dot),
    )  # fmt: skip
    dg = None
    if gate_grad:
        dg = dq.new_empty(batch, heads, length, d_k)
        gates_k = _tl_sizes(q, v, chunk_size, _tl_dplr_bwd_gates, dot)[1]
        _tl_dplr_bwd_gates[(n_chunks, batch * heads, triton.cdiv(d_k, gates_k))](
            pieces, dg, length, d_k, BT=block_t, LEVELS=levels, BK=gates_k,
            **_tl_launch(_tl_dplr_bwd_gates, dot),
        )  # fmt: skip
    dk, db = dk.sum(0), db.sum(0)  # the two sides' parts
    return dq, dk, dv, da, db, dg, d_initial
