"""The Triton kernel of the diagonal-plus-low-rank class: S_t = (diag(exp(g_t)) + b_t a_t^T)
S_{t-1} + k_t v_t^T, o_t = q_t S_t, with a log-gate g_t per key channel (KDA, RWKV-7). The same
chunked form as the PyTorch kernel (docs/algorithms.md, "Diagonal plus low rank"), fused: one
program per (batch, head, block of value columns) walks the chunks in order, keeping the state
in registers.

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
(the transposed mask). dQ, dK, dA, dB and dg sum over the value columns: each block of columns
writes its part and the parts are added after the launch.

Without a gate (gk=None) there are no decays: the scores are the causal products [Q K], [Q B],
[A K]', [A B]', and the kernel neither reads a gate nor splits the pairs into blocks.

A token whose key, value, a, b or gate is not finite poisons the outputs from it on (for a
value, in its column) and the state, as the recurrence does; the products inside the chunk run
over finite values.

Checked in triton's interpreter only; unmeasured on a GPU. At d_k = 128 and 64-token chunks a
program holds a dozen [64, 128] tiles (the inputs and their decays), more than a GPU's registers:
the first measurement will say whether it needs smaller chunks or the key columns split.
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
    _tl_gradients,
    _tl_key_gates,
    _tl_launch,
    _tl_levels,
    _tl_load_state,
    _tl_outputs,
    _tl_pairs,
    _tl_put_rows,
    _tl_rows,
    _tl_run_scan,
    _tl_run_sums,
    _tl_run_sums_grad,
    _tl_sizes,
    _tl_store_rows,
    _tl_store_state,
    _tl_strides,
    _tl_tile,
    _tl_tokens,
    _tl_unit_lower_inverse,
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
    qk = tl.where(q_pairs, _tl_dot(q, k_t, DOT), 0.0)
    qb = tl.where(q_pairs, _tl_dot(q, b_t, DOT), 0.0)
    ak = tl.where(a_pairs, _tl_dot(a, k_t, DOT), 0.0)
    ab = tl.where(a_pairs, _tl_dot(a, b_t, DOT), 0.0)
    return qk, qb, ak, ab


@triton.jit
def _tl_dplr_dots_grad(d_qk, d_qb, d_ak, d_ab, q, a, k, b, DOT: tl.constexpr):
    """The gradients for q, a, k and b of _tl_dplr_dots, from those of its scores (0 outside
    their pairs)."""
    dq = _tl_dot(d_qk, k, DOT) + _tl_dot(d_qb, b, DOT)
    da = _tl_dot(d_ak, k, DOT) + _tl_dot(d_ab, b, DOT)
    dk = _tl_dot(tl.trans(d_qk), q, DOT)
    dk += _tl_dot(tl.trans(d_ak), a, DOT)
    db = _tl_dot(tl.trans(d_qb), q, DOT)
    db += _tl_dot(tl.trans(d_ab), a, DOT)
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
def _tl_dplr_finite(k_c, v_c, a_c, b_c, g_c, HAS_G: tl.constexpr):
    """The guard of a chunk's inputs: (k, v, a, b and g (read only if HAS_G) with their entries
    that are not finite read as 0, the poison of the values [BT, BV] and that of the rows of
    the keys, a, b and gates [BT, BK]: 0 where finite, NaN where not). The products inside the
    chunk take the finite values; the poison, a non-finite value's in its column and the
    others' in the whole row, reaches the outputs from its token on and the state."""
    k_c, k_poison = _tl_finite(k_c)
    a_c, a_poison = _tl_finite(a_c)
    b_c, b_poison = _tl_finite(b_c)
    v_c, poison = _tl_finite(v_c)
    row_poison = k_poison + a_poison + b_poison
    if HAS_G:
        g_c, g_poison = _tl_finite(g_c)
        row_poison += g_poison
    return k_c, v_c, a_c, b_c, g_c, poison, row_poison


