"""Kernels of the scalar-decay class: S_t = exp(g_t) S_{t-1} + k_t v_t^T, o_t = q_t S_t, with one
log-gate g_t per token and head (g None: no decay, linear attention). The derivation is in
docs/algorithms.md, section "Scalar decay".

chunk_scalar_decay runs the chunked form: inside a chunk the output is the masked scores
(Q K^T ⊙ Gamma) V plus the decayed queries times the state entering the chunk, and the state
passes from chunk to chunk as exp(b_C) S_0 plus the keys decayed to the chunk's end times V.
Under autograd it has its own backward (common._OwnBackward), keeping the masked scores and the
states entering each chunk. parallel_scalar_decay is the quadratic form over the whole sequence,
one T x T decay mask, and keeps no state.

Uses the layout and numerical rules of common.py, and imports only torch and common, so the
generated module can hold a copy of its source (see kernel_source in this package).
"""

import torch

from mixc.backends.pytorch.kernels.common import (
    _as_3d,
    _bmm,
    _chain,
    _chunk_decays,
    _chunk_size_for,
    _finite_gates,
    _finite_rows,
    _gate_grads,
    _guarded_spans,
    _masked,
    _needs_grad,
    _ordered_decays,
    _pair_decays,
    _poison_rows,
    _scalar_decays,
    _two_matmuls,
)
from mixc.backends.pytorch.kernels.operators import _opaque_call, _own_backward


def _scan_scalar(initial_state, chunk_g, chunk_kv, reverse=False):
    """State passing S_{n+1} = exp(G_n) S_n + KV_n over the N chunks of a span (reverse: from the
    last chunk to the first, S_n = exp(G_n) S_{n+1} + KV_n, as a state's gradient flows).

    chunk_g: [N, B, NH] log-decay of each whole chunk (None: no decay), chunk_kv:
    [N, B, NH, K, V]. Returns (states entering each chunk [N, B, NH, K, V], final state
    [B, NH, K, V]); in reverse, chunk n is entered by S_{n+1} and the final state is S_0.
    One fused add (multiply-add with decay) per chunk, each state from the chunks on its side
    only: a running sum by a matmul with a triangular matrix of ones would multiply a
    non-finite chunk by the 0s of the other states, making them NaN (and on CPU it is no
    faster; with decay, neither is a matmul with N x N decay weights).
    """
    # unbind, not indexing: under autograd its backward is one stack, not a zero-filled
    # gradient of the whole tensor per chunk
    kv = chunk_kv.unbind(0)
    decay = None if chunk_g is None else chunk_g.exp()[..., None, None].unbind(0)

    def next_state(n, state, out):
        if decay is None:
            return torch.add(kv[n], state, out=out)
        return torch.addcmul(kv[n], decay[n], state, out=out)

    tracked = _needs_grad(initial_state, chunk_g, chunk_kv)
    return _chain(initial_state, chunk_kv.shape[0], next_state, tracked, reverse)


