"""The products inside a chunk of the diagonal-plus-low-rank Triton kernels (dplr.py): the
decayed scores [Q K], [Q B] (j <= r) and [A K]', [A B]' (j < r) of a chunk, block by block of
its aligned runs of tokens, and their gradients. Every decay is the exponential of a sum of
gates of one sign, each sum a scan of its own terms inside an aligned run of rows, never a
difference of running sums: a score's decay exp(c_r - c_j) per channel is split at the boundary
between the halves of the aligned block of 2, 4, ..., C tokens in which j is in the left half
and r in the right, both factors <= 1 (one matmul of decayed rows and columns per block size
and score).
"""

import triton
import triton.language as tl

from mixc.backends.triton.kernels.common import (
    _tl_dot,
    _tl_operand,
    _tl_pairs,
    _tl_run_scan,
    _tl_run_sums,
    _tl_store_rows,
    _tl_tile,
)


@triton.jit
def _tl_dplr_load(x, i, T, d, t, cols, mask):
    """The rows t and columns cols of item i of x [N, T, d] (contiguous), 0 where mask is False:
    what one of the forward's kernels wrote for the next (_tl_store_rows)."""
    return tl.load(x + (i * T + t[:, None]) * d + cols[None, :], mask=mask, other=0.0)


@triton.jit
def _tl_dplr_decays(g, rows, RUN: tl.constexpr):
    """The decays inside the aligned runs of RUN rows, from log-gates g [BT, BK]: the
    exponentials of the sums of g (_tl_run_sums) from the run's start to each row, the row
    included and not, and from after each row to the run's end [BT, BK]. For RUN = BT: exp(c_r),
    exp(c_{r-1}) and exp(c_C - c_j)."""
    up_to, after = _tl_run_sums(g, rows, RUN)
    before = _tl_run_scan(g, RUN, False, False)  # l < r in r's run
    return tl.exp(up_to), tl.exp(before), tl.exp(after)


@triton.jit
def _tl_dplr_decays_grad(d_row, d_col, RUN: tl.constexpr):
    """The gradient for g of the decays of _tl_dplr_decays(g, rows, RUN) through the sums of
    other rows, from those of its rows' decay (d_row: the sum up to the row, or before it)
    and its columns' (d_col, the sum after the row): g_l is in the rows' sums of the rows
    after l in its run and in the columns' of the rows before l. Two scans, each of the
    contributions themselves. The rows' sum up to the row also holds the row's own g_l: its
    term (d_row itself) is the caller's."""
    return _tl_run_scan(d_row, RUN, True, False) + _tl_run_scan(d_col, RUN, False, False)