@triton.jit
def _tl_dplr_decayed(
    q_c,
    k_c,
    a_c,
    b_c,
    g_c,
    rows,
    HAS_G: tl.constexpr,
    BT: tl.constexpr,
    LEVELS: tl.constexpr,
    DOT: tl.constexpr,
):
    """What a chunk's products read, from its inputs and log-gates g_c [BT, BK] (read only if
    HAS_G): (the decayed scores qk, qb, ak, ab (_tl_dplr_scores; without a gate the causal
    products), and the rows and columns that meet the state, Q ⊙ exp(c), A ⊙ exp(c_{r-1}) and
    K, B ⊙ exp(c_C - c))."""
    if HAS_G:
        qk, qb, ak, ab = _tl_dplr_scores(q_c, k_c, a_c, b_c, g_c, rows, BT, LEVELS, DOT)
        from_start, from_before, to_end = _tl_dplr_decays(g_c, rows, BT)
        q_start, a_before = q_c * from_start, a_c * from_before
        k_end, b_end = k_c * to_end, b_c * to_end
    else:
        causal = rows[:, None] >= rows[None, :]
        strict = rows[:, None] > rows[None, :]
        qk, qb, ak, ab = _tl_dplr_dots(q_c, a_c, k_c, b_c, causal, strict, DOT)
        q_start, a_before, k_end, b_end = q_c, a_c, k_c, b_c
    return qk, qb, ak, ab, q_start, a_before, k_end, b_end