def _scalar_decay_span(
    q_c,
    k_c,
    v_c,
    g_c,
    state,
    kept,
    guard,
    reverse=False,
    strict=False,
    decayed=False,
    diagonal=False,
):
    """The scalar-decay recurrence on one span of chunks: q_c, k_c [N, B, NH, C, K], v_c
    [N, B, NH, C, V], g_c [N, B, NH, C] or None; guarded against non-finite values of v (see
    _guarded_spans). Returns ([o [N, B, NH, C, V]], state after the span); appends the masked
    scores Q K^T ⊙ Gamma and the states entering each chunk to kept if given.

    reverse: the state runs backward in time, S_t = exp(g_t) S_{t+1} + k_t v_t^T, from the
    span's last chunk to its first, the state entering a chunk the one after it; strict: the
    output reads the state before the token's update, q_t S_{t-1} (reverse: q_t S_{t+1}). Only
    the decays and the triangle change (_ordered_decays, _masked); guarded, their non-finite
    gates decay by 1 inside the chunk and poison the outputs that read them instead (the state
    passed on still takes them). decayed (with strict, not reverse): q_t exp(g_t) S_{t-1}, the
    state after the token's decay, before its write: the decays of the plain read (each pair
    (i, j < i) by a_{j+1} .. a_i), the triangle of the strict one. diagonal: q_t . k_t
    [N, B, NH, C, 1] too, the scores' diagonal before any mask, a second output."""
    gates, before = g_c, strict and not decayed  # the decays' order; the triangle: strict
    if guard and (reverse or before) and g_c is not None:
        gates, poison_g = _finite_gates(g_c)
    gamma, from_start, _, k_to_end, chunk_g = _scalar_decays(k_c, gates, reverse, before)
    chunk_g = chunk_g if gates is g_c else g_c.sum(-1)
    # S_C = exp(b_C) S_0 + (diag(exp(b_C - b)) K)^T V, from the values as they are: a
    # non-finite one makes the state, and so every later chunk, non-finite
    chunk_kv = _bmm(k_to_end.transpose(-1, -2), v_c)  # [N, B, NH, K, V]
    states_in, state = _scan_scalar(state, chunk_g, chunk_kv, reverse)
    # Y = (Q K^T ⊙ Gamma) V + diag(exp(b)) Q S_0, the intra part for all chunks at once
    scores = _bmm(q_c, k_c.transpose(-1, -2))  # [N, B, NH, C, C]
    # a copy: without decay the mask is applied in place
    dots = torch.diagonal(scores, 0, -2, -1).unsqueeze(-1).clone() if diagonal else None
    scores = _masked(scores, gamma, reverse, strict)
    if guard:
        v_c, poison = _finite_rows(v_c)
        poison = poison if gates is g_c else poison + poison_g
        scores = _poison_rows(scores, poison, reverse, strict)
    q_from_start = q_c if from_start is None else q_c * from_start  # diag(exp(b)) Q
    if kept is not None:
        kept.append([scores, states_in])
    # intra part, then the inter part accumulated into it by the same matmul call
    o = _two_matmuls(scores, v_c, q_from_start, states_in)
    return ([o, dots] if diagonal else [o]), state


def _scalar_decay_grads_span(
    q_c,
    k_c,
    v_c,
    g_c,
    do_c,
    probs,
    states_in,
    d_state,
    gate_grad,
    reverse=False,
    strict=False,
    decayed=False,
):
    """Gradients of the scalar-decay recurrence on one span of chunks, from the forward's masked
    scores P = Q K^T ⊙ Gamma [N, B, NH, C, C] and states entering each chunk [N, B, NH, K, V],
    the output gradient do_c [N, B, NH, C, V] and the gradient d_state of the state leaving the
    span.

    Returns ([dq, dk, dv, dg [N, B, NH, C, 1] (None unless gate_grad)], the gradient of the
    state entering the span). With A = Q K^T, P = A ⊙ Gamma, dA = (dO V^T) ⊙ Gamma, the
    states S_n entering each chunk and D_n = dL/dS_n, D_n = (diag(exp(b)) Q)^T dO_n +
    exp(G_n) D_{n+1}:
        dQ = dA K + diag(exp(b)) dO S_n^T      dK = dA^T Q + diag(exp(b_C - b)) V D_{n+1}^T
        dV = P^T dO + diag(exp(b_C - b)) K D_{n+1}
    and the gate's gradient from every decay factor (_gate_grads). reverse, strict, decayed: as
    the span's; reverse, the state's gradient flows from the first chunk to the last.
    """
    before = strict and not decayed  # the decays' order; the triangle: strict
    gamma, from_start, to_end, k_to_end, chunk_g = _scalar_decays(k_c, g_c, reverse, before)
    d_probs = _bmm(do_c, v_c.transpose(-1, -2))  # dP = dO V^T
    d_scores = _masked(d_probs, gamma, reverse, strict)
    if gamma is None:
        q_from_start, v_to_end, do_from_start = q_c, v_c, do_c
    else:
        q_from_start, v_to_end, do_from_start = q_c * from_start, v_c * to_end, do_c * from_start
    local = _bmm(q_from_start.transpose(-1, -2), do_c)  # (diag(exp(b)) Q)^T dO [N, B, NH, K, V]
    d_next, d_state = _scan_scalar(d_state, chunk_g, local, not reverse)  # D_{n+1}, D_0
    dv = _two_matmuls(probs.transpose(-1, -2), do_c, k_to_end, d_next)
    from_q = _bmm(do_from_start, states_in.transpose(-1, -2))  # diag(exp(b)) dO S_n^T
    from_k = _bmm(v_to_end, d_next.transpose(-1, -2))  # diag(exp(b_C - b)) V D_{n+1}^T
    dg = None
    if gate_grad:
        dg = _gate_grads(
            d_probs * probs,  # Gamma in P
            (q_c * from_q).sum(-1),  # exp(b_i) in Q's inter part
            (k_c * from_k).sum(-1),  # exp(b_C - b_j) in the state's writes
            (states_in * d_next).sum((-1, -2)) * chunk_g.exp(),  # <S_n, D_{n+1}> exp(G_n)
            reverse,
            before,
        )
    dq = _bmm(d_scores, k_c, add=from_q)
    dk = _bmm(d_scores.transpose(-1, -2), q_c, add=from_k)
    return [dq, dk, dv, dg], d_state