@triton.jit
def _tl_dplr_right_half(rows, RUN: tl.constexpr):
    """[BT, 1]: whether each row is in the right half of its aligned block of 2 RUN rows (its
    run is one of those whose rows that level of _tl_dplr_scores decays; the left halves'
    rows are its columns, _tl_pairs)."""
    return ((rows // RUN) % 2 == 1)[:, None]


@triton.jit
def _tl_dplr_dots(x, k, b, pairs, DOT: tl.constexpr):
    """The scores [BT, BT] of rows x with columns k and b: x k^T and x b^T where pairs, 0
    elsewhere."""
    xk = tl.where(pairs, _tl_dot_in_registers(x, tl.trans(k), DOT), 0.0)
    xb = tl.where(pairs, _tl_dot_in_registers(x, tl.trans(b), DOT), 0.0)
    return xk, xb


@triton.jit
def _tl_dot_in_registers(a, b, DOT: tl.constexpr):
    """a @ b (_tl_dot) as a batch of one product: triton then multiplies with the warp-level
    MMA (mma.sync) that accumulates in registers, not with Hopper's wgmma or Blackwell's
    tcgen05, whose accumulator on sm_100 takes tensor memory (512 columns an SM), which the
    many products of a chunk's scores would overflow."""
    a3 = tl.reshape(a, (1, a.shape[0], a.shape[1]))
    b3 = tl.reshape(b, (1, b.shape[0], b.shape[1]))
    return tl.reshape(_tl_dot(a3, b3, DOT), (a.shape[0], b.shape[1]))


@triton.jit
def _tl_dplr_scores(x, k, b, g, rows, side, LEVELS: tl.constexpr, DOT: tl.constexpr):
    """The decayed scores of a chunk [BT, BT] of rows x with columns k and b: side 0 (x = q)
    qk[r, j] = Σ_c q_rc exp(c_rc - c_jc) k_jc and qb (the same with b) for j <= r, side 1
    (x = a) ak[r, j] = Σ_c a_rc exp(c_{r-1,c} - c_jc) k_jc and ab for j < r, 0 elsewhere;
    the pairs r = j undecayed, the others block by block: at each level, the rows decayed from
    the boundary of their block's halves and the columns to it (_tl_dplr_decays over the
    halves: a left half's rows and a right half's columns are decayed too, but outside the
    level's pairs)."""
    diagonal = (rows[:, None] == rows[None, :]) & (side == 0)
    xk = tl.where(diagonal, tl.sum(x * k, axis=1)[:, None], 0.0)
    xb = tl.where(diagonal, tl.sum(x * b, axis=1)[:, None], 0.0)
    for level in tl.static_range(LEVELS):
        row, row_before, col = _tl_dplr_decays(g, rows, 1 << level)
        row = tl.where(side == 0, row, row_before)
        xk_l, xb_l = _tl_dplr_dots(x * row, k * col, b * col, _tl_pairs(rows, 1 << level), DOT)
        xk += xk_l
        xb += xb_l
    return xk, xb


@triton.jit
def _tl_dplr_d_score(dts, tile, rows, pairs, DOT: tl.constexpr):
    """The gradient of one of a chunk's scores, tile `tile` of dts (_tl_tile), on pairs, 0
    elsewhere, as the products take it (_tl_operand): read where it is needed, not held
    across the levels, whole (a masked load of the pairs, whose entries are not contiguous,
    loads them one at a time)."""
    return _tl_operand(tl.where(pairs, tl.load(_tl_tile(dts, tile, rows)), 0.0), DOT)


@triton.jit
def _tl_dplr_pairs_grad(dts, tiles, rows, pairs, x, k, b, DOT: tl.constexpr):
    """The gradients for x, k and b of _tl_dplr_dots(x, k, b, pairs), from its scores'
    gradients d(xk), d(xb) in tiles tiles and tiles + 1 of dts, read one at a time on their
    pairs (one [BT, BT] tile live)."""
    d_score = _tl_dplr_d_score(dts, tiles, rows, pairs, DOT)  # d(xk)
    dx = _tl_dot_in_registers(d_score, k, DOT)
    dk = _tl_dot_in_registers(tl.trans(d_score), x, DOT)
    d_score = _tl_dplr_d_score(dts, tiles + 1, rows, pairs, DOT)  # d(xb)
    dx += _tl_dot_in_registers(d_score, b, DOT)
    db = _tl_dot_in_registers(tl.trans(d_score), x, DOT)
    return dx, dk, db


@triton.jit
def _tl_dplr_level_grad(
    dts, tiles, x_c, k_c, b_c, g_c, rows, side, RUN: tl.constexpr, DOT: tl.constexpr
):
    """The gradients for x (side 0: q, side 1: a), k and b of one level of _tl_dplr_scores'
    blocks, RUN tokens a half, from those of the side's scores in dts (_tl_dplr_pairs_grad):
    through that level's products of the rows decayed from the boundary of their block's
    halves and the columns decayed to it, and through those decays."""
    row, row_before, col = _tl_dplr_decays(g_c, rows, RUN)
    row = tl.where(side == 0, row, row_before)
    pairs = _tl_pairs(rows, RUN)
    dx_l, dk_l, db_l = _tl_dplr_pairs_grad(
        dts, tiles, rows, pairs, x_c * row, k_c * col, b_c * col, DOT
    )
    return dx_l * row, dk_l * col, db_l * col


@triton.jit
def _tl_dplr_d_scores(d_rows, v_c, u, rows, side, DOT: tl.constexpr):
    """The gradients of a side's two scores of a chunk on their support, from those of the
    outputs (side 0, d_rows = dO) or of Z (side 1, d_rows = dZ; Z the right side of
    (I - ab) U = Z): (d(qk), d(qb)) = dO (V, U)^T for j <= r, (d(ak), d(ab)) = dZ (V, U)^T
    for j < r, 0 elsewhere."""
    support = rows[:, None] + 1 - side > rows[None, :]  # j <= r (side 0), j < r (side 1)
    d_xv = tl.where(support, _tl_dot(d_rows, tl.trans(v_c), DOT), 0.0)
    d_xu = tl.where(support, _tl_dot(d_rows, tl.trans(u), DOT), 0.0)
    return d_xv, d_xu


@triton.jit
def _tl_dplr_scores_grad(
    dx_c, dk_c, db_c, own, dts, tiles, x_c, k_c, b_c, g_c, rows, side,
    pieces, slot, T, K, t, cols, at,
    HAS_G: tl.constexpr, GATE_GRAD: tl.constexpr, LEVELS: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """The gradient through a side's scores (side 0: x = q, qk and qb; side 1: x = a, ak and
    ab), from theirs on their support (in tiles tiles + 2 side and the next of dts, after T
    and the scores as _tl_dplr_bwd_states reads them), added to the gradients of x, k, b so
    far: it goes back as _tl_dplr_scores built them (the pairs r = j undecayed, side 0's only, then
    level by level, _tl_dplr_level_grad) or, without a gate (g_c never read), as the
    products for j <= r (side 0) or j < r (side 1). If GATE_GRAD, what each level's decays
    pass on to the gates, for _tl_dplr_bwd_gates to sum (here its scans spilled registers):
    side 0's own terms added to own (so far those of the states' decays and exp(c_C)), then
    written to plane slot of pieces, and from level 1 on (runs of 2 rows and more) the terms
    of the rows' and columns' scans to plane slot + level: a level's rows are the right
    halves of its blocks, its columns the left halves, so one plane holds both."""
    tiles += 2 * side
    if HAS_G:
        # the scores' pairs r = j, undecayed (side 0's)
        diagonal = dts + (tiles * rows.shape[0] + rows) * rows.shape[0] + rows  # d(xk)[r, r]
        on_q = (rows * 0 + side) == 0
        d_xk_diag = tl.load(diagonal, mask=on_q, other=0.0)[:, None]
        d_xb_diag = tl.load(diagonal + rows.shape[0] * rows.shape[0], mask=on_q, other=0.0)
        dx_c += d_xk_diag * k_c + d_xb_diag[:, None] * b_c
        dk_c += d_xk_diag * x_c
        db_c += d_xb_diag[:, None] * x_c
        # and block by block, as _tl_dplr_scores builds them
        for level in tl.static_range(LEVELS):
            tl.debug_barrier()  # not this level's tiles loaded early, beside the last one's
            dx_l, dk_l, db_l = _tl_dplr_level_grad(
                dts, tiles, x_c, k_c, b_c, g_c, rows, side, 1 << level, DOT
            )
            if GATE_GRAD and level == 0:  # runs of one row: only side 0's own terms
                own += tl.where(side == 0, x_c * dx_l, 0.0)
                _tl_store_rows(pieces, slot, T, K, t, cols, at, own)
            elif GATE_GRAD:  # the rows' terms where they are the level's rows, else the columns'
                right = _tl_dplr_right_half(rows, 1 << level)
                terms = tl.where(right, x_c * dx_l, k_c * dk_l + b_c * db_l)
                _tl_store_rows(pieces, slot + level, T, K, t, cols, at, terms)
            dx_c += dx_l
            dk_c += dk_l
            db_c += db_l
    else:
        pairs = rows[:, None] + 1 - side > rows[None, :]  # j <= r (side 0), j < r (side 1)
        dx_l, dk_l, db_l = _tl_dplr_pairs_grad(dts, tiles, rows, pairs, x_c, k_c, b_c, DOT)
        dx_c += dx_l
        dk_c += dk_l
        db_c += db_l
    return dx_c, dk_c, db_c
