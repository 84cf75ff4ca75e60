"""Kernels of the diagonal-gate class: S_t = diag(exp(gk_t)) S_{t-1} diag(exp(gv_t)) + k_t v_t^T,
o_t = q_t S_t, with a key-side log-gate gk_t per key channel and a value-side log-gate gv_t per
value channel (either None: no decay on that side; GLA has only the key side). The derivation is
in docs/algorithms.md, section "Diagonal gates".

chunk_diagonal runs the chunked form. A decay that differs per channel cannot be one mask on
the scores, so inside a chunk the pairs of tokens are handled by a binary split into aligned
blocks, each pair's decay measured from the boundary between the halves of its block
(_diagonal_span); the same factors at the chunk level pass the state. Without value-side gates
it has its own backward (common._OwnBackward), keeping the decayed scores and the states
entering each chunk; value-side gates go through autograd.

Uses the layout and numerical rules of common.py, and imports only torch and common, so the
generated module can hold a copy of its source (see kernel_source in this package).
"""

import torch

from mixc.backends.pytorch.kernels.common import (
    _bmm,
    _chain,
    _finite_rows,
    _guarded_spans,
    _needs_grad,
    _pair_blocks,
    _poison_rows,
    _two_matmuls,
)
from mixc.backends.pytorch.kernels.operators import _opaque_call, _own_backward


def _scan_states(initial_state, chunk_decay_k, chunk_decay_v, chunk_kv, reverse=False):
    """Sequential state passing S_{n+1} = dk_n[:, None] * S_n * dv_n[None, :] + KV_n (reverse:
    from the last chunk to the first, S_n = dk_n[:, None] * S_{n+1} * dv_n[None, :] + KV_n, as
    a state's gradient flows).

    chunk_decay_k: [N, B, NH, K] or None, chunk_decay_v: [N, B, NH, V] or None,
    chunk_kv: [N, B, NH, K, V]. Returns (states entering each chunk [N, B, NH, K, V], final
    state [B, NH, K, V]); in reverse, chunk n is entered by S_{n+1} and the final state is S_0.
    """
    # unbind, not indexing: under autograd its backward is one stack, not a zero-filled
    # gradient of the whole tensor per chunk
    kv = chunk_kv.unbind(0)
    decay_k = None if chunk_decay_k is None else chunk_decay_k.unsqueeze(-1).unbind(0)
    decay_v = None if chunk_decay_v is None else chunk_decay_v.unsqueeze(-2).unbind(0)

    def next_state(n, state, out):
        if decay_v is not None:
            state = state * decay_v[n]
        if decay_k is None:
            return torch.add(kv[n], state, out=out)
        return torch.addcmul(kv[n], decay_k[n], state, out=out)

    tracked = _needs_grad(initial_state, chunk_decay_k, chunk_decay_v, chunk_kv)
    return _chain(initial_state, chunk_kv.shape[0], next_state, tracked, reverse)