def chunk_scalar_decay(
    q,
    k,
    v,
    g=None,
    initial_state=None,
    chunk_size=64,
    reverse=False,
    strict=False,
    decayed=False,
    diagonal=False,
):
    """Chunked S_t = exp(g_t) S_{t-1} + k_t v_t^T, o_t = q_t S_t (g=None: linear attention).
    reverse: the state runs backward in time, S_t = exp(g_t) S_{t+1} + k_t v_t^T, from
    initial_state after the last token (zero tokens after it, a packed sequence's padding,
    leave it as it is), the final state the one at the first token; strict: o_t = q_t S_{t-1}
    (reverse: q_t S_{t+1}), the state before the token's update; strict and decayed (forward
    only): o_t = exp(g_t) q_t S_{t-1}, the state after the token's decay, before its write.

    Returns (o [B, NH, T, V], final state [B, NH, K, V]); with diagonal, a third: q_t . k_t
    [B, NH, T] (a folded write's correction reads it), the diagonal of the scores the chunks
    compute anyway, where nothing records the call and no compiler traces it, else None.
    """
    if decayed and (reverse or not strict):
        raise ValueError("chunk_scalar_decay: decayed reads forward and strict only")
    seqs, order = [q, k, v, g], int(reverse) | 2 * int(strict) | 4 * int(decayed)
    span, grads = _scalar_decay_span, _scalar_decay_grads_span
    if diagonal and not (_needs_grad(initial_state, *seqs) or torch.compiler.is_compiling()):
        flags = {"reverse": reverse, "strict": strict, "decayed": decayed, "diagonal": True}

        def both(*chunks_and_state):
            return span(*chunks_and_state, **flags)

        (o, dots), state, _ = _guarded_spans(both, seqs, initial_state, chunk_size, reverse=reverse)
        return o, state, dots.squeeze(-1)
    o, state = _own_backward(span, grads, 3, chunk_size, initial_state, seqs, order=order)
    return (o, state, None) if diagonal else (o, state)


def _rank_masked(x, gamma, rank, queries=1):
    """x ⊙ Gamma for x [..., queries C, rank C], scores of the queries rows of each token i
    against the rank rows of every token j: Gamma_ij where j <= i, 0 (selected) where j > i.
    Read as [..., C, queries, C, rank], so that Gamma and the causal mask broadcast over a
    token's rows (no copies of them repeated)."""
    size = x.shape[-1] // rank
    later = torch.ones(size, size, dtype=torch.bool, device=x.device).triu(1)
    later = later[:, None, :, None]
    rows = x.unflatten(-1, (size, rank)).unflatten(-3, (size, queries))
    kept = rows.clone() if gamma is None else rows * gamma[..., :, None, :, None]
    return kept.masked_fill_(later, 0.0).flatten(-2).flatten(-3, -2)


