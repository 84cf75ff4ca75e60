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
    _tl_pairs,
    _tl_run_scan,
    _tl_run_sums,
    _tl_run_sums_grad,
)


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
def _tl_dplr_decays_grad(d_up_to, d_before, d_after, rows, RUN: tl.constexpr):
    """The gradient for g of the three sums in _tl_dplr_decays(g, rows, RUN), from theirs."""
    d_g = _tl_run_sums_grad(d_up_to, d_after, rows, RUN)
    return d_g + _tl_run_scan(d_before, RUN, True, False)


@triton.jit
def _tl_dplr_dots(q, a, k, b, q_pairs, a_pairs, DOT: tl.constexpr):
    """The scores [BT, BT] of rows q and a with columns k and b: q k^T and q b^T where q_pairs,
    a k^T and a b^T where a_pairs, 0 elsewhere."""
    k_t, b_t = tl.trans(k), tl.trans(b)
    qk = tl.where(q_pairs, _tl_dot_in_registers(q, k_t, DOT), 0.0)
    qb = tl.where(q_pairs, _tl_dot_in_registers(q, b_t, DOT), 0.0)
    ak = tl.where(a_pairs, _tl_dot_in_registers(a, k_t, DOT), 0.0)
    ab = tl.where(a_pairs, _tl_dot_in_registers(a, b_t, DOT), 0.0)
    return qk, qb, ak, ab


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
def _tl_dplr_dots_grad(d_qk, d_qb, d_ak, d_ab, q, a, k, b, DOT: tl.constexpr):
    """The gradients for q, a, k and b of _tl_dplr_dots, from those of its scores (0 outside
    their pairs)."""
    dq = _tl_dot_in_registers(d_qk, k, DOT) + _tl_dot_in_registers(d_qb, b, DOT)
    da = _tl_dot_in_registers(d_ak, k, DOT) + _tl_dot_in_registers(d_ab, b, DOT)
    dk = _tl_dot_in_registers(tl.trans(d_qk), q, DOT)
    dk += _tl_dot_in_registers(tl.trans(d_ak), a, DOT)
    db = _tl_dot_in_registers(tl.trans(d_qb), q, DOT)
    db += _tl_dot_in_registers(tl.trans(d_ab), a, DOT)
    return dq, da, dk, db


@triton.jit
def _tl_dplr_scores(q, k, a, b, g, rows, BT: tl.constexpr, LEVELS: tl.constexpr, DOT: tl.constexpr):
    """The decayed scores of a chunk [BT, BT]: qk[r, j] = Σ_c q_rc exp(c_rc - c_jc) k_jc and qb
    (the same with b) for j <= r, ak[r, j] = Σ_c a_rc exp(c_{r-1,c} - c_jc) k_jc and ab (the
    same with b) for j < r, 0 elsewhere; the pairs r = j undecayed, the others block by block:
    at each level, the rows decayed from the boundary of their block's halves and the columns to
    it (_tl_dplr_decays over the halves: a left half's rows and a right half's columns are
    decayed too, but outside the level's pairs)."""
    diagonal = rows[:, None] == rows[None, :]
    qk = tl.where(diagonal, tl.sum(q * k, axis=1)[:, None], 0.0)
    qb = tl.where(diagonal, tl.sum(q * b, axis=1)[:, None], 0.0)
    ak = tl.zeros([BT, BT], dtype=q.dtype)
    ab = tl.zeros([BT, BT], dtype=q.dtype)
    for level in tl.static_range(LEVELS):
        row, row_before, col = _tl_dplr_decays(g, rows, 1 << level)
        pairs = _tl_pairs(rows, 1 << level)
        qk_l, qb_l, ak_l, ab_l = _tl_dplr_dots(
            q * row, a * row_before, k * col, b * col, pairs, pairs, DOT
        )
        qk += qk_l
        qb += qb_l
        ak += ak_l
        ab += ab_l
    return qk, qb, ak, ab


