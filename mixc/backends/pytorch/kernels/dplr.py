"""Kernels of the diagonal-plus-low-rank class: S_t = (diag(exp(g_t)) + b_t a_t^T) S_{t-1} +
k_t v_t^T, o_t = q_t S_t, with a log-gate g_t per key channel (None: no decay) and the two
vectors a_t, b_t of the rank-one term (KDA, RWKV-7, the delta rule erasing along one key and
writing along another). The derivation is in docs/algorithms.md, section "Diagonal plus low
rank".

chunk_dplr runs the chunked form. Inside a chunk the rank-one terms read the state through the
pseudo-values u_r = a_r^T S_{r-1}, which solve one unit lower-triangular system (in at least
fp32); the four score matrices it needs (queries and the a's against keys and the b's) carry a
decay per channel, built over aligned blocks of 2, 4, ..., C tokens with factors measured from
each block's boundary, as the diagonal kernel's. A chunk then acts on the state entering it as
an affine map S -> P S + F, and its outputs are Q' S + Y': the only sequential work is one
matmul per chunk. Under autograd chunk_dplr has its own backward (common._OwnBackward), keeping
only the states entering each chunk: the chunk maps are made again span by span, and the
gradients of the state run back through P (in a compiled graph, autograd through the chunked
form instead).

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
    _OwnBackward,
    _pair_blocks,
    _unit_lower_inverse,
)


def _dplr_doubled(pre, pre_before, suf, block):
    """The decays inside aligned blocks of 2 * block tokens from those inside blocks of `block`:
    pre[r] = exp(g_s + ... + g_r), pre_before[r] = exp(g_s + ... + g_{r-1}) and
    suf[j] = exp(g_{j+1} + ... + g_e) in the block [s, e] holding the token. The right half
    continues the left half's products, and the left half's suffix runs on through the right
    half: one multiply each by the other half's total (a product of factors <= 1)."""
    shape = pre.shape
    halves = (*shape[:3], shape[3] // (2 * block), 2, block, shape[-1])
    pre, pre_before, suf = pre.reshape(halves), pre_before.reshape(halves), suf.reshape(halves)
    left_total, right_total = pre[..., 0, -1:, :], pre[..., 1, -1:, :]
    if not _needs_grad(pre, pre_before, suf):
        # in place, only the halves that change (the suffix first: right_total is a view of
        # the prefix's right half)
        suf[..., 0, :, :].mul_(right_total)
        pre_before[..., 1, :, :].mul_(left_total)
        pre[..., 1, :, :].mul_(left_total)
        return pre.reshape(shape), pre_before.reshape(shape), suf.reshape(shape)
    ones = torch.ones_like(left_total)
    onto_right = torch.stack([ones, left_total], dim=-3)
    onto_left = torch.stack([right_total, ones], dim=-3)
    return (
        (pre * onto_right).reshape(shape),
        (pre_before * onto_right).reshape(shape),
        (suf * onto_left).reshape(shape),
    )


def _dplr_scores(q_c, k_c, a_c, b_c, g_c):
    """The decayed scores of a span of chunks [N, B, NH, C, C], for rows r and columns j:
    qk[r, j] = Σ_c q_rc exp(b_rc - b_jc) k_jc and qb (the same with b) for j <= r, ak[r, j] =
    Σ_c a_rc exp(b_{r-1,c} - b_jc) k_jc and ab (the same with b) for j < r, 0 elsewhere
    (b = cumsum(g) per channel); and exp(b_r), exp(b_{r-1}), exp(b_C - b_j) [N, B, NH, C, K].

    Each pair j < r lies in exactly one aligned block of 2, 4, ..., C tokens with j in its left
    half and r in its right half; there the decay is split at the boundary between the halves,
    both factors products of per-token decays <= 1 (never exp(b_r) exp(-b_j)), and the block's
    four corners are batched matmuls of the decayed rows (q, a) and columns (k, b).
    """
    chunk_size = q_c.shape[3]
    pre = g_c.exp()  # inside blocks of one token: exp(g_r), the empty product 1, 1
    pre_before = torch.ones_like(pre)
    suf = torch.ones_like(pre)
    qk = torch.diag_embed((q_c * k_c).sum(-1))  # the pairs r = j
    qb = torch.diag_embed((q_c * b_c).sum(-1))
    ak, ab = torch.zeros_like(qk), torch.zeros_like(qk)

    def halves(x):
        return x.reshape(*x.shape[:3], chunk_size // (2 * block), 2, block, x.shape[-1]).unbind(-3)

    block = 1
    while block < chunk_size:
        # the right halves' rows decayed from the boundary, the left halves' columns to it
        pre_right, before_right, suf_left = halves(pre)[1], halves(pre_before)[1], halves(suf)[0]
        q_right, a_right = halves(q_c)[1] * pre_right, halves(a_c)[1] * before_right
        k_left, b_left = halves(k_c)[0] * suf_left, halves(b_c)[0] * suf_left
        for scores, rows, cols in (
            (qk, q_right, k_left),
            (qb, q_right, b_left),
            (ak, a_right, k_left),
            (ab, a_right, b_left),
        ):
            corner = torch.matmul(rows, cols.transpose(-1, -2))  # [N, B, NH, n, block, block]
            _pair_blocks(scores, block)[..., block:, :block] = corner
        pre, pre_before, suf = _dplr_doubled(pre, pre_before, suf, block)
        block *= 2
    return qk, qb, ak, ab, pre, pre_before, suf


def _dplr_maps(q_c, k_c, v_c, g_c, a_c, b_c, guard):
    """What each chunk of a span does, chunk-major: S_{n+1} = P S_n + F and Y = Q' S_n + Y', as
    (P [N, B, NH, K, K], F [N, B, NH, K, V], Q' [N, B, NH, C, K], Y' [N, B, NH, C, V]). Guarded,
    the triangular products run over finite values and a token that had a non-finite one
    poisons its output, those after it and the state (see _guarded_spans).

    With T = (I - ab)^{-1} (unit lower-triangular, in at least fp32), the pseudo-values are
    U = W S_n + U', W = T diag(exp(b_{r-1})) A and U' = T ak V; then Q' = diag(exp(b)) Q + qb W,
    Y' = qk V + qb U', P = diag(exp(b_C)) + (diag(exp(b_C - b)) B)^T W and F =
    (diag(exp(b_C - b)) K)^T V + (diag(exp(b_C - b)) B)^T U'.
    """
    poison = None
    if guard:
        k_c, poison = _finite_rows(k_c)
        v_c, poison_v = _finite_rows(v_c)
        a_c, poison_a = _finite_rows(a_c)
        b_c, poison_b = _finite_rows(b_c)
        poison = poison + poison_v + poison_a + poison_b
        decay = g_c.detach().exp()
        g_c = torch.where(torch.isfinite(decay), g_c, 0.0)
        poison = poison + (decay * 0).sum(-1)
    qk, qb, ak, ab, from_start, before, to_end = _dplr_scores(q_c, k_c, a_c, b_c, g_c)

    solve_dtype = torch.promote_types(q_c.dtype, torch.float32)
    minus_ab = -ab.to(solve_dtype)
    t_inv = _unit_lower_inverse(minus_ab.detach())  # (I - ab)^{-1}
    if minus_ab.requires_grad:
        # d(I + L)^{-1} = -T dL T: attach that gradient (the added term is exactly zero)
        t_inv = t_inv - _bmm(t_inv, _bmm(minus_ab - minus_ab.detach(), t_inv))
    w = _bmm(t_inv, (a_c * before).to(solve_dtype)).to(q_c.dtype)  # [N, B, NH, C, K]
    u = _bmm(t_inv, _bmm(ak, v_c).to(solve_dtype)).to(q_c.dtype)  # [N, B, NH, C, V]

    q_eff = _bmm(qb, w, add=q_c * from_start)
    y_own = _bmm(qb, u, add=_bmm(qk, v_c))
    b_to_end = (b_c * to_end).transpose(-1, -2)
    p = _bmm(b_to_end, w, add=torch.diag_embed(from_start[..., -1, :]))
    f = _bmm(b_to_end, u, add=_bmm((k_c * to_end).transpose(-1, -2), v_c))
    if poison is not None:
        y_own = y_own + torch.cumsum(poison, -1).unsqueeze(-1)
        f = f + poison.sum(-1)[..., None, None]
    return p, f, q_eff, y_own


def _dplr_span(q_c, k_c, v_c, g_c, a_c, b_c, state, kept, guard):
    """The diagonal-plus-low-rank recurrence on one span of chunks: q_c, k_c, a_c, b_c, g_c
    [N, B, NH, C, K], v_c [N, B, NH, C, V]. Returns ([o [N, B, NH, C, V]], state after the
    span); appends the states entering each chunk to kept if given."""
    p, f, q_eff, y_own = _dplr_maps(q_c, k_c, v_c, g_c, a_c, b_c, guard)
    n_chunks, batch, heads, d_k, d_v = f.shape
    flat = batch * heads
    p_n = p.reshape(n_chunks, flat, d_k, d_k).unbind(0)
    f_n = f.reshape(n_chunks, flat, d_k, d_v).unbind(0)
    tracked = _needs_grad(state, p, f)

    def next_state(n, state, out):
        return torch.baddbmm(f_n[n], p_n[n], state, out=out)

    states_in, state = _chain(state.reshape(flat, d_k, d_v), n_chunks, next_state, tracked)
    states_in = states_in.reshape(n_chunks, batch, heads, d_k, d_v)
    if kept is not None:
        kept.append([states_in])
    return [_bmm(q_eff, states_in, add=y_own)], state.reshape(batch, heads, d_k, d_v)


def _dplr_grads_span(q_c, k_c, v_c, g_c, a_c, b_c, do_c, states_in, d_state, gate_grad):
    """Gradients of the diagonal-plus-low-rank recurrence on one span of chunks, from the states
    entering each chunk S_n, the output gradient do_c and the gradient d_state of the state
    leaving the span. Returns ([dq, dk, dv, dg (None unless gate_grad), da, db], the gradient
    of the state entering the span).

    The chunk maps (P, F, Q', Y') are made again under autograd; the state's gradient runs
    from the last chunk, D_n = P^T D_{n+1} + Q'^T dO, and gives dP = D_{n+1} S_n^T, dF =
    D_{n+1}, dQ' = dO S_n^T and dY' = dO, which autograd takes back to the inputs.
    """
    wanted = [q_c, k_c, v_c, g_c, a_c, b_c]
    with torch.enable_grad():
        leaves = [x.detach().requires_grad_() for x in wanted]
        p, f, q_eff, y_own = _dplr_maps(*leaves, False)
    n_chunks, batch, heads, d_k, d_v = f.shape
    flat = batch * heads
    local = _bmm(q_eff.detach().transpose(-1, -2), do_c)  # Q'^T dO
    local_n = local.reshape(n_chunks, flat, d_k, d_v).unbind(0)
    p_t_n = p.detach().reshape(n_chunks, flat, d_k, d_k).transpose(-1, -2).unbind(0)

    def next_grad(n, d_next, out):
        return torch.baddbmm(local_n[n], p_t_n[n], d_next, out=out)

    d_next, d_state = _chain(
        d_state.reshape(flat, d_k, d_v), n_chunks, next_grad, False, reverse=True
    )
    d_next = d_next.reshape(n_chunks, batch, heads, d_k, d_v)
    d_p = _bmm(d_next, states_in.transpose(-1, -2))
    d_q_eff = _bmm(do_c, states_in.transpose(-1, -2))
    if not gate_grad:
        leaves[3] = None
    inputs = [x for x in leaves if x is not None]
    grads = iter(torch.autograd.grad((p, f, q_eff, y_own), inputs, (d_p, d_next, d_q_eff, do_c)))
    return [None if x is None else next(grads) for x in leaves], d_state.reshape(
        batch, heads, d_k, d_v
    )


def chunk_dplr(q, k, v, a, b, gk=None, initial_state=None, chunk_size=64):
    """Chunked S_t = (diag(exp(gk_t)) + b_t a_t^T) S_{t-1} + k_t v_t^T, o_t = q_t S_t.

    a, b: [B, NH, T, K]; gk: the log-gate [B, NH, T, K] or [B, NH, T, 1] (one per token, for
    every channel), None: no decay. Returns (o, final state).
    """
    gk = torch.zeros_like(k) if gk is None else gk.expand_as(k)
    # the own backward remakes each span's chunk maps and differentiates them with
    # torch.autograd.grad, which a compiled graph cannot trace: there autograd goes through
    # the chunked form itself
    if _needs_grad(q, k, v, a, b, gk, initial_state) and not torch.compiler.is_compiling():
        return _OwnBackward.apply(
            _dplr_span, _dplr_grads_span, 3, chunk_size, initial_state, q, k, v, gk, a, b
        )
    seqs = [q, k, v, gk, a, b]
    (o,), state, _ = _guarded_spans(_dplr_span, seqs, initial_state, chunk_size)
    return o, state
