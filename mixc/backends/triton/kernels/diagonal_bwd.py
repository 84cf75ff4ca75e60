"""The backward of the diagonal-gate Triton kernel (diagonal.py), in two launches split as
flash-linear-attention splits GLA's backward, each small enough for its registers. Per chunk,
with S the state entering it (kept by the forward), D the gradient of the state leaving it and
A the decayed scores (the binary split of diagonal.py's docstring):

    D <- diag(exp(b_C)) D + (Q ⊙ exp(b))^T dO
    dA = dO V^T on A's support,  dV = A^T dO + (K ⊙ exp(b_C - b)) D
    dQ = (dA through the levels) + (dO S^T) ⊙ exp(b)
    dK = (dA through the levels) + (V D^T) ⊙ exp(b_C - b)

_tl_diagonal_bwd_states (a program per value block and key block) walks the chunks from the
last with its tile of D in registers, writing the D leaving each chunk (and the gradient of the
initial state); _tl_diagonal_bwd_grads (a program per chunk and key block, the chunks in
parallel) sums dA, dO S^T, V D^T and the rows of S ⊙ D over the value columns, BV at a time,
hands dA back through the levels to the decayed queries and keys (_tl_diagonal_scores_grad),
writes dQ, dK and the gate's gradient whole, then, the value columns again, its key block's part
of dV (A's part over its key columns); the parts are added after the launch. The gate's
gradient, per channel, sums what each decay factor passes on (_tl_run_sums_grad).
"""

import torch
import triton
import triton.language as tl

from mixc.backends.triton.kernels.common import (
    _tl_columns,
    _tl_dot,
    _tl_gates,
    _tl_gradients,
    _tl_key_gates,
    _tl_launch,
    _tl_levels,
    _tl_load_state,
    _tl_operand,
    _tl_pairs,
    _tl_rows,
    _tl_run_sums,
    _tl_run_sums_grad,
    _tl_sizes,
    _tl_split_dot,
    _tl_store_rows,
    _tl_store_state,
    _tl_strides,
    _tl_sum_parts,
    _tl_tokens,
    _tl_wide,
)


@triton.jit
def _tl_diagonal_gates(g, sg_b, sg_h, sg_t, sg_d, i_b, i_h, t, cols_k, at_k):
    """The log-gates of a chunk [BT, BK] and its poison [BT] (0 for a token whose gates are all
    finite, NaN otherwise); a gate below -1e30 (a hard reset, -inf) is read as -1e30 (its decay
    is still 0), and a token that is not finite reads zeros (see diagonal.py's docstring)."""
    gates = _tl_key_gates(g, sg_b, sg_h, sg_t, sg_d, i_b, i_h, t, cols_k, at_k)
    poison = tl.sum(tl.exp(gates) * 0.0, axis=1)
    return tl.where(poison[:, None] == 0.0, gates, 0.0), poison


@triton.jit
def _tl_diagonal_scores(q_c, k_c, g_c, rows, LEVELS: tl.constexpr, DOT: tl.constexpr):
    """The decayed scores A [BT, BT] of a chunk from its queries, keys and log-gates g_c
    [BT, BK]: the pairs i = j undecayed, then at each level of blocks of 2, 4, ..., BT tokens
    one matmul of the queries decayed from the boundary of their block's halves, exp(b_i -
    b_r), and the keys decayed to it, exp(b_r - b_j), kept where the pairs are that level's."""
    same = rows[:, None] == rows[None, :]
    scores = tl.where(same, tl.sum(_tl_wide(q_c) * k_c, axis=1)[:, None], 0.0)  # i = j
    for level in tl.static_range(LEVELS):
        from_left, to_right = _tl_run_sums(g_c, rows, 2**level)
        q_l = q_c * tl.exp(from_left)  # exp(b_i - b_r)
        k_l = k_c * tl.exp(to_right)  # exp(b_r - b_j)
        corner = _tl_dot(q_l, tl.trans(k_l), DOT)
        scores = tl.where(_tl_pairs(rows, 2**level), corner, scores)  # its pairs only
    return scores