def _rank_decays(g_c):
    """The scalar decays of _scalar_decays but the decayed keys, for the rank rows' kernel:
    (Gamma, exp(b), exp(b_C - b) [..., C, 1] of each token, G), None without decay."""
    if g_c is None:
        return None, None, None, None
    gamma = _pair_decays(g_c)
    from_start, to_end = (x.unsqueeze(-1) for x in _chunk_decays(gamma, g_c))
    return gamma, from_start, to_end, g_c.sum(-1)


def _rows_times(x_r, factor, rank):
    """The rank rows [..., rank C, d] of each token times its token's factor [..., C, 1]
    (broadcast over the rows, not repeated)."""
    return (x_r.unflatten(-2, (-1, rank)) * factor.unsqueeze(-1)).flatten(-3, -2)


def _rank_writes(width, writes):
    """The keys [..., C, K] and values [..., C, V] of a token's writes, in order (views), from
    the kernel's write sequences in chunks, [k_1, ..., k_m, v_1, ..., v_m], each one write or
    several joined along its last axis; `width` is K."""
    half = len(writes) // 2
    ranks = [k.shape[-1] // width for k in writes[:half]]
    keys = [b for k, r in zip(writes[:half], ranks) for b in k.chunk(r, -1)]
    values = [b for v, r in zip(writes[half:], ranks) for b in v.chunk(r, -1)]
    return keys, values, ranks


def _query_rows(q_c, width):
    """A token's queries, joined along the last axis [..., C, m K], as m rows a token
    [..., m C, K] (query j of token i at row m i + j: a view), and m."""
    queries = q_c.shape[-1] // width
    return q_c.unflatten(-1, (queries, width)).flatten(-3, -2), queries


def _scalar_decay_rank_span(q_c, *writes_and_state):
    """_scalar_decay_span for several writes a token (_rank_writes; then g_c, state, kept,
    guard) and one or more queries a token (_query_rows): each write read as a rank-1 kernel
    reads its keys and values, the scores of the m C query rows against its C keys masked and
    decayed as theirs, and the writes summed in the matmuls that take them (into the state
    passed on, and into the output), so that no write row is copied; the state passes once for
    every query. Appends the scores as the backward reads them, [N, B, NH, m C, rank C] (write
    r of token j at column rank j + r), and the states entering each chunk to kept if given.
    The output is [N, B, NH, C, m V], a token's outputs side by side as its queries came."""
    *writes, g_c, state, kept, guard = writes_and_state
    width = state.shape[-1]
    keys, values, _ = _rank_writes(state.shape[-2], writes)
    q_r, queries = _query_rows(q_c, state.shape[-2])
    gamma, from_start, to_end, chunk_g = _rank_decays(g_c)
    chunk_kv = None  # sum over the writes of (diag(exp(b_C - b)) K_r)^T V_r
    for k_r, v_r in zip(keys, values):
        k_to_end = k_r if to_end is None else k_r * to_end
        chunk_kv = _accumulated(chunk_kv, k_to_end.transpose(-1, -2), v_r)
    states_in, state = _scan_scalar(state, chunk_g, chunk_kv.reshape(*q_c.shape[:-2], -1, width))
    if queries == 1:
        scores = [_masked(_bmm(q_r, k_r.transpose(-1, -2)), gamma) for k_r in keys]
    else:
        scores = [_rank_masked(_bmm(q_r, k_r.mT), gamma, 1, queries) for k_r in keys]
    if guard:
        finite = [_finite_rows(v_r) for v_r in values]
        values = [v_r for v_r, _ in finite]
        # a token's poison on its last write's scores: the row's output is then NaN
        _poison_query_rows(scores[-1], sum(poison for _, poison in finite), queries)
    q_from_start = q_r if from_start is None else _rows_times(q_r, from_start, queries)
    if kept is not None:
        kept.append([torch.stack(scores, -1).flatten(-2), states_in])
    out = _accumulated(None, q_from_start, states_in)
    for s, v_r in zip(scores, values):
        out = _accumulated(out, s, v_r)
    return [out.reshape(*q_c.shape[:-1], queries * width)], state


def _poison_query_rows(scores, poison, queries):
    """_poison_rows for the scores [..., m C, C] of m query rows a token: each of a token's
    rows from the first poisoned token on."""
    if queries == 1:
        return _poison_rows(scores, poison)
    rows = scores.unflatten(-2, (-1, queries))  # [..., C, m, C]
    torch.diagonal(rows, dim1=-3, dim2=-1).add_(torch.cumsum(poison, -1).unsqueeze(-2))
    return scores


def _accumulated(out, a, b):
    """out + a @ b for [..., m, k] and [..., k, n] (out None: a @ b) as [batch, m, n]: one
    batched matmul, accumulated in place into the fresh result of the first."""
    if out is None:
        return torch.bmm(_as_3d(a), _as_3d(b))
    return out.baddbmm_(_as_3d(a), _as_3d(b))


def _scalar_decay_rank_grads_span(q_c, *args):
    """_scalar_decay_grads_span for several writes and queries a token (see
    _scalar_decay_rank_span; then g_c, do_c, probs, states_in, d_state, gate_grad): the same
    formulas with rank C write rows and m C query rows, each decayed as its token's, and the
    gradients of the rows split back into the writes' and queries' sequences."""
    *writes, g_c, do_c, probs, states_in, d_state, gate_grad = args
    keys, values, ranks = _rank_writes(states_in.shape[-2], writes)
    q_r, queries = _query_rows(q_c, states_in.shape[-2])
    do_r = do_c.unflatten(-1, (queries, -1)).flatten(-3, -2)  # [..., m C, V]
    rank = len(keys)
    k_r, v_r = (torch.stack(x, -2).flatten(-3, -2) for x in (keys, values))  # [..., rank C, d]
    gamma, from_start, to_end, chunk_g = _rank_decays(g_c)
    d_probs = _bmm(do_r, v_r.transpose(-1, -2))  # dP = dO V^T [N, B, NH, m C, rC]
    d_scores = _rank_masked(d_probs, gamma, rank, queries)
    if gamma is None:
        q_from_start, v_to_end, do_from_start, k_to_end = q_r, v_r, do_r, k_r
    else:
        q_from_start, do_from_start = (_rows_times(x, from_start, queries) for x in (q_r, do_r))
        v_to_end, k_to_end = (_rows_times(x, to_end, rank) for x in (v_r, k_r))
    local = _bmm(q_from_start.transpose(-1, -2), do_r)
    d_next, d_state = _scan_scalar(d_state, chunk_g, local, reverse=True)
    dv = _two_matmuls(probs.transpose(-1, -2), do_r, k_to_end, d_next)
    from_q = _bmm(do_from_start, states_in.transpose(-1, -2))
    from_k = _bmm(v_to_end, d_next.transpose(-1, -2))
    dg = None
    if gate_grad:
        dg = _gate_grads(  # a token's rows share Gamma
            (d_probs * probs)
            .unflatten(-1, (-1, rank))
            .sum(-1)
            .unflatten(-2, (-1, queries))
            .sum(-2),
            (q_r * from_q).sum(-1).unflatten(-1, (-1, queries)).sum(-1),
            (k_r * from_k).sum(-1).unflatten(-1, (-1, rank)).sum(-1),
            (states_in * d_next).sum((-1, -2)) * chunk_g.exp(),
        )
    dq = _bmm(d_scores, k_r, add=from_q).unflatten(-2, (-1, queries)).flatten(-2)
    dk = _bmm(d_scores.transpose(-1, -2), q_r, add=from_k)
    split = []
    for rows in (dk, dv):  # each sequence's writes, joined back along the last axis
        blocks = rows.unflatten(-2, (-1, rank))
        starts = [sum(ranks[:i]) for i in range(len(ranks))]
        split += [blocks[..., a : a + r, :].flatten(-2) for a, r in zip(starts, ranks)]
    return [dq, *split, dg], d_state


def chunk_scalar_decay_rank(q, k, v, g=None, initial_state=None, chunk_size=64):
    """Chunked S_t = exp(g_t) S_{t-1} + sum_r k_{t,r} v_{t,r}^T, o_t = q_t S_t: several writes a
    token, their keys k and values v each a list, one tensor a write (k_r [B, NH, T, K], v_r
    [B, NH, T, V]), or one tensor of them all joined along the last axis (k [B, NH, T, rank
    K], v [B, NH, T, rank V], write r of a token at its r-th block). The transition is
    unchanged: each chunk's C queries score against its rank C writes. Under torch.compile
    more than two writes in a list are joined first (the operator it calls takes seven
    tensors); elsewhere they stay apart, as the spans read them (a join would copy every write
    once more: a quarter of Mamba-3 MIMO's chunk forward at rank 2).

    q may be a list of m queries [B, NH, T, K] of the one state: they are joined (m query rows
    a token) and read in one pass, the state passed from chunk to chunk once for all of them.

    Returns (o [B, NH, T, V], or a list of m of them for a list of queries; final state
    [B, NH, K, V]).
    """
    queries = list(q) if isinstance(q, (list, tuple)) else [q]
    keys = list(k) if isinstance(k, (list, tuple)) else [k]
    values = list(v) if isinstance(v, (list, tuple)) else [v]
    if len(keys) > 2 and torch.compiler.is_compiling():
        keys, values = [torch.cat(keys, -1)], [torch.cat(values, -1)]
    span, grads = _scalar_decay_rank_span, _scalar_decay_rank_grads_span
    width = queries[0].shape[-1]
    if initial_state is None:  # the state's width is a value's, not the joined values'
        rank = keys[0].shape[-1] // width
        first = queries[0]
        initial_state = first.new_zeros(*first.shape[:2], width, values[0].shape[-1] // rank)
    joined = queries[0] if len(queries) == 1 else torch.cat(queries, -1)
    seqs = [joined, *keys, *values, g]
    o, state = _own_backward(span, grads, len(seqs) - 1, chunk_size, initial_state, seqs)
    if isinstance(q, (list, tuple)):
        o = list(o.unflatten(-1, (len(queries), -1)).unbind(-2))
    return o, state


def parallel_scalar_decay(q, k, v, g=None, reverse=False, strict=False):
    """Quadratic form o = (Q K^T ⊙ L) V, L_ij = exp(B_i - B_j) for i >= j (g=None: L is the
    causal mask); reverse, strict: as chunk_scalar_decay's (L's upper triangle, or the strict
    one).

    Returns o [B, NH, T, V] (the quadratic form keeps no state).
    """
    # L_ij = exp(B_i - B_j) for i >= j: the decays of one chunk of all T tokens
    decay, poison_g = None, 0.0
    if g is not None and (reverse or strict):  # finite gates, as in the guarded chunked form
        g, poison_g = _finite_gates(g)
        decay = _ordered_decays(g, reverse, strict)[0]
    elif g is not None:
        decay = _pair_decays(g)
    scores = _masked(torch.matmul(q, k.transpose(-1, -2)), decay, reverse, strict)  # [B, NH, T, T]
    # over the finite values, as in the chunked form
    v_finite, poison = _finite_rows(v)
    return torch.matmul(_poison_rows(scores, poison + poison_g, reverse, strict), v_finite)


def chunk_scalar_decay_stable(q, k, v, g, log_scale, initial_state=None, chunk_size=64):
    """Chunked S_t = exp(g_t) S_{t-1} + exp(s_t) k_t v_t^T, o_t = q_t S_t, for a write scale
    exp(s_t) (s = log_scale [B, NH, T]) too large for the dtype: xLSTM's max-stabiliser.

    Each output row is computed scaled by exp(-m_t), m_t the largest exponent among the terms it
    sums (b_t - b_j + s_j over the chunk's tokens j <= t, and b_t + the incoming state's log
    scale), so every exponential it evaluates is at most 1; the state passes from chunk to
    chunk as a scaled state and its log scale. Returns (o_t exp(-m_t) [B, NH, T, V], m
    [B, NH, T], the final state [B, NH, K, V] unscaled, which is inf where the true state lies
    past the dtype's range). m is a constant shift to autograd: every quantity is exact
    whatever m is, so it needs no gradient; the kernel runs through autograd, chunk by chunk.
    """
    tensors = [q, k, v, g, log_scale, initial_state]
    return _opaque_call(_scalar_decay_stable, tensors, chunk_size)


def _scalar_decay_stable(q, k, v, g, log_scale, initial_state, chunk_size):
    """chunk_scalar_decay_stable, chunk by chunk through autograd."""
    batch, heads, length = q.shape[:3]
    size = _chunk_size_for(chunk_size, length)
    state = q.new_zeros(batch, heads, q.shape[-1], v.shape[-1])
    if initial_state is not None:
        state = initial_state
    state_scale = q.new_zeros(batch, heads)  # the state is exp(state_scale) * state
    causal = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
    outs, scales = [], []
    for start in range(0, length, size):
        q_c, k_c, v_c, s_c = (x[:, :, start : start + size] for x in (q, k, v, log_scale))
        n = q_c.shape[2]
        g_c = q_c.new_zeros(batch, heads, n) if g is None else g[:, :, start : start + n]
        b = g_c.cumsum(-1)
        mask = causal[:n, :n]
        # b_t - b_j as the sum of the gates between j and t (never a difference of two long
        # sums, which would lose the low bits of a strong decay): a running sum down each column
        later = torch.where(mask, g_c[..., :, None], 0.0).tril(-1)
        decays = later.cumsum(-2)
        # m_t, the largest exponent of row t (masked by selection before any exp); any value
        # near it would do, as it is used as it is: a constant shift
        found = torch.where(mask, decays + s_c[..., None, :], -torch.inf).amax(-1)
        m = torch.maximum(found, b + state_scale[..., None]).detach()
        # each exponent as (scale - m_t) + decay: the difference of two scales near each other is
        # exact, where (decay + scale) - m_t would lose the scale's low bits (past 2^7: 1e-5)
        pair = torch.where(mask, (s_c[..., None, :] - m[..., :, None]) + decays, -torch.inf)
        inter = (state_scale[..., None] - m) + b
        v_c, poison = _finite_rows(v_c)
        scores = torch.where(mask, torch.exp(pair) * (q_c @ k_c.mT), 0.0)
        scores = _poison_rows(scores, poison)
        outs.append(scores @ v_c + (q_c * torch.exp(inter)[..., None]) @ state)
        scales.append(m)
        # the state at the chunk's end, scaled by its own largest exponent
        to_end = decays[..., -1, :]  # b_C - b_j
        new_scale = torch.maximum((to_end + s_c).amax(-1), b[..., -1] + state_scale).detach()
        keys = k_c * torch.exp((s_c - new_scale[..., None]) + to_end)[..., None]
        carried = torch.exp((state_scale - new_scale) + b[..., -1])
        state = carried[..., None, None] * state + keys.mT @ v_c
        state_scale = new_scale
    final = state * torch.exp(state_scale)[..., None, None]
    return torch.cat(outs, 2), torch.cat(scales, 2), final
