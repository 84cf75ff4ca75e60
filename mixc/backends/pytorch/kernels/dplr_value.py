"""Kernel of the value-side diagonal-plus-low-rank class: a state M [K, V] whose transition acts
on its value axis, M_t = M_{t-1} (diag(exp(gk_t)) + a_t k_t^T) + v_t k_t^T, o_t = q_t M_t, with a
log-gate gk_t per value channel and the rank-one term erasing along the write's own key k_t (the
gated Oja rule: `H_t = (I - beta v v^T) diag(exp(g)) H_{t-1} + beta v k^T`, M = H^T, k the unit
v, a = -beta exp(g) ⊙ v). The derivation is in docs/algorithms.md, section "Value-side
transitions".

chunk_dplr_value is two passes of kernels that exist. Its transpose S = M^T [V, K] is a key-side
diagonal-plus-low-rank recurrence, S_t = (diag(exp(gk_t)) + k_t a_t^T) S_{t-1} + k_t v_t^T,
which chunk_dplr runs; but the output contracts S's other axis, o_t^T = S_t q_t, which
chunk_dplr never forms. What chunk_dplr does read is the rank-one term's read of the state
before each token, u_t = a_t^T S_{t-1} (its output for the queries a, one token early: query
a_{t+1} at token t reads S_t). Given u, the token's whole change of the state is one rank-one
write along k, S_t = diag(exp(gk_t)) S_{t-1} + k_t (v_t + u_t)^T, that is M_t = M_{t-1}
diag(exp(gk_t)) + (v_t + u_t) k_t^T: a value-side diagonal gate, which chunk_diagonal runs and
reads with the queries q. The first pass gives u and the final state (the one whose chain is
contractive), the second the outputs; both are exact rewrites of the recurrence, and gradients
flow through both kernels (u is an input of the second).

Without autograd, on CPU and outside a compiled graph, the two passes run as one
(_value_span), span by span, through common's guarded spans: the first pass's outputs are not
formed (they are its own pseudo-values) nor the second's state passing (the same states). Each
row of a chunk forms its pairs directly, each pair's decay split at the chunk's start (one
matmul a chunk), where every running decay up to it lies within [2^-30, 2^30], else by the
binary split of aligned blocks; the choice is a prefix of the chunk, so no later token changes
how an earlier one is computed (tests/backends/test_causality.py checks it bit for bit). Which
of the two ways runs depends on none of the values: autograd, the device and compilation decide.

Imports only torch, common and the two kernels' files, so the generated module can hold a copy of its
source (see kernel_source in this package).
"""

import torch

from mixc.backends.pytorch.kernels.common import (
    _as_3d,
    _bmm,
    _chain,
    _finite_rows,
    _finite_rows_,
    _guarded_spans,
    _needs_grad,
    _pair_blocks,
    _unit_lower_inverse,
)
from mixc.backends.pytorch.kernels.diagonal import chunk_diagonal
from mixc.backends.pytorch.kernels.dplr import chunk_dplr


def chunk_dplr_value(q, k, v, a, gk=None, initial_state=None, chunk_size=64, gk_min=None):
    """Chunked M_t = M_{t-1} (diag(exp(gk_t)) + a_t k_t^T) + v_t k_t^T, o_t = q_t M_t.

    q, v: [B, NH, T, K]; k, a: [B, NH, T, V]; gk: the log-gate [B, NH, T, V] or [B, NH, T, 1],
    None: no decay; state M [B, NH, K, V]. gk_min: a number every entry of gk is known to be at
    least (see chunk_dplr). Returns (o [B, NH, T, V], final state).
    """
    if initial_state is None:
        initial_state = q.new_zeros(*q.shape[:2], q.shape[-1], k.shape[-1])
    if _value_fusable(q, k, v, a, gk, initial_state):
        g = torch.zeros_like(k) if gk is None else gk.expand_as(k)
        (o,), final, _ = _guarded_spans(
            _value_span, [q, k, v, g, a], initial_state.mT, chunk_size, strided=(3, 4)
        )
        return o, final.mT
    s0 = initial_state.mT  # S = M^T [B, NH, V, K], a key-side state of chunk_dplr
    # pass 1: u_t = a_t^T S_{t-1}, chunk_dplr's output at token t - 1 for the query a_t
    a_next = torch.cat([a[:, :, 1:], torch.zeros_like(a[:, :, :1])], 2)
    read, state = chunk_dplr(a_next, k, v, a, k, gk, s0, chunk_size, gk_min)
    u = torch.cat([torch.matmul(a[:, :, :1], s0), read[:, :, :-1]], 2)
    # pass 2: M_t = M_{t-1} diag(exp(gk_t)) + (v_t + u_t) k_t^T, read along q
    gv = None if gk is None else gk.expand_as(k)
    o, _ = chunk_diagonal(q, v + u, k, gv=gv, initial_state=initial_state, chunk_size=chunk_size)
    return o, state.mT