@triton.jit
def _tl_dplr_level_grad(
    d_qk, d_qb, d_ak, d_ab, q_c, a_c, k_c, b_c, g_c, rows, RUN: tl.constexpr, DOT: tl.constexpr
):
    """The gradients for q, a, k and b of one level of _tl_dplr_scores' blocks, RUN tokens a
    half, from those of the scores (0 outside their pairs): through that level's products of
    the rows decayed from the boundary of their block's halves and the columns decayed to it,
    and through those decays."""
    row, row_before, col = _tl_dplr_decays(g_c, rows, RUN)
    pairs = _tl_pairs(rows, RUN)
    dq_l, da_l, dk_l, db_l = _tl_dplr_dots_grad(
        tl.where(pairs, d_qk, 0.0), tl.where(pairs, d_qb, 0.0),
        tl.where(pairs, d_ak, 0.0), tl.where(pairs, d_ab, 0.0),
        q_c * row, a_c * row_before, k_c * col, b_c * col, DOT,
    )  # fmt: skip
    return dq_l * row, da_l * row_before, dk_l * col, db_l * col


@triton.jit
def _tl_dplr_d_scores(do_c, d_reads, v_c, u, rows, DOT: tl.constexpr):
    """The gradients of a chunk's scores on their support, from those of the outputs and of Z
    (the right side of (I - ab) U = Z): (d(qk), d(qb)) = dO (V, U)^T for j <= r and (d(ak),
    d(ab)) = dZ (V, U)^T for j < r, 0 elsewhere."""
    causal = rows[:, None] >= rows[None, :]
    strict = rows[:, None] > rows[None, :]
    d_qk = tl.where(causal, _tl_dot(do_c, tl.trans(v_c), DOT), 0.0)
    d_qb = tl.where(causal, _tl_dot(do_c, tl.trans(u), DOT), 0.0)
    d_ak = tl.where(strict, _tl_dot(d_reads, tl.trans(v_c), DOT), 0.0)
    d_ab = tl.where(strict, _tl_dot(d_reads, tl.trans(u), DOT), 0.0)
    return d_qk, d_qb, d_ak, d_ab


@triton.jit
def _tl_dplr_scores_grad(
    dq_c, da_c, dk_c, db_c, dg_c,
    d_qk, d_qb, d_ak, d_ab, q_c, a_c, k_c, b_c, g_c, rows,
    HAS_G: tl.constexpr, GATE_GRAD: tl.constexpr, LEVELS: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """The gradient through a chunk's scores, from theirs on their support, added to the
    gradients of q, a, k, b and (if GATE_GRAD) the gate so far: it goes back as
    _tl_dplr_scores built them (the pairs r = j undecayed, then level by level,
    _tl_dplr_level_grad, each level's decays passing on to the gates of their sums) or,
    without a gate (g_c never read), as the causal products."""
    if HAS_G:
        # the scores' pairs r = j, undecayed
        diagonal = rows[:, None] == rows[None, :]
        d_qk_diag = tl.sum(tl.where(diagonal, d_qk, 0.0), axis=1)[:, None]
        d_qb_diag = tl.sum(tl.where(diagonal, d_qb, 0.0), axis=1)[:, None]
        dq_c += d_qk_diag * k_c + d_qb_diag * b_c
        dk_c += d_qk_diag * q_c
        db_c += d_qb_diag * q_c
        # and block by block, as _tl_dplr_scores builds them
        for level in tl.static_range(LEVELS):
            dq_l, da_l, dk_l, db_l = _tl_dplr_level_grad(
                d_qk, d_qb, d_ak, d_ab, q_c, a_c, k_c, b_c, g_c, rows, 1 << level, DOT
            )
            if GATE_GRAD:
                dg_c += _tl_dplr_decays_grad(
                    q_c * dq_l, a_c * da_l, k_c * dk_l + b_c * db_l, rows, 1 << level
                )
            dq_c += dq_l
            da_c += da_l
            dk_c += dk_l
            db_c += db_l
    else:
        dq_l, da_l, dk_l, db_l = _tl_dplr_dots_grad(d_qk, d_qb, d_ak, d_ab, q_c, a_c, k_c, b_c, DOT)
        dq_c += dq_l
        da_c += da_l
        dk_c += dk_l
        db_c += db_l
    return dq_c, da_c, dk_c, db_c, dg_c
