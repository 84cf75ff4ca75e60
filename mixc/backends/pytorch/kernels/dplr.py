"""Kernels of the diagonal-plus-low-rank class: S_t = (diag(exp(g_t)) + b_t a_t^T) S_{t-1} +
k_t v_t^T, o_t = q_t S_t, with a log-gate g_t per key channel (None: no decay) and the two
vectors a_t, b_t of the rank-one term (KDA, RWKV-7, the delta rule erasing along one key and
writing along another). The derivation is in docs/algorithms.md, section "Diagonal plus low
rank".

chunk_dplr runs the chunked form. Inside a chunk the rank-one terms read the state through
the pseudo-values u_r = a_r^T S_{r-1}, which solve one unit lower-triangular system (in at
least fp32); the four score matrices it needs (queries and the a's against keys and the b's)
carry a decay per channel and are built as one interleaved matrix over aligned blocks of 2, 4,
..., C tokens, with factors measured from each block's boundary, as the diagonal kernel's; where
the gate has a known lower bound that keeps a chunk's total decay at least 2^-30 (RWKV-7's at
C <= 32), as one matmul a chunk, its factors measured from the chunk's start. The state passes from chunk to chunk by one matmul per chunk, S_{n+1} = P_n S_n + F_n. Under autograd
chunk_dplr has its own backward (common._OwnBackward), keeping the scores, the triangular
inverse, the pseudo-values and the states entering each chunk.

Uses the layout and numerical rules of common.py, and imports only torch and common, so the
generated module can hold a copy of its source (see kernel_source in this package).
"""

import torch

from mixc.backends.pytorch.kernels.common import (
    _as_3d,
    _bmm,
    _chain,
    _finite_rows,
    _finite_rows_,
    _needs_grad,
    _pair_blocks,
    _two_matmuls,
    _unit_lower_inverse,
)
from mixc.backends.pytorch.kernels.operators import _own_backward