@triton.jit
def _tl_dplr_chunk(
    q_c, k_c, v_c, a_c, b_c, g_c, state, rows, ts, tiles,
    HAS_G: tl.constexpr, KEEP: tl.constexpr, BT: tl.constexpr, LEVELS: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """One chunk of the forward, from its inputs (g_c read only if HAS_G) and the state S
    entering it: (its outputs O = (Q ⊙ exp(c)) S + qk V + qb U, the state leaving it exp(c_C)
    ⊙ S + (K ⊙ exp(c_C - c))^T V + (B ⊙ exp(c_C - c))^T U), with U = T Z, T = (I - ab)^{-1}
    and Z = (A ⊙ exp(c_{r-1})) S + ak V; guarded by _tl_dplr_finite. KEEP, the first value
    block writes T, qk, qb and ak into tiles tiles, ..., tiles + 3 of ts (_tl_tile) as soon as
    T is known."""
    k_c, v_c, a_c, b_c, g_c, poison, row_poison = _tl_dplr_finite(k_c, v_c, a_c, b_c, g_c, HAS_G)
    decayed = _tl_dplr_decayed(q_c, k_c, a_c, b_c, g_c, rows, HAS_G, BT, LEVELS, DOT)
    qk, qb, ak, ab, q_start, a_before, k_end, b_end = decayed
    poison += tl.sum(row_poison, axis=1)[:, None]
    inverse = _tl_unit_lower_inverse(-ab, rows, BT)  # (I - ab)^{-1}
    if KEEP:
        if tl.program_id(0) == 0:  # the same for every value block
            tl.store(_tl_tile(ts, tiles, rows), inverse)
            tl.store(_tl_tile(ts, tiles + 1, rows), qk)
            tl.store(_tl_tile(ts, tiles + 2, rows), qb)
            tl.store(_tl_tile(ts, tiles + 3, rows), ak)
    reads = _tl_dot(a_before, state.to(a_c.dtype), DOT)
    reads += _tl_dot(ak, v_c, DOT)
    # finite inputs can still overflow in a later token's row, which a product with the
    # inverse or the scores would carry back to the earlier ones: such a row poisons too
    reads, reads_poison = _tl_finite(reads)
    u = _tl_dot(inverse, reads, DOT)  # u_r = a_r^T S_{r-1}
    u, u_poison = _tl_finite(u)
    poison += reads_poison + u_poison
    out = _tl_dot(q_start, state.to(q_c.dtype), DOT)
    out += _tl_dot(qk, v_c, DOT)
    out += _tl_dot(qb, u, DOT)
    out += tl.cumsum(poison, axis=0)
    if HAS_G:
        state = state * tl.exp(tl.sum(g_c, axis=0))[:, None]
    state += _tl_dot(tl.trans(k_end), v_c, DOT)
    state += _tl_dot(tl.trans(b_end), u, DOT)
    state += tl.sum(poison, axis=0)[None, :]
    return out, state


@triton.jit
def _tl_dplr_fwd(
    q, k, v, a, b, g, h0,  # read
    o, ht, hs, ts,  # written
    T, NH, K, V,
    sq_b, sq_h, sq_t, sq_d,
    sk_b, sk_h, sk_t, sk_d,
    sv_b, sv_h, sv_t, sv_d,
    sa_b, sa_h, sa_t, sa_d,
    sb_b, sb_h, sb_t, sb_d,
    sg_b, sg_h, sg_t, sg_d,
    so_b, so_h, so_t, so_d,
    HAS_G: tl.constexpr, KEEP: tl.constexpr, BT: tl.constexpr, LEVELS: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """One (value block, batch x head) program: the chunks in order, the state in registers
    (_tl_dplr_chunk). h0, ht: [B * NH, K, V]; hs (KEEP): the states entering each chunk
    [B * NH, N, K, V]; ts (KEEP): T and the scores qk, qb, ak of each chunk [B * NH, N, 4, BT,
    BT], written by the first value block; contiguous.
    HAS_G: whether there is a gate (without one, no decays)."""
    i_bh = tl.program_id(1)
    i_b, i_h = i_bh // NH, i_bh % NH
    rows = tl.arange(0, BT)
    cols_k, cols_v, in_k, in_v = _tl_columns(K, V, BK, BV)
    state = _tl_load_state(h0, i_bh, K, V, cols_k, cols_v)
    n_chunks = tl.cdiv(T, BT)
    for n in range(0, n_chunks):
        t, _, at_k, at_v = _tl_tokens(n, rows, T, in_k, in_v)
        q_c = _tl_rows(q, sq_b, sq_h, sq_t, sq_d, i_b, i_h, t, cols_k, at_k)
        k_c = _tl_rows(k, sk_b, sk_h, sk_t, sk_d, i_b, i_h, t, cols_k, at_k)
        v_c = _tl_rows(v, sv_b, sv_h, sv_t, sv_d, i_b, i_h, t, cols_v, at_v)
        a_c = _tl_rows(a, sa_b, sa_h, sa_t, sa_d, i_b, i_h, t, cols_k, at_k)
        b_c = _tl_rows(b, sb_b, sb_h, sb_t, sb_d, i_b, i_h, t, cols_k, at_k)
        if HAS_G:
            g_c = _tl_key_gates(g, sg_b, sg_h, sg_t, sg_d, i_b, i_h, t, cols_k, at_k)
        else:
            g_c = tl.zeros((BT, BK), dtype=q_c.dtype)  # never read
        if KEEP:
            _tl_store_state(hs, i_bh * n_chunks + n, K, V, cols_k, cols_v, state)
        tiles = (i_bh * n_chunks + n) * 4  # where this chunk's T and scores are kept
        out, state = _tl_dplr_chunk(
            q_c, k_c, v_c, a_c, b_c, g_c, state, rows, ts, tiles, HAS_G, KEEP, BT, LEVELS, DOT
        )
        _tl_put_rows(o, so_b, so_h, so_t, so_d, i_b, i_h, t, cols_v, at_v, out)
    _tl_store_state(ht, i_bh, K, V, cols_k, cols_v, state)


@triton.jit
def _tl_dplr_kept(ts, tiles, rows):
    """T and the scores qk, qb, ak of a chunk, as the forward kept them in tiles tiles, ...,
    tiles + 3 of ts (_tl_tile)."""
    inverse = tl.load(_tl_tile(ts, tiles, rows))
    qk = tl.load(_tl_tile(ts, tiles + 1, rows))
    qb = tl.load(_tl_tile(ts, tiles + 2, rows))
    ak = tl.load(_tl_tile(ts, tiles + 3, rows))
    return inverse, qk, qb, ak


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


@triton.jit
def _tl_dplr_chunk_grad(
    q_c, k_c, v_c, a_c, b_c, g_c, do_c, state, d_state, inverse, qk, qb, ak, rows,
    HAS_G: tl.constexpr, GATE_GRAD: tl.constexpr, BT: tl.constexpr, LEVELS: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """One chunk of the backward, from its inputs (g_c read only if HAS_G), the output gradient
    do_c, the state S entering it, T and the scores qk, qb, ak (kept by the forward) and the
    gradient D of the state leaving it: (dQ, dK, dV, dA, dB, dg (zeros unless GATE_GRAD), the
    gradient of the state entering the chunk). U is made again; dU = qb^T dO + (B ⊙ exp(c_C -
    c)) D, dZ = T^T dU, dV = qk^T dO + (K ⊙ exp(c_C - c)) D + ak^T dZ, the decayed inputs get
    dO S^T, dZ S^T, V D^T and U D^T, the scores d(qk, qb) = dO (V, U)^T and d(ak, ab) = dZ (V,
    U)^T, which go back to the inputs (_tl_dplr_scores_grad), and
    D <- exp(c_C) ⊙ D + (Q ⊙ exp(c))^T dO + (A ⊙ exp(c_{r-1}))^T dZ."""
    if HAS_G:
        from_start, from_before, to_end = _tl_dplr_decays(g_c, rows, BT)
        q_start, a_before = q_c * from_start, a_c * from_before
        k_end, b_end = k_c * to_end, b_c * to_end
    else:
        q_start, a_before, k_end, b_end = q_c, a_c, k_c, b_c
    reads = _tl_dot(a_before, state, DOT)
    reads += _tl_dot(ak, v_c, DOT)
    u = _tl_dot(inverse, reads, DOT)
    # dU = qb^T dO + (B ⊙ exp(c_C - c)) D, dZ = T^T dU
    d_u = _tl_dot(tl.trans(qb), do_c, DOT)
    d_u += _tl_dot(b_end, d_state, DOT)
    d_reads = _tl_dot(tl.trans(inverse), d_u, DOT)
    d_qk, d_qb, d_ak, d_ab = _tl_dplr_d_scores(do_c, d_reads, v_c, u, rows, DOT)
    dv_c = _tl_dot(tl.trans(qk), do_c, DOT)
    dv_c += _tl_dot(k_end, d_state, DOT)
    dv_c += _tl_dot(tl.trans(ak), d_reads, DOT)
    # through the decayed inputs: Q ⊙ exp(c), A ⊙ exp(c_{r-1}), K and B ⊙ exp(c_C - c)
    dq_c = _tl_dot(do_c, tl.trans(state), DOT)
    da_c = _tl_dot(d_reads, tl.trans(state), DOT)
    dk_c = _tl_dot(v_c, tl.trans(d_state), DOT)
    db_c = _tl_dot(u, tl.trans(d_state), DOT)
    dg_c = tl.zeros_like(dq_c)
    if HAS_G:
        dq_c, da_c = dq_c * from_start, da_c * from_before
        dk_c, db_c = dk_c * to_end, db_c * to_end
        if GATE_GRAD:
            # each decay's log is a sum of gates under a mask: its input times its
            # gradient goes back to those gates through the transposed mask
            dg_c = _tl_dplr_decays_grad(q_c * dq_c, a_c * da_c, k_c * dk_c + b_c * db_c, rows, BT)
            through_state = tl.sum(state * d_state, axis=1) * tl.exp(tl.sum(g_c, axis=0))
            dg_c += through_state[None, :]  # for exp(c_C)
    dq_c, da_c, dk_c, db_c, dg_c = _tl_dplr_scores_grad(
        dq_c, da_c, dk_c, db_c, dg_c, d_qk, d_qb, d_ak, d_ab, q_c, a_c, k_c, b_c, g_c, rows,
        HAS_G, GATE_GRAD, LEVELS, DOT,
    )  # fmt: skip
    # D <- exp(c_C) ⊙ D + (Q ⊙ exp(c))^T dO + (A ⊙ exp(c_{r-1}))^T dZ
    if HAS_G:
        d_state = d_state * tl.exp(tl.sum(g_c, axis=0))[:, None]
    d_state += _tl_dot(tl.trans(q_start), do_c, DOT)
    d_state += _tl_dot(tl.trans(a_before), d_reads, DOT)
    return dq_c, dk_c, dv_c, da_c, db_c, dg_c, d_state


@triton.jit
def _tl_dplr_bwd(
    q, k, v, a, b, g, do, hs, ts, dht,  # read
    dq, dk, dv, da, db, dg, dh0,  # written
    T, NH, K, V,
    sq_b, sq_h, sq_t, sq_d,
    sk_b, sk_h, sk_t, sk_d,
    sv_b, sv_h, sv_t, sv_d,
    sa_b, sa_h, sa_t, sa_d,
    sb_b, sb_h, sb_t, sb_d,
    sg_b, sg_h, sg_t, sg_d,
    sdo_b, sdo_h, sdo_t, sdo_d,
    HAS_G: tl.constexpr, GATE_GRAD: tl.constexpr, BT: tl.constexpr, LEVELS: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """One (value block, batch x head) program: the chunks from the last, the gradient of the
    state in registers (_tl_dplr_chunk_grad). hs, ts: as _tl_dplr_fwd kept them; dq, dk, da,
    db, dg: this block's parts [NV, B * NH, T, K]; dv [B * NH, T, V]; dht, dh0 [B * NH, K, V];
    all contiguous."""
    i_bh = tl.program_id(1)
    i_b, i_h = i_bh // NH, i_bh % NH
    rows = tl.arange(0, BT)
    cols_k, cols_v, in_k, in_v = _tl_columns(K, V, BK, BV)
    d_state = _tl_load_state(dht, i_bh, K, V, cols_k, cols_v)
    n_chunks = tl.cdiv(T, BT)
    part = tl.program_id(0) * tl.num_programs(1) + i_bh  # this block's part of dq, dk, ...
    for m in range(0, n_chunks):
        n = n_chunks - 1 - m
        t, _, at_k, at_v = _tl_tokens(n, rows, T, in_k, in_v)
        q_c = _tl_rows(q, sq_b, sq_h, sq_t, sq_d, i_b, i_h, t, cols_k, at_k)
        k_c = _tl_rows(k, sk_b, sk_h, sk_t, sk_d, i_b, i_h, t, cols_k, at_k)
        v_c = _tl_rows(v, sv_b, sv_h, sv_t, sv_d, i_b, i_h, t, cols_v, at_v)
        a_c = _tl_rows(a, sa_b, sa_h, sa_t, sa_d, i_b, i_h, t, cols_k, at_k)
        b_c = _tl_rows(b, sb_b, sb_h, sb_t, sb_d, i_b, i_h, t, cols_k, at_k)
        do_c = _tl_rows(do, sdo_b, sdo_h, sdo_t, sdo_d, i_b, i_h, t, cols_v, at_v)
        if HAS_G:
            g_c = _tl_key_gates(g, sg_b, sg_h, sg_t, sg_d, i_b, i_h, t, cols_k, at_k)
        else:
            g_c = tl.zeros((BT, BK), dtype=q_c.dtype)  # never read
        state = _tl_load_state(hs, i_bh * n_chunks + n, K, V, cols_k, cols_v)
        inverse, qk, qb, ak = _tl_dplr_kept(ts, (i_bh * n_chunks + n) * 4, rows)
        dq_c, dk_c, dv_c, da_c, db_c, dg_c, d_state = _tl_dplr_chunk_grad(
            q_c, k_c, v_c, a_c, b_c, g_c, do_c, state, d_state, inverse, qk, qb, ak, rows,
            HAS_G, GATE_GRAD, BT, LEVELS, DOT,
        )  # fmt: skip
        _tl_store_rows(dv, i_bh, T, V, t, cols_v, at_v, dv_c)
        _tl_store_rows(dq, part, T, K, t, cols_k, at_k, dq_c)
        _tl_store_rows(dk, part, T, K, t, cols_k, at_k, dk_c)
        _tl_store_rows(da, part, T, K, t, cols_k, at_k, da_c)
        _tl_store_rows(db, part, T, K, t, cols_k, at_k, db_c)
        if HAS_G:
            if GATE_GRAD:
                _tl_store_rows(dg, part, T, K, t, cols_k, at_k, dg_c)
    _tl_store_state(dh0, i_bh, K, V, cols_k, cols_v, d_state)


def _tl_dplr_forward(q, k, v, a, b, gk, initial_state, chunk_size, keep, dot):
    """(o [B, NH, T, V], final state [B, NH, K, V], and if keep the states entering each chunk
    [B, NH, N, K, V] and T and the scores qk, qb, ak of each chunk [B, NH, N, 4, C, C], else
    Nones)."""
    batch, heads, length, d_k = q.shape
    d_v = v.shape[-1]
    block_t, block_k, block_v, grid, n_chunks = _tl_sizes(q, v, chunk_size, _tl_dplr_fwd)
    initial_state, o, final, states = _tl_outputs(q, v, initial_state, n_chunks, keep)
    tiles = final.new_empty(batch, heads, n_chunks, 4, block_t, block_t) if keep else final
    _tl_dplr_fwd[grid](
        q, k, v, a, b, q if gk is None else gk, initial_state,  # read
        o, final, states, tiles,  # written
        length, heads, d_k, d_v,
        *(stride for x in (q, k, v, a, b, gk, o) for stride in _tl_strides(x, 4)),
        HAS_G=gk is not None, KEEP=keep, BT=block_t, LEVELS=_tl_levels(block_t), BK=block_k,
        BV=block_v, DOT=dot, **_tl_launch(_tl_dplr_fwd),
    )  # fmt: skip
    return o, final, (states, tiles) if keep else (None, None)


class _TlDplr(torch.autograd.Function):
    """The fused kernel under autograd: the forward keeps the inputs, the states entering each
    chunk, T and the scores; the backward is one launch of _tl_dplr_bwd."""

    @staticmethod
    def forward(ctx, q, k, v, a, b, gk, initial_state, chunk_size, operands):
        dot = _tl_dot_precision(q, _tl_dplr_fwd, operands)
        o, final, kept = _tl_dplr_forward(q, k, v, a, b, gk, initial_state, chunk_size, True, dot)
        ctx.save_for_backward(q, k, v, a, b, gk, *kept)
        ctx.chunk_size, ctx.dot = chunk_size, dot
        return o, final

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_o, d_final):
        q, k, v, a, b, gk, states, tiles = ctx.saved_tensors
        heads, length, d_k = q.shape[1:]
        d_v = v.shape[-1]
        block_t, block_k, block_v, grid, _ = _tl_sizes(q, v, ctx.chunk_size, _tl_dplr_bwd)
        n_v = grid[0]
        d_o, d_final, dq, dk, dv, d_initial = _tl_gradients(q, v, d_o, d_final, n_v)
        da, db = torch.empty_like(dq), torch.empty_like(dq)
        gate_grad = gk is not None and ctx.needs_input_grad[5]
        dg = torch.empty_like(dq) if gate_grad else dq
        _tl_dplr_bwd[grid](
            q,
            k,
            v,
            a,
            b,
            q if gk is None else gk,
            d_o,
            states,
            tiles,
            d_final,
            dq,
            dk,
            dv,
            da,
            db,
            dg,
            d_initial,
            length,
            heads,
            d_k,
            d_v,
            *_tl_strides(q, 4),
            *_tl_strides(k, 4),
            *_tl_strides(v, 4),
            *_tl_strides(a, 4),
            *_tl_strides(b, 4),
            *_tl_strides(gk, 4),
            *_tl_strides(d_o, 4),
            HAS_G=gk is not None,
            GATE_GRAD=gate_grad,
            BT=block_t,
            LEVELS=_tl_levels(block_t),
            BK=block_k,
            BV=block_v,
            DOT=ctx.dot,
            **_tl_launch(_tl_dplr_bwd),
        )
        dq, dk, da, db = (x.sum(0) for x in (dq, dk, da, db))
        d_gate = dg.sum(0) if gate_grad else None
        d_initial = d_initial if ctx.needs_input_grad[6] else None  # None: no initial state
        return dq, dk, dv, da, db, d_gate, d_initial, None, None


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
    _tl_check_device(_tl_dplr_fwd, q)
    gk = None if gk is None else gk.expand_as(k)
    if _needs_grad(q, k, v, a, b, gk, initial_state):
        return _TlDplr.apply(q, k, v, a, b, gk, initial_state, chunk_size, operands)
    dot = _tl_dot_precision(q, _tl_dplr_fwd, operands)
    o, final, _ = _tl_dplr_forward(q, k, v, a, b, gk, initial_state, chunk_size, False, dot)
    return o, final