def _value_fusable(*tensors):
    """Whether the two passes run as one (_value_span): without autograd (the two passes have
    their backwards), on CPU (elsewhere the class's kernels may be another backend's) and
    outside a compiled graph (the one pass writes into views, which torch.compile does not
    trace). The choice depends on none of the values, so no token changes how another is
    computed."""
    if _needs_grad(*tensors) or tensors[0].device.type != "cpu":
        return False
    return not torch.compiler.is_compiling()


def _value_halves(x, block):
    """[N, B, NH, C, d] -> (left, right) halves of every aligned block of 2 * block tokens, each
    [N, B, NH, C / (2 * block), block, d] (views, writable)."""
    pairs = x.reshape(*x.shape[:3], x.shape[3] // (2 * block), 2, block, x.shape[-1])
    return pairs[..., 0, :, :], pairs[..., 1, :, :]


def _value_finite_inputs(k_c, v_c, g_c, a_c):
    """The guard of a span's inputs (see common._guarded_spans): (k, v, g and a with their
    non-finite values set to 0, a gate whose decay is not finite included, and the poison
    [N, B, NH, C]: 0, or NaN for a token that had one). q needs none: it is read only in its
    own token's row."""
    k_c, poison = _finite_rows(k_c)
    v_c, poison_v = _finite_rows(v_c)
    a_c, poison_a = _finite_rows(a_c)
    decay = g_c.exp()
    g_c = torch.where(torch.isfinite(decay), g_c, 0.0)
    return k_c, v_c, g_c, a_c, poison + poison_v + poison_a + (decay * 0).sum(-1)


def _value_scores(a_c, k_c, g_c):
    """The rank-one term's decayed scores of a span of chunks [N, B, NH, C, V], without
    autograd: ak [N, B, NH, C, C], a_r . (exp(b_{r-1} - b_j) ⊙ k_j) for j < r and 0 elsewhere
    (b = cumsum(g) per channel); the rows exp(b_{r-1}) ⊙ A and columns exp(b_C - b) ⊙ K of the
    whole chunk, and exp(b_C) [N, B, NH, 1, V]. As chunk_dplr's _dplr_scores with its a's and
    k's only (b = k: its a-against-b scores are these): every pair j < r lies in one aligned
    block of 2, 4, ..., C tokens with j in its left half and r in its right half, and its decay
    is split at the boundary between the halves, both factors products of per-token decays."""
    lead, chunk_size = a_c.shape[:3], a_c.shape[3]
    rows = a_c.clone()  # decayed from the start of a block of one token (before it): 1
    cols = k_c.clone()  # to its end: 1
    totals = g_c.exp()  # each block's total decay [N, B, NH, C / block, V]
    scores = a_c.new_zeros(*lead, chunk_size, chunk_size)
    block = 1
    while block < chunk_size:
        rows_right, cols_left = _value_halves(rows, block)[1], _value_halves(cols, block)[0]
        corner = torch.matmul(rows_right, cols_left.transpose(-1, -2))
        _pair_blocks(scores, block)[..., block:, :block] = corner
        halves = totals.reshape(*lead, chunk_size // (2 * block), 2, 1, -1)
        left_total, right_total = halves[..., 0, :, :], halves[..., 1, :, :]
        rows_right.mul_(left_total)
        cols_left.mul_(right_total)
        totals = (left_total * right_total).squeeze(-2)
        block *= 2
    return scores, rows, cols, totals


def _value_states(state, cols, w, writes, chunk_decay, poison):
    """The states entering each chunk of a span [N, B, NH, V, K] and the state after it, from
    the state entering it [B, NH, V, K]: S_{n+1} = P S_n + F, P = diag(exp(b_C)) + (exp(b_C - b)
    ⊙ K)^T W, F = (exp(b_C - b) ⊙ K)^T (V + U') (chunk_dplr's _dplr_states with b = k: its two
    kinds of columns are one) plus the poison of the chunk's tokens (None: unguarded), in
    place, one matmul per chunk."""
    n_chunks, batch, heads, _, d_v = cols.shape
    d_k = writes.shape[-1]
    to_end = cols.transpose(-1, -2)
    moves = _bmm(to_end, w)  # P [N, B, NH, V, V]
    torch.diagonal(moves, dim1=-2, dim2=-1).add_(chunk_decay.squeeze(-2))
    moves_n = moves.reshape(n_chunks, batch * heads, d_v, d_v).unbind(0)
    states = writes.new_empty(n_chunks + 1, batch * heads, d_v, d_k)
    torch.bmm(_as_3d(to_end), _as_3d(writes), out=states[1:].view(-1, d_v, d_k))
    if poison is not None:
        states[1:].view(-1, d_v, d_k).add_(poison.sum(-1).reshape(-1, 1, 1))

    def next_state(n, state, out):
        return torch.baddbmm(out, moves_n[n], state, out=out)

    states_in, state = _chain(state.reshape(-1, d_v, d_k), n_chunks, next_state, False, out=states)
    return states_in.view(n_chunks, batch, heads, d_v, d_k), state.view(batch, heads, d_v, d_k)


def _value_range(g_c):
    """The running decays of a span's chunks from their start and where the direct form may use
    them: (exp(b_0) = 1, exp(b_1), ..., exp(b_C) [N, B, NH, C + 1, V], running products of the
    per-token decays; and inside [N, B, NH, C], True at token r where every exp(b_j), j <= r,
    lies within [2^-30, 2^30] in every channel). inside is a prefix of each chunk: token r's
    entry depends on no later token, so a row chosen by it is chosen causally."""
    lead, chunk_size, d = g_c.shape[:3], g_c.shape[3], g_c.shape[-1]
    from_start = g_c.new_empty(*lead, chunk_size + 1, d)
    from_start[..., 0, :] = 1
    torch.cumprod(g_c.exp(), dim=3, out=from_start[..., 1:, :])
    decay = from_start[..., 1:, :]
    ok = (decay.amin(-1) >= 2.0**-30) & (decay.amax(-1) <= 2.0**30)  # False for NaN too
    return from_start, torch.cumsum(~ok, -1) == 0


def _value_direct(a_c, k_c, from_start, inside):
    """_value_scores with each pair's decay split at the chunk's start into exp(b_{r-1}) and
    1 / exp(b_j), one matmul a chunk: (ak, rows, columns, exp(b_C), as _value_scores, and the
    keys exp(-b) ⊙ K of the second part). Right only at the rows `inside` (_value_range),
    where both factors lie within [2^-30, 2^30]; a column outside is zeroed (selected), so that
    its inf never meets an earlier row's masked zero."""
    decay = from_start[..., 1:, :]
    rows = a_c * from_start[..., :-1, :]  # exp(b_{r-1}) ⊙ A
    cols = (k_c / decay).masked_fill_(~inside.unsqueeze(-1), 0.0)  # exp(-b) ⊙ K
    scores = _bmm(rows, cols.transpose(-1, -2)).tril_(-1)
    chunk_decay = from_start[..., -1:, :]
    return scores, rows, cols * chunk_decay, chunk_decay, cols


def _value_pieces(a_c, k_c, g_c, from_start, inside):
    """The rank-one term's scores, rows, columns and exp(b_C) of a span (see _value_scores),
    direct (_value_direct) at the rows `inside` and, at the others, from the binary split; a
    chunk's columns and decay from the split unless the whole chunk is inside. Also returns
    the direct keys of the second part and whether every row is inside (then the split is not
    computed: the rows chosen by `inside` are the same bits either way)."""
    *direct, keys = _value_direct(a_c, k_c, from_start, inside)
    whole = bool(inside.all())
    if whole:
        return direct, keys, whole
    split = _value_scores(a_c, k_c, g_c)
    row, chunk = inside[..., :, None], inside[..., -1:, None]
    picks = (row, row, chunk, chunk)
    return [torch.where(p, d, s) for p, d, s in zip(picks, direct, split)], keys, whole


def _value_outputs(q_c, k_c, g_c, keys, states_in, from_start, inside, direct_keys, whole):
    """The second part's outputs [N, B, NH, C, V]: M_t = M_{t-1} diag(exp(g_t)) + (v_t + u_t)
    k_t^T read along q, from the keys v + u and the states S_n entering each chunk, as the sum
    of the pairs inside each chunk and (Q S_n^T) ⊙ exp(b). At the rows `inside`, each pair's
    decay split at the chunk's start, ((tril(Q keys^T) (exp(-b) ⊙ K)) ⊙ exp(b), one matmul a
    chunk; at the others, by chunk_diagonal's binary split (_diagonal_blocks)."""
    decay = from_start[..., 1:, :]
    scores = _bmm(q_c, keys.transpose(-1, -2)).tril_()
    out = _bmm(scores, direct_keys, add=_bmm(q_c, states_in.transpose(-1, -2))).mul_(decay)
    if whole:
        return out
    split = torch.diagonal(scores, dim1=-2, dim2=-1).unsqueeze(-1) * k_c  # the pairs j = r
    pre = _value_split(scores, k_c, g_c, split)  # exp(b)
    split.add_(_bmm(q_c, states_in.transpose(-1, -2)).mul_(pre))
    return torch.where(inside.unsqueeze(-1), out, split)


def _value_split(scores, k_c, g_c, out):
    """The pairs j < r of the second part by the binary split (as chunk_diagonal's value-side
    gates): adds Σ_j scores[r, j] exp(b_r - b_j) ⊙ k_j into out [N, B, NH, C, V], in place,
    block by block, each pair's decay split at the boundary between its block's halves into
    exp(b_r - b_m) and exp(b_m - b_j), products of per-token decays. Returns exp(b) [N, B, NH,
    C, V], the running decays from each chunk's start."""
    chunk_size = scores.shape[-1]
    pre = g_c.exp()  # decayed from the start of a block of one token, the token's own included
    cols = k_c.clone()  # to its end: 1
    block = 1
    while block < chunk_size:
        corner = _pair_blocks(scores, block)[..., block:, :block]  # [N, B, NH, n, b, b]
        cols_left = _value_halves(cols, block)[0]
        pre_left, pre_right = _value_halves(pre, block)
        _value_halves(out, block)[1].add_(torch.matmul(corner, cols_left).mul_(pre_right))
        cols_left.mul_(pre_right[..., -1:, :])  # before pre_right changes
        pre_right.mul_(pre_left[..., -1:, :])
        block *= 2
    return pre


def _value_span(q_c, k_c, v_c, g_c, a_c, state, kept, guard):
    """chunk_dplr_value's two passes as one on a span of chunks, on S = M^T (state [B, NH, V,
    K]), without autograd: q_c, v_c [N, B, NH, C, K]; k_c, a_c, g_c [N, B, NH, C, V]. Returns
    ([o [N, B, NH, C, V]], the state after the span); kept is unused (no own backward).
    Guarded, as chunk_dplr's spans: the inputs and the intermediates that triangular products
    read are made finite, and a token that had a non-finite one poisons its output, those
    after it and the state (see common._guarded_spans).

    As chunk_dplr on S with no queries and b = k (_value_pieces): T = (I - ak)^{-1}, W =
    T (exp(b_{r-1}) ⊙ A), U' = T ak V, the states entering each chunk S_n (_value_states) and
    the pseudo-values u = W S_n + U'; then, as chunk_diagonal with value-side gates, the
    outputs of M_t = M_{t-1} diag(exp(g_t)) + (v_t + u_t) k_t^T read along q (_value_outputs).
    What the two passes compute and this does not: the first's outputs (its queries, the a's
    one token early, read its own pseudo-values) and the second's state passing (the same
    states). Each row takes the direct form or the binary split by `inside` (_value_range),
    which no later token changes: the choice is causal, bit for bit."""
    poison = None
    if guard:
        k_c, v_c, g_c, a_c, poison = _value_finite_inputs(k_c, v_c, g_c, a_c)
    from_start, inside = _value_range(g_c)
    pieces, direct_keys, whole = _value_pieces(a_c, k_c, g_c, from_start, inside)
    ak, rows, cols, chunk_decay = pieces
    solve_dtype = torch.promote_types(q_c.dtype, torch.float32)
    t_inv = _unit_lower_inverse(-ak.to(solve_dtype)).to(q_c.dtype)
    ak_v = _bmm(ak, v_c)
    if guard:
        # an overflow in a later token's row would reach the earlier rows through T's zeros
        rows, poison_a = _finite_rows_(rows)
        ak_v, poison_v = _finite_rows_(ak_v)
        poison = poison + poison_a + poison_v
    w = _bmm(t_inv, rows)
    writes = _bmm(t_inv, ak_v, add=v_c)  # V + U'
    states_in, state = _value_states(state, cols, w, writes, chunk_decay, poison)
    keys = _bmm(w, states_in, add=writes)  # v + u, the second part's keys
    if guard:
        keys, poison_u = _finite_rows_(keys)
        poison = poison + poison_u
    o = _value_outputs(q_c, k_c, g_c, keys, states_in, from_start, inside, direct_keys, whole)
    if poison is not None:
        o = o + torch.cumsum(poison, -1).unsqueeze(-1)
    return [o], state