def _dplr_pairs(x, block):
    """x [N, B, NH, C, m, d] as [N, B, NH, C / (2 * block), 2, block, m, d]: the two halves of
    every aligned block of 2 * block tokens along dim -4 (a view, writable)."""
    shape = x.shape
    return x.reshape(*shape[:3], shape[3] // (2 * block), 2, block, *shape[-2:])


def _dplr_levels(g_c):
    """The decays of every level of the binary split of _dplr_scores, for the backward: for
    blocks of 1, 2, ..., C tokens, exp(g_s + ... + g_r) and exp(g_s + ... + g_{r-1}) for the
    query and the a of token r [N, B, NH, C, 2, K] and exp(g_{j+1} + ... + g_e) for the key and
    the b of token j [N, B, NH, C, 1, K], in the block [s, e] holding the token. Going to
    blocks of 2 * block, the right half continues the left half's products, and the left
    half's suffix runs on through the right half: one multiply each by the other half's total
    (a product of factors <= 1)."""
    decay = g_c.exp()
    row_decay = torch.stack([decay, torch.ones_like(decay)], dim=-2)
    col_decay = torch.ones_like(decay).unsqueeze(-2)
    levels = [(row_decay, col_decay)]
    block = 1
    while block < g_c.shape[3]:
        rows, cols = _dplr_pairs(row_decay, block), _dplr_pairs(col_decay, block)
        left_total, right_total = rows[..., 0, -1:, :1, :], rows[..., 1, -1:, :1, :]
        ones = torch.ones_like(left_total)
        row_decay = (rows * torch.stack([ones, left_total], dim=-4)).reshape(row_decay.shape)
        col_decay = (cols * torch.stack([right_total, ones], dim=-4)).reshape(col_decay.shape)
        levels.append((row_decay, col_decay))
        block *= 2
    return levels


def _dplr_scores(q_c, k_c, a_c, b_c, g_c):
    """The decayed scores of a span of chunks [N, B, NH, C, K]: S [N, B, NH, 2C, 2C], row 2r + s
    and column 2j + t holding the pair of (q_r, a_r)[s] and (k_j, b_j)[t]: qk[r, j] = Σ_c q_rc
    exp(b_rc - b_jc) k_jc and qb for j <= r, ak[r, j] = Σ_c a_rc exp(b_{r-1,c} - b_jc) k_jc and
    ab for j < r, 0 elsewhere (b = cumsum(g) per channel). Also returns the chunk's decayed
    rows (exp(b) ⊙ Q, exp(b_{r-1}) ⊙ A) and columns (exp(b_C - b) ⊙ K, exp(b_C - b) ⊙ B)
    [N, B, NH, C, 2, K], and exp(b_C) [N, B, NH, 1, 1, K].

    Each pair j < r lies in exactly one aligned block of 2, 4, ..., C tokens with j in its left
    half and r in its right half; there the decay is split at the boundary between the halves,
    both factors products of per-token decays <= 1 (never exp(b_r) exp(-b_j)), and the block's
    corner, all four kinds of pairs at once, is one batched matmul of the rows decayed from the
    boundary and the columns decayed to it. Going from blocks of `block` tokens to blocks of
    2 * block, the right half's rows take on the left half's total decay and the left half's
    columns the right half's: the decayed rows and columns are carried from level to level
    (in place without autograd), with the totals of the blocks.
    """
    lead, chunk_size = q_c.shape[:3], q_c.shape[3]
    pre = g_c.exp()  # inside blocks of one token
    cols = torch.stack([k_c, b_c], dim=-2)  # decayed to the end of a block of one token: 1
    rows = torch.stack([q_c * pre, a_c], dim=-2)  # from its start: exp(g_r) and 1
    totals = pre.unsqueeze(-2)  # each block's total decay [N, B, NH, C / block, 1, K]
    in_place = not _needs_grad(g_c, rows, cols)
    # the pairs r = j: q_r . k_r and q_r . b_r (the a's only meet earlier tokens), on the
    # diagonal of the queries' rows [N, B, NH, 2, C] (a view)
    scores = q_c.new_zeros(*lead, 2 * chunk_size, 2 * chunk_size)
    pairs = scores.view(*lead, chunk_size, 2, chunk_size, 2)
    own = torch.diagonal(pairs[..., 0, :, :], dim1=-3, dim2=-2)
    own.copy_(torch.matmul(q_c.unsqueeze(-2), cols.transpose(-1, -2)).squeeze(-2).mT)
    block = 1
    while block < chunk_size:
        # the right halves' rows, decayed from the boundary, against the left halves' columns
        n_pairs = chunk_size // (2 * block)
        rows_pairs, cols_pairs = _dplr_pairs(rows, block), _dplr_pairs(cols, block)
        corner = torch.matmul(
            rows_pairs[..., 1, :, :, :].reshape(*lead, n_pairs, 2 * block, -1),
            cols_pairs[..., 0, :, :, :].reshape(*lead, n_pairs, 2 * block, -1).transpose(-1, -2),
        )
        _pair_blocks(scores, 2 * block)[..., 2 * block :, : 2 * block] = corner
        halves = totals.reshape(*lead, n_pairs, 2, 1, 1, -1)  # [..., n, 2, 1, 1, K]
        left_total, right_total = halves[..., 0, :, :, :], halves[..., 1, :, :, :]
        if in_place:
            rows_pairs[..., 1, :, :, :].mul_(left_total)
            cols_pairs[..., 0, :, :, :].mul_(right_total)
        else:
            ones = torch.ones_like(left_total)
            rows = (rows_pairs * torch.stack([ones, left_total], dim=-4)).reshape(rows.shape)
            cols = (cols_pairs * torch.stack([right_total, ones], dim=-4)).reshape(cols.shape)
        totals = (left_total * right_total).reshape(*lead, n_pairs, 1, -1)
        block *= 2
    return scores, rows, cols, totals.unsqueeze(-2)


def _dplr_masks(block, like):
    """For the gate's gradient over aligned runs of `block` tokens, what each token l of a run
    sums of the interleaved rows and columns of the run ([block, 2 * block] each): the rows'
    factors exp(b_r - b_s) and exp(b_{r-1} - b_s) (s before the run) hold g_l for l <= r and
    l < r, the columns' exp(b_e - b_j) (e the run's last token) for l > j."""
    token = torch.arange(block, device=like.device)
    row = torch.arange(2 * block, device=like.device)
    r, s = (row // 2)[None, :], (row % 2)[None, :]
    rows = (r > token[:, None]) | ((r == token[:, None]) & (s == 0))
    cols = r < token[:, None]
    return rows.to(like.dtype), cols.to(like.dtype)


def _dplr_direct(gk_min, chunk_size):
    """Whether an untracked span's scores can be built by _dplr_scores_direct: the gates'
    lower bound gk_min (None: none known) keeps every chunk's total decay at least 2^-30 (log
    2^-30 = -20.79...), so that the factors 1 / exp(b_j) it divides by stay at most 2^30, and
    no graph is being compiled (the direct form writes into views of preallocated tensors,
    which torch.compile does not trace; autograd does not record them either)."""
    if gk_min is None or gk_min * chunk_size < -20.79441541679836:
        return False
    return not torch.compiler.is_compiling()


def _dplr_mask_(scores):
    """Zero the interleaved scores [..., 2C, 2C] (see _dplr_scores), or their gradient,
    outside their support, in place, by selection: row 2r (the query of token r) keeps the
    columns of tokens j <= r, a lower triangle with one column above the diagonal; row 2r + 1
    (its a) those of j < r, so the three entries left of and above the diagonal that the
    triangle keeps are zeroed."""
    scores.tril_(1)
    chunk_size = scores.shape[-1] // 2
    a_rows = scores.view(*scores.shape[:-2], chunk_size, 2, chunk_size, 2)[..., :, 1, :, :]
    for column, offset in ((0, 0), (1, 0), (0, 1)):  # (j = r, k), (j = r, b), (j = r + 1, k)
        torch.diagonal(a_rows[..., column], offset=offset, dim1=-2, dim2=-1).zero_()
    return scores


def _dplr_scores_direct(q_c, k_c, a_c, b_c, g_c):
    """_dplr_scores for gates whose total decay over a chunk is known to be at least 2^-30 in
    every channel (_dplr_direct), without autograd: the same scores, rows, columns and
    exp(b_C), with each pair's decay exp(b_r - b_j) split at the chunk's start into exp(b_r)
    and 1 / exp(b_j), both within [2^-30, 2^30], so that all four kinds of pairs of the whole
    chunk are one batched matmul, masked by selection (_dplr_mask_). exp(b_r) is the running
    product of the per-token decays (no exp of a summed exponent), so a factor's relative error
    grows with the number of tokens, as the split form's does; the split form's factors are
    needed only where a chunk's decay can be stronger."""
    lead, chunk_size, d_k = q_c.shape[:3], q_c.shape[3], q_c.shape[-1]
    # exp(b_0) = 1, exp(b_1), ..., exp(b_C) [N, B, NH, C + 1, K]
    from_start = q_c.new_empty(*lead, chunk_size + 1, d_k)
    from_start[..., 0, :] = 1
    torch.cumprod(g_c.exp(), dim=3, out=from_start[..., 1:, :])
    decay, decay_before = from_start[..., 1:, :], from_start[..., :-1, :]
    rows = q_c.new_empty(*lead, chunk_size, 2, d_k)  # exp(b) ⊙ Q, exp(b_{r-1}) ⊙ A
    torch.mul(q_c, decay, out=rows[..., 0, :])
    torch.mul(a_c, decay_before, out=rows[..., 1, :])
    cols = q_c.new_empty(*lead, chunk_size, 2, d_k)  # exp(-b) ⊙ K, exp(-b) ⊙ B
    torch.div(k_c, decay, out=cols[..., 0, :])
    torch.div(b_c, decay, out=cols[..., 1, :])
    pairs = rows.view(*lead, 2 * chunk_size, d_k), cols.view(*lead, 2 * chunk_size, d_k)
    scores = _dplr_mask_(_bmm(pairs[0], pairs[1].transpose(-1, -2)))
    chunk_decay = from_start[..., -1:, :].unsqueeze(-2)  # exp(b_C) [N, B, NH, 1, 1, K]
    cols.mul_(chunk_decay)  # decayed to the chunk's end
    return scores, rows, cols, chunk_decay


def _dplr_maps(q_c, k_c, v_c, g_c, a_c, b_c, direct=False, guard=False):
    """What the chunks of a span share before the state passes: the decayed scores, rows and
    columns and exp(b_C) (see _dplr_scores; _dplr_scores_direct where `direct`), T =
    (I - ab)^{-1} (unit lower-triangular, in at least fp32), W = T (exp(b_{r-1}) ⊙ A), U' =
    T ak V and, `guard`ed, the poison of the tokens whose decayed a or ak V overflowed (else
    None)."""
    scores_of = _dplr_scores_direct if direct else _dplr_scores
    scores, rows, cols, chunk_decay = scores_of(q_c, k_c, a_c, b_c, g_c)
    chunk_size = q_c.shape[3]
    pairs = scores.view(*scores.shape[:-2], chunk_size, 2, chunk_size, 2)
    solve_dtype = torch.promote_types(q_c.dtype, torch.float32)
    minus_ab = -pairs[..., 1, :, 1].to(solve_dtype)
    t_inv = _unit_lower_inverse(minus_ab.detach())  # (I - ab)^{-1}
    if minus_ab.requires_grad:
        # d(I + L)^{-1} = -T dL T: attach that gradient (the added term is exactly zero)
        t_inv = t_inv - _bmm(t_inv, _bmm(minus_ab - minus_ab.detach(), t_inv))
    t_inv = t_inv.to(q_c.dtype)
    a_before = rows[..., 1, :]
    ak_v, poison = _bmm(pairs[..., 1, :, 0], v_c), None
    if guard:
        # finite inputs can overflow in a later token's row (a large a decayed by gates above
        # 0, or a · k): T's zeros above its diagonal times that row's inf would carry it back
        # to the earlier rows of W and U', so such a row is made finite and poisons instead
        a_before, poison_a = _finite_rows_(a_before)
        ak_v, poison = _finite_rows_(ak_v)
        poison = poison + poison_a
    w = _bmm(t_inv, a_before)  # [N, B, NH, C, K]
    u_own = _bmm(t_inv, ak_v)  # [N, B, NH, C, V]
    return scores, t_inv, rows, cols, w, u_own, chunk_decay, poison


def _dplr_finite_inputs(k_c, v_c, g_c, a_c, b_c):
    """The guard of a span's inputs (see _guarded_spans): (k, v, g, a and b with their
    non-finite values set to 0, a gate whose decay is not finite included, and the poison
    [N, B, NH, C]: 0, or NaN for a token that had one)."""
    k_c, poison = _finite_rows(k_c)
    v_c, poison_v = _finite_rows(v_c)
    a_c, poison_a = _finite_rows(a_c)
    b_c, poison_b = _finite_rows(b_c)
    poison = poison + poison_v + poison_a + poison_b
    decay = g_c.detach().exp()
    g_c = torch.where(torch.isfinite(decay), g_c, 0.0)
    poison = poison + (decay * 0).sum(-1)
    return k_c, v_c, g_c, a_c, b_c, poison


def _dplr_states(state, cols, w, u_own, v_c, chunk_decay, poison, tracked):
    """The inter-chunk state pass over a span, from the state entering it [B, NH, K, V]: each
    chunk's action on the state it enters, S_{n+1} = P S_n + F with P = diag(exp(b_C)) +
    (exp(b_C - b) ⊙ B)^T W and F = (exp(b_C - b) ⊙ K)^T V + (exp(b_C - b) ⊙ B)^T U' (plus
    the poison of the chunk's tokens, None: unguarded), built for every chunk at once, then
    one matmul per chunk (in place without autograd: tracked False). cols: the columns
    decayed to the chunk's end (see _dplr_scores). Returns (the states entering each chunk
    [N, B, NH, K, V], the state after the span)."""
    n_chunks, batch, heads, _, d_k = w.shape
    d_v = v_c.shape[-1]
    k_to_end_t, b_to_end_t = (x.transpose(-1, -2) for x in cols.unbind(-2))
    moves = _bmm(b_to_end_t, w)  # P [N, B, NH, K, K]
    torch.diagonal(moves, dim1=-2, dim2=-1).add_(chunk_decay.reshape(*moves.shape[:-1]))
    flat = batch * heads
    moves_n = moves.reshape(n_chunks, flat, d_k, d_k).unbind(0)
    if tracked:
        writes = _bmm(b_to_end_t, u_own, add=_bmm(k_to_end_t, v_c))
        if poison is not None:
            writes = writes + poison.sum(-1)[..., None, None]
        writes_n, states = writes.reshape(n_chunks, flat, d_k, d_v).unbind(0), None
    else:
        # F is written into the slots of the states, which the chain then updates in place
        states = v_c.new_empty(n_chunks + 1, flat, d_k, d_v)
        writes = states[1:].view(-1, d_k, d_v)
        torch.bmm(_as_3d(k_to_end_t), _as_3d(v_c), out=writes)
        writes.baddbmm_(_as_3d(b_to_end_t), _as_3d(u_own))
        if poison is not None:
            writes.add_(poison.sum(-1).reshape(-1, 1, 1))

    def next_state(n, state, out):
        if out is None:
            return torch.baddbmm(writes_n[n], moves_n[n], state)
        # out holds F_n (out= itself: on CPU a quarter faster than out.baddbmm_ at 64 x 64)
        return torch.baddbmm(out, moves_n[n], state, out=out)

    # the sequential part: one matmul per chunk
    states_in, state = _chain(
        state.reshape(flat, d_k, d_v), n_chunks, next_state, tracked, out=states
    )
    states_in = states_in.reshape(n_chunks, batch, heads, d_k, d_v)
    return states_in, state.reshape(batch, heads, d_k, d_v)


def _dplr_span(q_c, k_c, v_c, g_c, a_c, b_c, state, kept, guard, gk_min=None):
    """The diagonal-plus-low-rank recurrence on one span of chunks: q_c, k_c, a_c, b_c, g_c
    [N, B, NH, C, K], v_c [N, B, NH, C, V]. Returns ([o [N, B, NH, C, V]], state after the
    span); appends the decayed scores, T, the pseudo-values U and the states entering each chunk
    to kept if given. Guarded, the triangular products run over finite values and a token that
    had a non-finite one poisons its output, those after it and the state (see _guarded_spans).
    gk_min: a lower bound of every log-gate, or None (see _dplr_direct).

    The pseudo-values are U = W S_n + U', so from chunk to chunk S_{n+1} = diag(exp(b_C)) S_n
    + (exp(b_C - b) ⊙ K)^T V + (exp(b_C - b) ⊙ B)^T U is P S_n + F with P and F built for
    every chunk at once (the sequential work: one matmul per chunk, _dplr_states), and the
    outputs are Y = (exp(b) ⊙ Q) S_n + qk V + qb U.
    """
    poison = None
    if guard:
        k_c, v_c, g_c, a_c, b_c, poison = _dplr_finite_inputs(k_c, v_c, g_c, a_c, b_c)
    chunk_size, d_v = q_c.shape[3], v_c.shape[-1]
    tracked = _needs_grad(q_c, k_c, v_c, g_c, a_c, b_c, state)
    if not tracked:
        # the values (V, U) interleaved [N, B, NH, C, 2, V]: V now, U once the states are known
        values = v_c.new_empty(*v_c.shape[:-1], 2, d_v)
        values[..., 0, :] = v_c
        v_c = values[..., 0, :]
    direct = not tracked and _dplr_direct(gk_min, chunk_size)
    maps = _dplr_maps(q_c, k_c, v_c, g_c, a_c, b_c, direct, guard)
    scores, t_inv, rows, cols, w, u_own, chunk_decay, poison_maps = maps
    if poison_maps is not None:
        poison = poison + poison_maps
    states_in, state = _dplr_states(state, cols, w, u_own, v_c, chunk_decay, poison, tracked)
    # the pseudo-values U = W S_n + U'
    if tracked:
        values = torch.stack([v_c, _bmm(w, states_in, add=u_own)], dim=-2)
    else:
        values[..., 1, :] = _as_3d(u_own).baddbmm_(_as_3d(w), _as_3d(states_in)).view(u_own.shape)
    values = values.reshape(*v_c.shape[:3], 2 * chunk_size, d_v)
    if guard:
        # finite inputs can still overflow in a token's pseudo-value U: made finite, it poisons
        # its output and those after it, as a non-finite input does
        values, poison_u = _finite_rows_(values)
        poison = poison + poison_u.view(*poison.shape, 2).sum(-1)
    if kept is not None:
        kept.append([scores, t_inv, values, states_in])
    # the rows of the queries: (qk, qb) against (V, U), interleaved
    o = _two_matmuls(scores[..., 0::2, :], values, rows[..., 0, :], states_in)
    if poison is not None:
        o = o + torch.cumsum(poison, -1).unsqueeze(-1)
    return [o], state


def _dplr_state_grads(t_inv, decayed, to_end, chunk_decay, do_c, from_q, d_state):
    """The gradient of the state from the last chunk of a span to the first: D_n = P^T D_{n+1}
    + (exp(b) ⊙ Q)^T dO + W^T qb^T dO, with P = diag(exp(b_C)) + (exp(b_C - b) ⊙ B)^T W and
    W = T (exp(b_{r-1}) ⊙ A), from T, the decayed rows (exp(b) ⊙ Q, exp(b_{r-1}) ⊙ A) and
    columns (exp(b_C - b) ⊙ K, exp(b_C - b) ⊙ B) [N, B, NH, C, 2, K], exp(b_C), the output
    gradient, qb^T dO and the gradient d_state of the state leaving the span. Returns (D_{n+1}
    for every chunk [N, B, NH, K, V], D_0 [B, NH, K, V])."""
    n_chunks, batch, heads = do_c.shape[:3]
    d_k, d_v = decayed.shape[-1], do_c.shape[-1]
    w = _bmm(t_inv, decayed[..., 1, :])
    local = _two_matmuls(decayed[..., 0, :].transpose(-1, -2), do_c, w.transpose(-1, -2), from_q)
    p_t = _bmm(w.transpose(-1, -2), to_end[..., 1, :])  # P^T
    torch.diagonal(p_t, dim1=-2, dim2=-1).add_(chunk_decay)

    flat = batch * heads
    local_n = local.reshape(n_chunks, flat, d_k, d_v).unbind(0)
    p_t_n = p_t.reshape(n_chunks, flat, d_k, d_k).unbind(0)

    def next_grad(n, d_next, out):
        return torch.baddbmm(local_n[n], p_t_n[n], d_next, out=out)

    d_next, d_state = _chain(
        d_state.reshape(flat, d_k, d_v), n_chunks, next_grad, False, reverse=True
    )
    d_next = d_next.reshape(n_chunks, batch, heads, d_k, d_v)  # D_{n+1}
    return d_next, d_state.reshape(batch, heads, d_k, d_v)


def _dplr_chunk_gate_grads(d_decayed, decayed, d_to_end, to_end, states_in, d_next, chunk_decay):
    """The gate's gradient [N, B, NH, C, K] from the chunk level's decays: what each decayed row
    and column passes on (its gradient times its value) goes back to the gates its factor holds
    (_dplr_masks: exp(b_r) and exp(b_{r-1}) hold g_l for l <= r and l < r, exp(b_C - b_j) for
    l > j), and exp(b_C) in P, <S_n, D_{n+1}> exp(b_C) per channel, to every gate of the chunk."""
    lead, chunk_size, d_k = decayed.shape[:3], decayed.shape[3], decayed.shape[-1]
    rows_mask, cols_mask = _dplr_masks(chunk_size, decayed)
    dg = _two_matmuls(
        rows_mask.expand(*lead, chunk_size, 2 * chunk_size),
        (d_decayed * decayed).reshape(*lead, 2 * chunk_size, d_k),
        cols_mask.expand(*lead, chunk_size, 2 * chunk_size),
        (d_to_end * to_end).reshape(*lead, 2 * chunk_size, d_k),
    )
    return dg + ((states_in * d_next).sum(-1) * chunk_decay).unsqueeze(-2)


def _dplr_blocks_grads(d_scores, rows, cols, levels, d_rows, d_cols, dg):
    """The gradient through the scores' pairs, as _dplr_scores builds them: the pairs r = j
    undecayed, then every level of the binary split hands its corner of the scores' gradient
    d_scores [N, B, NH, 2C, 2C] back to that level's decayed rows and columns (levels, from
    _dplr_levels). Adds into the gradients of the rows (q, a) and columns (k, b) [N, B, NH, C,
    2, K] and, unless None, into the gate's dg [N, B, NH, C, K], in place."""
    lead, chunk_size, d_k = rows.shape[:3], rows.shape[3], rows.shape[-1]
    pairs_shape = (*lead, chunk_size, 2, chunk_size, 2)
    # the pairs r = j: q_r . k_r and q_r . b_r
    own = torch.diagonal(d_scores.view(pairs_shape), dim1=-4, dim2=-2).movedim(-1, -3)[..., 0, :]
    d_rows[..., 0, :] += torch.matmul(own.unsqueeze(-2), cols).squeeze(-2)
    d_cols += own.unsqueeze(-1) * rows[..., 0, :].unsqueeze(-2)
    block = 1
    while block < chunk_size:
        row_decay, col_decay = levels[block.bit_length() - 1]
        n_pairs = chunk_size // (2 * block)
        row_f, col_f = (
            _dplr_pairs(row_decay, block)[..., 1, :, :, :],
            _dplr_pairs(col_decay, block)[..., 0, :, :, :],
        )
        rows_right = _dplr_pairs(rows, block)[..., 1, :, :, :] * row_f
        cols_left = _dplr_pairs(cols, block)[..., 0, :, :, :] * col_f
        corner = _pair_blocks(d_scores, 2 * block)[..., 2 * block :, : 2 * block]
        d_right = torch.matmul(corner, cols_left.reshape(*lead, n_pairs, 2 * block, d_k))
        d_left = torch.matmul(
            corner.transpose(-1, -2), rows_right.reshape(*lead, n_pairs, 2 * block, d_k)
        )
        if dg is not None:
            rows_mask, cols_mask = _dplr_masks(block, rows)
            halves = _dplr_pairs(dg.unsqueeze(-2), block)
            halves[..., 1, :, 0, :] += torch.matmul(
                rows_mask, d_right * rows_right.reshape(d_right.shape)
            )
            halves[..., 0, :, 0, :] += torch.matmul(
                cols_mask, d_left * cols_left.reshape(d_left.shape)
            )
        _dplr_pairs(d_rows, block)[..., 1, :, :, :] += d_right.reshape(rows_right.shape) * row_f
        _dplr_pairs(d_cols, block)[..., 0, :, :, :] += d_left.reshape(cols_left.shape) * col_f
        block *= 2


def _dplr_grads_span(
    q_c, k_c, v_c, g_c, a_c, b_c, do_c, scores, t_inv, values, states_in, d_state, gate_grad
):
    """Gradients of the diagonal-plus-low-rank recurrence on one span of chunks, from the
    forward's decayed scores, T, pseudo-values U and states entering each chunk S_n, the output
    gradient do_c and the gradient d_state of the state leaving the span. Returns ([dq, dk, dv,
    dg (None unless gate_grad), da, db], the gradient of the state entering the span).

    With R = exp(b_{r-1}) ⊙ A S_n + ak V the right side of (I - ab) U = R, the state's
    gradient runs from the last chunk, D_n = P^T D_{n+1} + (exp(b) ⊙ Q)^T dO + W^T qb^T dO
    (_dplr_state_grads); then dU = qb^T dO + (exp(b_C - b) ⊙ B) D_{n+1}, dR = T^T dU, and the
    scores get d(qk, qb) = dO (V, U)^T, d(ak, ab) = dR (V, U)^T on their support, dV = qk^T dO
    + ak^T dR + (exp(b_C - b) ⊙ K) D_{n+1}. The decayed rows get (dO, dR) S_n^T, the decayed
    columns (V, U) D_{n+1}^T, and every level of the binary split of _dplr_scores hands its
    corner of the scores' gradient back to that level's decayed rows and columns
    (_dplr_blocks_grads). The gate's gradient, per channel, sums what each decay factor
    holding exp(g_l) passes on (its gradient times its value, _dplr_masks), and exp(b_C) in P
    holds every g_l of the chunk (_dplr_chunk_gate_grads).
    """
    lead, chunk_size, d_v = q_c.shape[:3], q_c.shape[3], v_c.shape[-1]
    rows, cols = torch.stack([q_c, a_c], dim=-2), torch.stack([k_c, b_c], dim=-2)
    levels = _dplr_levels(g_c)
    row_decay, col_decay = levels.pop()
    decayed = rows * row_decay  # exp(b) ⊙ Q, exp(b_{r-1}) ⊙ A
    to_end = cols * col_decay  # exp(b_C - b) ⊙ K, exp(b_C - b) ⊙ B
    chunk_decay = row_decay[..., -1, 0, :]
    pairs = scores.view(*lead, chunk_size, 2, chunk_size, 2)
    from_q = _bmm(pairs[..., 0, :, 1].transpose(-1, -2), do_c)  # qb^T dO
    # D_{n+1} for every chunk, and D_0
    d_next, d_state = _dplr_state_grads(t_inv, decayed, to_end, chunk_decay, do_c, from_q, d_state)
    d_u = _bmm(to_end[..., 1, :], d_next, add=from_q)
    d_r = _bmm(t_inv.transpose(-1, -2), d_u)
    outer = torch.stack([do_c, d_r], dim=-2).reshape(*lead, 2 * chunk_size, d_v)  # dO, dR
    d_scores = _bmm(outer, values.transpose(-1, -2))
    d_scores = _dplr_mask_(d_scores)  # on the scores' support only
    dv = _bmm(scores[..., :, 0::2].transpose(-1, -2), outer, add=_bmm(to_end[..., 0, :], d_next))
    d_decayed = _bmm(outer, states_in.transpose(-1, -2)).reshape(rows.shape)
    d_to_end = _bmm(values, d_next.transpose(-1, -2)).reshape(cols.shape)
    d_rows, d_cols = d_decayed * row_decay, d_to_end * col_decay
    dg = None
    if gate_grad:
        dg = _dplr_chunk_gate_grads(
            d_decayed, decayed, d_to_end, to_end, states_in, d_next, chunk_decay
        )
    _dplr_blocks_grads(d_scores, rows, cols, levels, d_rows, d_cols, dg)
    dq, da = d_rows.unbind(-2)
    dk, db = d_cols.unbind(-2)
    return [dq, dk, dv, dg, da, db], d_state


def chunk_dplr(q, k, v, a, b, gk=None, initial_state=None, chunk_size=64, gk_min=None):
    """Chunked S_t = (diag(exp(gk_t)) + b_t a_t^T) S_{t-1} + k_t v_t^T, o_t = q_t S_t.

    a, b: [B, NH, T, K]; gk: the log-gate [B, NH, T, K] or [B, NH, T, 1] (one per token, for
    every channel), None: no decay. gk_min: a number every entry of gk is known to be at least
    (the generated modules pass the bound the spec's gate has), None: none known; where it
    keeps a chunk's total decay at least 2^-30, a chunk's scores are one matmul. Returns (o,
    final state).
    """
    gk = torch.zeros_like(k) if gk is None else gk.expand_as(k)

    seqs = [q, k, v, gk, a, b]
    # every input is only read elementwise (into the decayed rows and columns, v into the values)
    strided = (0, 1, 2, 3, 4, 5)
    return _own_backward(
        _dplr_span, _dplr_grads_span, 3, chunk_size, initial_state, seqs, gk_min, strided
    )