@triton.jit
def _tl_diagonal_scores_grad(
    q_c, k_c, g_c, d_scores, dq_c, dk_c, dg_c, rows,
    GATE_GRAD: tl.constexpr, LEVELS: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """The gradient through the scores A (_tl_diagonal_scores) from dA [BT, BT] on A's
    support, added to dq_c, dk_c and (GATE_GRAD) dg_c [BT, BK]: the pairs i = j, then each
    level hands its corner of dA back to its decayed queries and keys, and (GATE_GRAD) what
    their decays pass on back to the gates of their sums (_tl_run_sums_grad). A itself is not
    made here: beside these tiles it spilled on sm_90 (its own pass, for dV, follows)."""
    same = rows[:, None] == rows[None, :]
    d_same = tl.sum(tl.where(same, d_scores, 0.0), axis=1)[:, None]  # i = j
    dq_c += d_same * k_c
    dk_c += d_same * q_c
    d_scores = _tl_operand(d_scores, DOT)  # rounded once (16-bit: half the registers)
    for level in tl.static_range(LEVELS):
        from_left, to_right = _tl_run_sums(g_c, rows, 2**level)
        left_decay, right_decay = tl.exp(from_left), tl.exp(to_right)
        q_l, k_l = q_c * left_decay, k_c * right_decay
        d_corner = tl.where(_tl_pairs(rows, 2**level), d_scores, 0.0)
        d_q_l = _tl_dot(d_corner, k_l, DOT)  # for the decayed queries
        d_k_l = _tl_dot(tl.trans(d_corner), q_l, DOT)  # and keys
        dq_c += d_q_l * left_decay
        dk_c += d_k_l * right_decay
        if GATE_GRAD:
            dg_c += _tl_run_sums_grad(d_q_l * q_l, d_k_l * k_l, rows, 2**level)
    return dq_c, dk_c, dg_c


@triton.jit
def _tl_diagonal_state_grads(q_c, k_c, g_c, from_q, from_k, whole, rows, GATE_GRAD: tl.constexpr):
    """The chunk's gradients through the state, from dO S^T (from_q), V D^T (from_k) and the
    rows of S ⊙ D summed over the value columns (whole [BK]): (dQ through (Q ⊙ exp(b)) S, dK
    through (K ⊙ exp(b_C - b))^T V, the gates' through exp(b), exp(b_C - b) and exp(b_C) (zeros
    unless GATE_GRAD), and exp(b_C - b) [BT, BK])."""
    from_start, to_end = _tl_run_sums(g_c, rows, rows.shape[0])
    end_decay = tl.exp(to_end)
    dq_c, dk_c = from_q * tl.exp(from_start), from_k * end_decay
    dg_c = tl.zeros_like(g_c)
    if GATE_GRAD:
        dg_c = _tl_run_sums_grad(dq_c * q_c, dk_c * k_c, rows, rows.shape[0])
        dg_c += (whole * tl.exp(tl.sum(g_c, axis=0)))[None, :]
    return dq_c, dk_c, dg_c, end_decay


@triton.jit
def _tl_chunk_value_sums(
    v, do, hs, dhs,  # read
    sv_b, sv_h, sv_t, sv_d,
    sdo_b, sdo_h, sdo_t, sdo_d,
    i_b, i_h, i_state, t, in_t, cols_k, K, V,
    WIDE: tl.constexpr, BV: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """A chunk's sums over the value columns, BV at a time, for the backward of a program that
    holds its key columns cols_k whole over the values: (dO V^T [BT, BT], dO S^T and V D^T
    [BT, BK], the rows of S ⊙ D [BK]), with S (hs) the state entering the chunk i_state and D
    (dhs) the gradient of the state leaving it [B * NH, N, K, V] (contiguous); dO S^T at about
    float32's accuracy if WIDE (_tl_split_dot), and V D^T too with 16-bit products."""
    d_scores = tl.zeros((t.shape[0], t.shape[0]), dtype=hs.dtype.element_ty)  # dO V^T
    from_q = tl.zeros((t.shape[0], cols_k.shape[0]), dtype=d_scores.dtype)  # dO S^T
    from_k = tl.zeros((t.shape[0], cols_k.shape[0]), dtype=d_scores.dtype)  # V D^T
    whole = tl.zeros((cols_k.shape[0],), dtype=d_scores.dtype)  # the rows of S ⊙ D
    for j in range(0, tl.cdiv(V, BV)):
        cols_v = j * BV + tl.arange(0, BV)
        at_v = in_t[:, None] & (cols_v < V)[None, :]
        do_j = _tl_operand(_tl_rows(do, sdo_b, sdo_h, sdo_t, sdo_d, i_b, i_h, t, cols_v, at_v), DOT)
        v_j = _tl_operand(_tl_rows(v, sv_b, sv_h, sv_t, sv_d, i_b, i_h, t, cols_v, at_v), DOT)
        state = _tl_load_state(hs, i_state, K, V, cols_k, cols_v)
        d_state = _tl_load_state(dhs, i_state, K, V, cols_k, cols_v)
        d_scores += _tl_dot(do_j, tl.trans(v_j), DOT)
        if WIDE:
            from_q += _tl_split_dot(do_j, tl.trans(state), DOT)
        else:
            from_q += _tl_dot(do_j, tl.trans(state), DOT)
        if WIDE and (DOT == "bf16" or DOT == "bf16 emulated" or DOT == "fp16"):
            from_k += _tl_split_dot(v_j, tl.trans(d_state), DOT)
        else:
            from_k += _tl_dot(v_j, tl.trans(d_state), DOT)
        whole += tl.sum(state * d_state, axis=1)  # the compiler drops it where it is not read
    return d_scores, from_q, from_k, whole


@triton.jit
def _tl_chunk_value_grads(
    do, dhs,  # read
    dv,  # written
    sdo_b, sdo_h, sdo_t, sdo_d,
    i_b, i_h, i_state, part, t, in_t, cols_k, T, K, V, scores, k_end,
    WIDE: tl.constexpr, BV: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """A chunk's part of dV from a program's key columns cols_k, the value columns BV at a time:
    scores^T dO + k_end D, scores [BT, BT] (the chunk's decayed scores over those key columns)
    and k_end [BT, BK] (its keys decayed to the chunk's end) as the products take them, D
    (dhs) as in _tl_chunk_value_sums; written to part `part` of dv [NK * B * NH, T, V]. WIDE,
    with 16-bit products: scores in float32, scores^T dO at about float32's accuracy, the
    scores the sum of their 16-bit rounding and the rest (two products, as _tl_split_dot)."""
    split = WIDE and (DOT == "bf16" or DOT == "bf16 emulated" or DOT == "fp16")
    for j in range(0, tl.cdiv(V, BV)):
        cols_v = j * BV + tl.arange(0, BV)
        at_v = in_t[:, None] & (cols_v < V)[None, :]
        do_j = _tl_operand(_tl_rows(do, sdo_b, sdo_h, sdo_t, sdo_d, i_b, i_h, t, cols_v, at_v), DOT)
        d_state = _tl_load_state(dhs, i_state, K, V, cols_k, cols_v)
        dv_j = _tl_dot(tl.trans(scores), do_j, DOT) + _tl_dot(k_end, d_state, DOT)
        if split:  # the part of the scores their 16-bit rounding dropped
            dv_j += _tl_dot(tl.trans(scores - _tl_operand(scores, DOT)), do_j, DOT)
        _tl_store_rows(dv, part, T, V, t, cols_v, at_v, dv_j)


@triton.jit
def _tl_diagonal_bwd_states(
    q, g, do, dht,  # read
    dhs, dh0,  # written
    T, NH, K, V,
    sq_b, sq_h, sq_t, sq_d,
    sg_b, sg_h, sg_t, sg_d,
    sdo_b, sdo_h, sdo_t, sdo_d,
    HAS_G: tl.constexpr, SCALAR: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """One (value block, batch x head, key block) program: the chunks from the last, its tile of
    D in registers. Per chunk: D (the gradient of the state leaving it) to dhs
    [B * NH, N, K, V], then D <- diag(exp(b_C)) D + (Q ⊙ exp(b))^T dO. dht, dh0:
    [B * NH, K, V]; all contiguous. SCALAR (the scalar-decay backward, scalar_decay_bwd.py):
    g is one log-gate a token [B, NH, T] (sg_d unread), and the decays scale dO's rows, so
    that the products take the queries as given (with Q ⊙ exp(b) rounded to 16 bits instead,
    the bfloat16 fuzz of RetNet's gamma erred 4x more)."""
    i_bh = tl.program_id(1)
    i_b, i_h = i_bh // NH, i_bh % NH
    rows = tl.arange(0, BT)
    cols_k, cols_v, in_k, in_v = _tl_columns(K, V, BK, BV)
    d_state = _tl_load_state(dht, i_bh, K, V, cols_k, cols_v)
    n_chunks = tl.cdiv(T, BT)
    for m in range(0, n_chunks):
        n = n_chunks - 1 - m
        t, in_t, at_k, at_v = _tl_tokens(n, rows, T, in_k, in_v)
        _tl_store_state(dhs, i_bh * n_chunks + n, K, V, cols_k, cols_v, d_state)
        q_c = _tl_operand(_tl_rows(q, sq_b, sq_h, sq_t, sq_d, i_b, i_h, t, cols_k, at_k), DOT)
        do_c = _tl_operand(_tl_rows(do, sdo_b, sdo_h, sdo_t, sdo_d, i_b, i_h, t, cols_v, at_v), DOT)
        if HAS_G and SCALAR:  # dO's rows decayed, the queries multiplied as they are
            g_c = _tl_gates(g, sg_b, sg_h, sg_t, i_b, i_h, t, in_t)
            do_start = do_c * tl.exp(tl.cumsum(g_c, axis=0))[:, None]  # diag(exp(b)) dO
            d_state = d_state * tl.exp(tl.sum(g_c, axis=0))
            if DOT == "bf16" or DOT == "bf16 emulated" or DOT == "fp16":
                # decayed dO at about float32's accuracy: rounded, it loses decays closer to 1
                # than a 16-bit ulp (Mamba-2's A gradient at tiny A: 1.97e-2 against 8.0e-3)
                d_state += _tl_split_dot(tl.trans(q_c), do_start, DOT)
            else:
                d_state += _tl_dot(tl.trans(q_c), do_start, DOT)
        elif HAS_G:
            g_c, _ = _tl_diagonal_gates(g, sg_b, sg_h, sg_t, sg_d, i_b, i_h, t, cols_k, at_k)
            q_start = q_c * tl.exp(tl.cumsum(g_c, axis=0))  # Q ⊙ exp(b)
            d_state = d_state * tl.exp(tl.sum(g_c, axis=0))[:, None]
            d_state += _tl_dot(tl.trans(q_start), do_c, DOT)
        else:
            d_state += _tl_dot(tl.trans(q_c), do_c, DOT)
    _tl_store_state(dh0, i_bh, K, V, cols_k, cols_v, d_state)


@triton.jit
def _tl_diagonal_bwd_grads(
    q, k, v, g, do, hs, dhs,  # read
    dq, dk, dv, dg,  # written
    T, NH, K, V,
    sq_b, sq_h, sq_t, sq_d,
    sk_b, sk_h, sk_t, sk_d,
    sv_b, sv_h, sv_t, sv_d,
    sg_b, sg_h, sg_t, sg_d,
    sdo_b, sdo_h, sdo_t, sdo_d,
    HAS_G: tl.constexpr, GATE_GRAD: tl.constexpr, LEVELS: tl.constexpr, BT: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """One (key block, batch x head, chunk) program, the value columns BV at a time: dQ, dK and
    (GATE_GRAD) dg [B * NH, T, K], then this key block's part of dV [NK * B * NH, T, V]; hs,
    dhs: the states entering, gradients leaving each chunk [B * NH, N, K, V]; all contiguous."""
    i_k, i_bh, n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h, i_state = i_bh // NH, i_bh % NH, i_bh * tl.cdiv(T, BT) + n
    rows, cols_k = tl.arange(0, BT), i_k * BK + tl.arange(0, BK)
    t, in_t, at_k, _ = _tl_tokens(n, rows, T, cols_k < K, cols_k < K)
    d_scores, from_q, from_k, whole = _tl_chunk_value_sums(
        v, do, hs, dhs, sv_b, sv_h, sv_t, sv_d, sdo_b, sdo_h, sdo_t, sdo_d, i_b, i_h, i_state,
        t, in_t, cols_k, K, V, False, BV, DOT,
    )  # fmt: skip
    q_c = _tl_operand(_tl_rows(q, sq_b, sq_h, sq_t, sq_d, i_b, i_h, t, cols_k, at_k), DOT)
    k_c = _tl_operand(_tl_rows(k, sk_b, sk_h, sk_t, sk_d, i_b, i_h, t, cols_k, at_k), DOT)
    if HAS_G:
        g_c, _ = _tl_diagonal_gates(g, sg_b, sg_h, sg_t, sg_d, i_b, i_h, t, cols_k, at_k)
    else:
        g_c = tl.zeros((BT, BK), dtype=d_scores.dtype)
    dq_c, dk_c, dg_c, end_decay = _tl_diagonal_state_grads(
        q_c, k_c, g_c, from_q, from_k, whole, rows, GATE_GRAD
    )
    d_scores = tl.where(rows[:, None] >= rows[None, :], d_scores, 0.0)
    dq_c, dk_c, dg_c = _tl_diagonal_scores_grad(
        q_c, k_c, g_c, d_scores, dq_c, dk_c, dg_c, rows, GATE_GRAD, LEVELS, DOT
    )
    _tl_store_rows(dq, i_bh, T, K, t, cols_k, at_k, dq_c)
    _tl_store_rows(dk, i_bh, T, K, t, cols_k, at_k, dk_c)
    if GATE_GRAD:
        _tl_store_rows(dg, i_bh, T, K, t, cols_k, at_k, dg_c)
    k_end = _tl_operand(k_c * end_decay, DOT)  # K ⊙ exp(b_C - b)
    scores = _tl_operand(_tl_diagonal_scores(q_c, k_c, g_c, rows, LEVELS, DOT), DOT)
    _tl_chunk_value_grads(
        do, dhs, dv, sdo_b, sdo_h, sdo_t, sdo_d, i_b, i_h, i_state, i_k * tl.num_programs(1) + i_bh,
        t, in_t, cols_k, T, K, V, scores, k_end, False, BV, DOT,
    )  # fmt: skip


def _tl_diagonal_backward(q, k, v, gk, kept, d_o, d_final, chunk_size, dot, gate_grad, grads):
    """The gradients (dq, dk, dv, dg or None, d_initial) of chunk_diagonal's inputs from d_o and
    d_final, the states entering each chunk that the forward kept and its products' precision
    dot: two launches (see the module's docstring), the chunks' by `grads`
    (_tl_diagonal_bwd_grads). The scalar-decay backward's too (scalar_decay_bwd.py): gk one
    log-gate a token [B, NH, T], grads _tl_scalar_decay_bwd_grads, which writes its gate's
    gradient a part per key block."""
    batch, heads, length, d_k = q.shape
    sizes = (length, heads, d_k, v.shape[-1])
    scalar = "LEVELS" not in grads.arg_names  # the scalar-decay backward's
    gate, gate_strides = q if gk is None else gk, _tl_strides(gk, 3 if scalar else 4)
    states = _tl_diagonal_bwd_states
    block_t, block_k, block_v, grid, n_chunks = _tl_sizes(q, v, chunk_size, grads, dot)
    n_k = grid[2]
    d_o, d_final, dq, dk, dv, d_initial = _tl_gradients(q, v, d_o, d_final, 1, n_k)
    dq, dk, d_states = dq[0], dk[0], torch.empty_like(kept)
    common = {"HAS_G": gk is not None, "BT": block_t}
    _, state_k, state_v, state_grid, _ = _tl_sizes(q, v, chunk_size, states, dot)
    states[state_grid](
        q, gate, d_o, d_final, d_states, d_initial, *sizes, *q.stride(), *gate_strides,
        *((0,) if scalar else ()), *d_o.stride(), SCALAR=scalar, BK=state_k, BV=state_v,
        **common, **_tl_launch(states, dot),
    )  # fmt: skip
    dg = dq
    if gate_grad:
        dg = dv.new_empty(n_k, batch, heads, length) if scalar else torch.empty_like(dq)
    if not scalar:
        common["LEVELS"] = _tl_levels(block_t)
    grads[(n_k, batch * heads, n_chunks)](
        q, k, v, gate, d_o, kept, d_states, dq, dk, dv, dg, *sizes, *q.stride(), *k.stride(),
        *v.stride(), *gate_strides, *d_o.stride(), GATE_GRAD=gate_grad, BK=block_k, BV=block_v,
        **common, **_tl_launch(grads, dot),
    )  # fmt: skip
    dv = _tl_sum_parts(dv, n_k, dv.dtype)
    if gate_grad and scalar:
        dg = dg.sum(0)  # the key blocks' parts
    return dq, dk, dv, dg if gate_grad else None, d_initial