def _halves(x, block):
    """[N, B, NH, C, d] -> (left, right) halves of every block of 2 * block tokens, each
    [N, B, NH, C / (2 * block), block, d] (views, writable)."""
    pairs = x.reshape(*x.shape[:3], x.shape[3] // (2 * block), 2, block, x.shape[-1])
    return pairs[..., 0, :, :], pairs[..., 1, :, :]


def _double_decays(prefix, suffix, block):
    """Segment decays for blocks of 2 * block tokens from those for blocks of `block`.

    prefix[i] = exp(g_s + ... + g_i) and suffix[j] = exp(g_{j+1} + ... + g_e) inside the
    aligned block [s, e] holding the token (suffix None: all ones). A block's right half
    continues the left half's prefix, and the left half's suffix runs on through the right
    half: one multiply each by the other half's total, a product of factors <= 1.
    """
    shape = prefix.shape
    pairs = prefix.reshape(*shape[:3], shape[3] // (2 * block), 2, block, shape[-1])
    left_total, right_total = pairs[..., 0, -1:, :], pairs[..., 1, -1:, :]
    if not _needs_grad(prefix, suffix):
        # without autograd, in place: only the halves that change are written (the suffix
        # first: right_total is a view of the prefix's right half)
        suffix = (torch.ones_like(pairs) if suffix is None else suffix).view(pairs.shape)
        suffix[..., 0, :, :].mul_(right_total)
        pairs[..., 1, :, :].mul_(left_total)
        return prefix, suffix.view(shape)
    ones = torch.ones_like(left_total)
    prefix = pairs * torch.stack([ones, left_total], dim=-3)
    to_right_end = torch.stack([right_total, ones], dim=-3)
    suffix = to_right_end if suffix is None else suffix.reshape(pairs.shape) * to_right_end
    return prefix.reshape(shape), suffix.reshape(shape)


def _decayed_halves(q_c, k_c, pre_k, suf_k, block):
    """The queries of every right half and the keys of every left half of the blocks of
    2 * block tokens, each decayed to the boundary r between the halves (see _double_decays):
    q_i ⊙ exp(b_i - b_r) and k_j ⊙ exp(b_r - b_j) (pre_k, suf_k None: no decay)."""
    q_right, k_left = _halves(q_c, block)[1], _halves(k_c, block)[0]
    if pre_k is not None:
        q_right = q_right * _halves(pre_k, block)[1]  # exp(b_i - b_r)
        if suf_k is not None:
            k_left = k_left * _halves(suf_k, block)[0]  # exp(b_r - b_j)
    return q_right, k_left


def _diagonal_blocks(q_c, k_c, v_c, pre_k, pre_v, scores, out):
    """The pairs j < i inside the chunks of a span, block by block: for the aligned blocks of 2,
    4, ..., C tokens, the queries of each right half against the keys of its left half, both
    decayed to the boundary between the halves (_decayed_halves). Without value-side gates
    (pre_v None) each block's scores are written into `scores` [N, B, NH, C, C], in place;
    with them, a block's contribution differs per value channel and is added into the outputs
    `out` [N, B, NH, C, V] at once.

    pre_k, pre_v: the decays exp(g) of every token [N, B, NH, C, d] (None: no decay on that
    side), the segment decays of blocks of one token. Returns the segment decays of the whole
    chunk (_double_decays): (pre_k, suf_k, pre_v, suf_v), the prefixes exp(b_i) and the
    suffixes exp(b_C - b_j) of both sides.
    """
    suf_k = suf_v = None
    block = 1
    while block < q_c.shape[3]:
        q_right, k_left = _decayed_halves(q_c, k_c, pre_k, suf_k, block)
        corner = torch.matmul(q_right, k_left.transpose(-1, -2))  # [N, B, NH, n, b, b]
        if pre_v is None:
            _pair_blocks(scores, block)[..., block:, :block] = corner
        else:
            # value-side gates differ per output channel: apply the block's contribution now
            v_left = _halves(v_c, block)[0]
            if suf_v is not None:
                v_left = v_left * _halves(suf_v, block)[0]
            update = torch.matmul(corner, v_left) * _halves(pre_v, block)[1]
            _halves(out, block)[1].add_(update)
            pre_v, suf_v = _double_decays(pre_v, suf_v, block)
        if pre_k is not None:
            pre_k, suf_k = _double_decays(pre_k, suf_k, block)
        block *= 2
    return pre_k, suf_k, pre_v, suf_v


def _diagonal_states(q_c, k_c, v_c, pre_k, suf_k, pre_v, suf_v, state):
    """The inter-chunk state pass over a span, with the chunk-level factors the last level of
    _diagonal_blocks gives, exp(b_i) and exp(b_C - b_j) of either side (None: no decay):
    S_C = diag(exp(bk_C)) S_0 diag(exp(bv_C)) + (K ⊙ exp(bk_C - bk))^T (V ⊙ exp(bv_C - bv)).
    Returns (Q ⊙ exp(bk), which reads the state entering its chunk, the states entering each
    chunk [N, B, NH, K, V], the state after the span)."""
    k_to_end, v_to_end, q_from_start = k_c, v_c, q_c
    chunk_decay_k = chunk_decay_v = None
    if pre_k is not None:
        q_from_start = q_c * pre_k  # exp(bk_i)
        if suf_k is not None:
            k_to_end = k_c * suf_k  # exp(bk_C - bk_j)
        chunk_decay_k = pre_k[..., -1, :]  # exp(bk_C) [N, B, NH, K]
    if pre_v is not None:
        if suf_v is not None:
            v_to_end = v_c * suf_v
        chunk_decay_v = pre_v[..., -1, :]
    chunk_kv = _bmm(k_to_end.transpose(-1, -2), v_to_end)  # [N, B, NH, K, V]
    states_in, state = _scan_states(state, chunk_decay_k, chunk_decay_v, chunk_kv)
    return q_from_start, states_in, state


def _diagonal_span(q_c, k_c, v_c, gk_c, gv_c, state, kept, guard):
    """The diagonal-gate recurrence on one span of chunks: q_c, k_c [N, B, NH, C, K], v_c
    [N, B, NH, C, V], log-gates gk_c [N, B, NH, C, K] and gv_c [N, B, NH, C, V] (either None);
    guarded against non-finite values of v (see _guarded_spans). Returns ([o [N, B, NH, C, V]],
    state after the span); without value-side gates, appends the decayed scores A and the
    states entering each chunk to kept if given.

    Inside a chunk, the pairs j < i are split by the aligned blocks of 2, 4, ..., C tokens:
    each pair belongs to exactly one block in which j is in the left half and i in the right
    half. For that block the decay exp(b_i - b_j) = exp(b_i - b_r) exp(b_r - b_j) is measured
    from the boundary r (the last token of the left half): q_i ⊙ exp(b_i - b_r) and
    k_j ⊙ exp(b_r - b_j), both factors <= 1, built as products of per-token decays inside
    the halves (never exp(b_i) exp(-b_j)); the block's scores are one batched matmul
    (_diagonal_blocks). The pairs i = j need no decay. The same factors at the chunk level
    carry the state (_diagonal_states).
    """
    # per-level segment decays (see _double_decays); at block size 1: exp(g_i) and 1
    pre_k = None if gk_c is None else torch.exp(gk_c)
    pre_v = None if gv_c is None else torch.exp(gv_c)

    # --- intra-chunk: the diagonal, then blocks of 2, 4, ..., C tokens -------------------
    diag = (q_c * k_c).sum(dim=-1)  # i = j: q_i . k_i  [N, B, NH, C]
    v_scored = v_c  # what A multiplies, the state's writes taking the values as they are
    scores = out = None
    if pre_v is None:
        # one score matrix per chunk, filled block by block in place: A [N, B, NH, C, C]
        scores = torch.diag_embed(diag)
        if guard:
            v_scored, poison = _finite_rows(v_c)
            scores = _poison_rows(scores, poison)
    else:
        out = diag.unsqueeze(-1) * v_c  # outputs from inside blocks of 1 token
    pre_k, suf_k, pre_v, suf_v = _diagonal_blocks(q_c, k_c, v_c, pre_k, pre_v, scores, out)

    # --- inter-chunk: the chunk-level factors are the last level's ---------------------
    # the state passes (_diagonal_states), and y_i += ((q_i ⊙ exp(bk_i)) S_0) ⊙ exp(bv_i)
    decays = (pre_k, suf_k, pre_v, suf_v)
    q_from_start, states_in, state = _diagonal_states(q_c, k_c, v_c, *decays, state)
    if pre_v is None:
        if kept is not None:
            kept.append([scores, states_in])
        # A V, then the inter part accumulated into it by the same matmul call
        o = _two_matmuls(scores, v_scored, q_from_start, states_in)
    else:
        o = out + _bmm(q_from_start, states_in) * pre_v
    return [o], state


def _within(x, block, upper):
    """Sums over each aligned run of `block` tokens of x [..., C, d] (dim -2), per channel: at
    token l, of the tokens i >= l of its run (upper) or of the tokens j < l (not upper)."""
    ones = torch.ones(block, block, dtype=x.dtype, device=x.device)
    sums = torch.triu(ones) if upper else torch.tril(ones, diagonal=-1)  # [l, i]
    runs = x.reshape(*x.shape[:-2], x.shape[-2] // block, block, x.shape[-1])
    return torch.matmul(sums, runs).reshape(x.shape)


def _diagonal_blocks_grads(q_c, k_c, pre_k, d_scores, dq, dk, dg):
    """The gradient through the binary split of _diagonal_blocks (key-side gates only): every
    level hands its corner blocks of dA [N, B, NH, C, C] back to that level's decayed queries
    and keys, added into dq and dk [N, B, NH, C, K] in place, and, into dg (None: not asked
    for), what each factor passes on to the gates: a right half's exp(b_i - b_r) holds g_l for
    the l <= i of that half, a left half's exp(b_r - b_j) the l > j of that half. pre_k: exp(g)
    per token (None: no decay). Returns the chunk-level (pre_k, suf_k), as _diagonal_blocks."""
    suf_k = None
    block = 1
    while block < q_c.shape[3]:
        q_right, k_left = _decayed_halves(q_c, k_c, pre_k, suf_k, block)
        d_corner = _pair_blocks(d_scores, block)[..., block:, :block]  # [N, B, NH, n, b, b]
        d_q_right = torch.matmul(d_corner, k_left)  # for the decayed queries
        d_k_left = torch.matmul(d_corner.transpose(-1, -2), q_right)  # for the decayed keys
        if dg is not None:
            _halves(dg, block)[1].add_(_within(d_q_right * q_right, block, upper=True))
            _halves(dg, block)[0].add_(_within(d_k_left * k_left, block, upper=False))
        if pre_k is not None:
            d_q_right = d_q_right * _halves(pre_k, block)[1]
            if suf_k is not None:
                d_k_left = d_k_left * _halves(suf_k, block)[0]
        _halves(dq, block)[1].add_(d_q_right)
        _halves(dk, block)[0].add_(d_k_left)
        if pre_k is not None:
            pre_k, suf_k = _double_decays(pre_k, suf_k, block)
        block *= 2
    return pre_k, suf_k


def _diagonal_grads_span(q_c, k_c, v_c, gk_c, gv_c, do_c, scores, states_in, d_state, gate_grad):
    """Gradients of the diagonal-gate recurrence without value-side gates (gv_c None) on one span
    of chunks, from the forward's decayed scores A [N, B, NH, C, C] and states entering each
    chunk S_n, the output gradient do_c and the gradient d_state of the state leaving the span.

    Returns ([dq, dk, dv, dgk (None unless gate_grad), None], the gradient of the state
    entering the span). dA = dO V^T on A's support, dV = A^T dO + diag(exp(bk_C - bk)) K
    D_{n+1}; the diagonal, then every level of the binary split of _diagonal_span, hands
    dA's corner blocks back to the decayed queries and keys of that level
    (_diagonal_blocks_grads); the chunk level carries the state's gradient D_n = (Q ⊙
    exp(bk))^T dO + diag(exp(bk_C)) D_{n+1}. The gate's gradient, per channel, sums what each
    decay factor holding exp(g_l) passes on (its gradient times its value): a right half's
    exp(b_i - b_r) holds g_l for the l <= i of that half, a left half's exp(b_r - b_j) the
    l > j of that half, and at the chunk level exp(b_i), exp(b_C - b_j) and exp(b_C) hold
    l <= i, l > j and every l.
    """
    chunk_size = q_c.shape[3]
    pre_k = None if gk_c is None else torch.exp(gk_c)
    d_scores = _bmm(do_c, v_c.transpose(-1, -2)).tril_()  # dA on A's support
    dq = k_c * torch.diagonal(d_scores, dim1=-2, dim2=-1).unsqueeze(-1)  # i = j
    dk = q_c * torch.diagonal(d_scores, dim1=-2, dim2=-1).unsqueeze(-1)
    dg = None if pre_k is None or not gate_grad else torch.zeros_like(q_c)
    pre_k, suf_k = _diagonal_blocks_grads(q_c, k_c, pre_k, d_scores, dq, dk, dg)

    # --- the chunk level: the state and its gradient ---------------------------------------
    q_from_start, k_to_end, v_to_end, decay_k = q_c, k_c, v_c, None
    if pre_k is not None:
        q_from_start, decay_k = q_c * pre_k, pre_k[..., -1, :]
        if suf_k is not None:
            k_to_end = k_c * suf_k
    local = _bmm(q_from_start.transpose(-1, -2), do_c)  # (Q ⊙ exp(bk))^T dO
    d_next, d_state = _scan_states(d_state, decay_k, None, local, reverse=True)  # D_{n+1}, D_0
    dv = _two_matmuls(scores.transpose(-1, -2), do_c, k_to_end, d_next)
    from_q = _bmm(do_c, states_in.transpose(-1, -2))  # dO S_n^T
    from_k = _bmm(v_to_end, d_next.transpose(-1, -2))  # V D_{n+1}^T
    if pre_k is not None:
        from_q = from_q * pre_k
        if suf_k is not None:
            from_k = from_k * suf_k
    if dg is not None:
        whole = (states_in * d_next).sum(-1) * decay_k  # <S_n, D_{n+1}> per key channel
        dg += _within(q_c * from_q, chunk_size, upper=True)
        dg += _within(k_c * from_k, chunk_size, upper=False)
        dg += whole.unsqueeze(-2)
    return [dq + from_q, dk + from_k, dv, dg, None], d_state


def chunk_diagonal(q, k, v, gk=None, gv=None, initial_state=None, chunk_size=64):
    """Chunked S_t = diag(exp(gk_t)) S_{t-1} diag(exp(gv_t)) + k_t v_t^T, o_t = q_t S_t.

    gk: key-side log-gate [B, NH, T, K], gv: value-side log-gate [B, NH, T, V];
    either may be None (no decay on that side). Returns (o, final state).
    """
    if gv is None:
        seqs = [q, k, v, gk, None]
        return _own_backward(
            _diagonal_span, _diagonal_grads_span, 3, chunk_size, initial_state, seqs
        )
    return _opaque_call(_diagonal_value_gated, [q, k, v, gk, gv, initial_state], chunk_size)


def _diagonal_value_gated(q, k, v, gk, gv, initial_state, chunk_size):
    """chunk_diagonal with value-side gates, through autograd: (o, final state)."""
    (o,), state, _ = _guarded_spans(_diagonal_span, [q, k, v, gk, gv], initial_state, chunk_size)
    return o, state
