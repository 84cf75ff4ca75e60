"""Kernels of the delta-rule class: S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + k_t v_t^T,
o_t = q_t S_t, with a write strength beta_t and an optional log-gate g_t per token and head
(g None: DeltaNet; with g: Gated DeltaNet) and v the write value already scaled by beta. The
derivation is in docs/algorithms.md, section "Delta rule".

chunk_delta runs the chunked form. Inside a chunk the rank-one corrections compose to the
triangular system T = (I + A)^{-1}, A = tril(diag(beta) (K K^T ⊙ Gamma), -1), which turns
the keys and values into W = T diag(beta exp(b)) K and U = T V; the state then passes from
chunk to chunk with two matmuls per chunk. T is computed in at least fp32, whatever the
inputs' dtype. Under autograd chunk_delta has its own backward (common._OwnBackward), keeping
the masked scores, T and the states entering each chunk.

Uses the layout and numerical rules of common.py, and imports only torch and common, so the
generated module can hold a copy of its source (see kernel_source in this package).
"""

import torch

from mixc.backends.pytorch.kernels.common import (
    _bmm,
    _chain,
    _finite_gates,
    _finite_rows,
    _finite_rows_,
    _gate_grads,
    _masked,
    _needs_grad,
    _poison_rows,
    _scalar_decays,
    _two_matmuls,
    _unit_lower_inverse,
)
from mixc.backends.pytorch.kernels.operators import _own_backward


def _delta_finite_inputs(k_c, v_c, beta_c, g_c):
    """The guard of a span's inputs (see _guarded_spans): (k, v, beta and g with their
    non-finite values set to 0, and the poison [N, B, NH, C]: 0, or NaN for a token that had
    one). Every product of the span is triangular over the tokens of a chunk (the inverse, W,
    U, the masked scores times V_new): they run over the finite values, and a token that had a
    non-finite one poisons its output and those after it, and through its write the state."""
    k_c, poison = _finite_rows(k_c)
    v_c, poison_v = _finite_rows(v_c)
    beta_c, poison_beta = _finite_rows(beta_c.unsqueeze(-1))
    beta_c, poison = beta_c.squeeze(-1), poison + poison_v + poison_beta
    if g_c is not None:
        g_c, poison_g = _finite_gates(g_c)
        poison = poison + poison_g
    return k_c, v_c, beta_c, g_c, poison


def _delta_solve(q_c, k_c, v_c, beta_c, g_c, poison, guard):
    """The intra-chunk WY solve on a span of chunks, all chunks at once: the decayed products,
    T = (I + A)^{-1} for A = tril(diag(beta) (K K^T ⊙ Gamma), -1) in at least fp32, whatever
    the inputs' dtype, and from it W = T diag(beta exp(b)) K and U = T V (v pre-scaled by beta).

    Returns (the masked scores M = Q K^T ⊙ Gamma, diag(exp(b)) Q, diag(exp(b_C - b)) K, the
    chunks' log-decays G = b_C [N, B, NH] (None: no decay), T, W [N, B, NH, C, K], U [N, B, NH,
    C, V]). A token's poison (None: unguarded) reaches the scores' rows from it on and the keys
    that write the state; guarded, a row of diag(beta exp(b)) K that overflows poisons too.
    """
    gamma, from_start, _, k_to_end, chunk_g = _scalar_decays(k_c, g_c)
    kk = _bmm(k_c, k_c.transpose(-1, -2))  # K K^T [N, B, NH, C, C]
    scores = _masked(_bmm(q_c, k_c.transpose(-1, -2)), gamma)  # M
    if poison is not None:
        scores = _poison_rows(scores, poison)
        k_to_end = k_to_end + poison.unsqueeze(-1)
    k_scaled = k_c * beta_c.unsqueeze(-1)  # diag(beta) K
    q_from_start = q_c
    if gamma is not None:
        kk = kk * gamma
        k_scaled = k_scaled * from_start  # diag(beta exp(b)) K
        q_from_start = q_c * from_start

    # A = tril(diag(beta) (K K^T ⊙ Gamma), -1), T = (I + A)^{-1} in >= fp32;
    # W = T diag(beta exp(b)) K, U = T V (v pre-scaled by beta)
    solve_dtype = torch.promote_types(q_c.dtype, torch.float32)
    a_strict = (beta_c.unsqueeze(-1) * kk).tril_(-1).to(solve_dtype)
    t_inv = _unit_lower_inverse(a_strict.detach())
    if a_strict.requires_grad:
        # d(I + A)^{-1} = -T dA T: attach that gradient (the value is unchanged, the added
        # term is exactly zero) instead of differentiating through the recursion
        t_inv = t_inv - _bmm(t_inv, _bmm(a_strict - a_strict.detach(), t_inv))
    if guard:  # finite inputs can overflow in a later token's row, which T would carry back
        k_scaled, poison_k = _finite_rows_(k_scaled)
        scores = _poison_rows(scores, poison_k)
    w = _bmm(t_inv, k_scaled.to(solve_dtype)).to(q_c.dtype)  # [N, B, NH, C, K]
    u = _bmm(t_inv, v_c.to(solve_dtype)).to(q_c.dtype)  # [N, B, NH, C, V]
    return scores, q_from_start, k_to_end, chunk_g, t_inv, w, u


def _delta_states(state, w, u, k_to_end, chunk_g):
    """The inter-chunk state pass over a span, from the state entering it [B, NH, K, V], two
    fused matmuls per chunk: V_new = U - W S_n, S_{n+1} = exp(G_n) S_n + (diag(exp(b_C - b))
    K)^T V_new. Returns (V_new [N, B, NH, C, V], written over U in place without autograd; the
    states entering each chunk [N, B, NH, K, V]; the state after the span)."""
    n_chunks, batch, heads, chunk_size, d_k = w.shape
    d_v = u.shape[-1]
    flat = batch * heads
    # per-chunk views by unbind, not indexing: under autograd its backward is one stack
    w_n = w.reshape(n_chunks, flat, chunk_size, d_k).unbind(0)
    u_n = u.reshape(n_chunks, flat, chunk_size, d_v).unbind(0)
    k_end_n = k_to_end.reshape(n_chunks, flat, chunk_size, d_k).transpose(-1, -2).unbind(0)
    decay_n = None if chunk_g is None else chunk_g.exp().reshape(n_chunks, flat, 1, 1).unbind(0)
    tracked = _needs_grad(state, w, u, k_to_end, chunk_g)
    v_new = []

    def next_state(n, state, out):
        # without autograd V_new overwrites U in place
        v = torch.baddbmm(u_n[n], w_n[n], state, alpha=-1.0, out=None if tracked else u_n[n])
        v_new.append(v)
        if decay_n is not None:
            state = decay_n[n] * state
        return torch.baddbmm(state, k_end_n[n], v, out=out)

    states_in, state = _chain(state.reshape(flat, d_k, d_v), n_chunks, next_state, tracked)
    v_new = (torch.stack(v_new) if tracked else u).reshape(u.shape)
    states_in = states_in.reshape(n_chunks, batch, heads, d_k, d_v)
    return v_new, states_in, state.reshape(batch, heads, d_k, d_v)


def _delta_span(q_c, k_c, v_c, beta_c, g_c, state, kept, guard):
    """The delta rule on one span of chunks: q_c, k_c [N, B, NH, C, K], v_c [N, B, NH, C, V],
    beta_c and log-gates g_c [N, B, NH, C] (g_c None: no decay); guarded against non-finite
    values of k, v, beta and g (see _guarded_spans). Returns ([o [N, B, NH, C, V]], state after
    the span); appends the masked scores Q K^T ⊙ Gamma, T = (I + A)^{-1} and the states
    entering each chunk to kept if given.

    The intra-chunk WY solve (_delta_solve) and the state pass (_delta_states) give V_new and
    the states, and the outputs are Y = diag(exp(b)) Q S_n + (Q K^T ⊙ Gamma) V_new.
    """
    poison = None
    if guard:
        k_c, v_c, beta_c, g_c, poison = _delta_finite_inputs(k_c, v_c, beta_c, g_c)
    solved = _delta_solve(q_c, k_c, v_c, beta_c, g_c, poison, guard)
    scores, q_from_start, k_to_end, chunk_g, t_inv, w, u = solved
    v_new, states_in, state = _delta_states(state, w, u, k_to_end, chunk_g)
    if guard:
        # finite inputs can still overflow in a token's pseudo-value (U = T V, V_new = U - W S):
        # made finite, it poisons its output and those after it, as a non-finite input does
        v_new, poison_new = _finite_rows_(v_new)
        scores = _poison_rows(scores, poison_new)
    if kept is not None:
        kept.append([scores, t_inv, states_in])

    # Y = diag(exp(b)) Q S_0 + (Q K^T ⊙ Gamma) V_new, all chunks at once
    o = _two_matmuls(scores, v_new, q_from_start, states_in)
    return [o], state


def _delta_state_grads(do_c, scores, q_from_start, w, k_to_end, chunk_g, d_state):
    """The gradients that run from the last chunk of a span to the first: dV_new and D_{n+1} for
    every chunk [N, B, NH, C, V] and [N, B, NH, K, V], and D_0 [B, NH, K, V], from the output
    gradient do_c, the masked scores M, diag(exp(b)) Q, W, diag(exp(b_C - b)) K, the chunks'
    log-decays G_n (None: no decay) and the gradient d_state of the state leaving the span:
        dV_new = M^T dO + diag(exp(b_C - b)) K D_{n+1}
        D_n = (diag(exp(b)) Q)^T dO + exp(G_n) D_{n+1} - W^T dV_new
    Without autograd dV_new is written over M^T dO in place.
    """
    n_chunks, batch, heads, size, d_k = w.shape
    d_v = do_c.shape[-1]
    flat = batch * heads
    d_v_new = _bmm(scores.transpose(-1, -2), do_c)  # M^T dO [N, B, NH, C, V]
    local = _bmm(q_from_start.transpose(-1, -2), do_c)  # (diag(exp(b)) Q)^T dO
    x_n = d_v_new.reshape(n_chunks, flat, size, d_v).unbind(0)
    y_n = local.reshape(n_chunks, flat, d_k, d_v).unbind(0)
    w_t_n = w.reshape(n_chunks, flat, size, d_k).transpose(-1, -2).unbind(0)
    k_end_n = k_to_end.reshape(n_chunks, flat, size, d_k).unbind(0)
    decay_n = None if chunk_g is None else chunk_g.exp().reshape(n_chunks, flat, 1, 1).unbind(0)
    tracked = _needs_grad(do_c, scores, q_from_start, w, k_to_end, chunk_g, d_state)
    d_v_news = []

    def next_state(n, d_next, out):
        dv = torch.baddbmm(x_n[n], k_end_n[n], d_next, out=None if tracked else x_n[n])
        d_v_news.append(dv)
        if decay_n is None:
            y = torch.add(y_n[n], d_next, out=out)  # Y_n + D_{n+1}
        else:
            y = torch.addcmul(y_n[n], decay_n[n], d_next, out=out)  # Y_n + exp(G_n) D_{n+1}
        return torch.baddbmm(y, w_t_n[n], dv, alpha=-1.0, out=out)

    d_next, d_state = _chain(
        d_state.reshape(flat, d_k, d_v), n_chunks, next_state, tracked, reverse=True
    )
    if tracked:
        d_v_new = torch.stack(d_v_news[::-1]).reshape(d_v_new.shape)
    d_next = d_next.reshape(n_chunks, batch, heads, d_k, d_v)
    return d_v_new, d_next, d_state.reshape(batch, heads, d_k, d_v)


def _delta_solve_grads(t_inv_t, k_scaled, v_c, states_in, d_v_new):
    """The gradients through V_new = U - W S_n, W = T diag(beta exp(b)) K and U = T V, from
    dV_new and T^T: (dV, the gradient of diag(beta exp(b)) K, dA on A's strictly lower support).

    dU = dV_new, dW = -dV_new S_n^T, dT = dW (diag(beta exp(b)) K)^T + dU V^T and, since
    d(I + A)^{-1} = -T dA T, dA = -T^T dT T^T.
    """
    d_w = _bmm(d_v_new, states_in.transpose(-1, -2)).neg_()  # dW = -dV_new S_n^T
    d_k_scaled = _bmm(t_inv_t, d_w)
    dv = _bmm(t_inv_t, d_v_new)  # dU = dV_new
    d_t = _two_matmuls(d_w, k_scaled.transpose(-1, -2), d_v_new, v_c.transpose(-1, -2))
    d_a = _bmm(t_inv_t, _bmm(d_t, t_inv_t)).neg_().tril_(-1)  # -T^T dT T^T on A's support
    return dv, d_k_scaled, d_a


def _delta_grads_span(
    q_c, k_c, v_c, beta_c, g_c, do_c, scores, t_inv, states_in, d_state, gate_grad
):
    """Gradients of the delta rule on one span of chunks, from the forward's masked scores
    M = Q K^T ⊙ Gamma, T = (I + A)^{-1} and states entering each chunk S_n, the output gradient
    do_c and the gradient d_state of the state leaving the span.

    Returns ([dq, dk, dv, dbeta, dg] (dbeta, dg [N, B, NH, C, 1]; dg None unless gate_grad),
    the gradient of the state entering the span). W = T diag(beta exp(b)) K, U = T V and
    V_new = U - W S_n are made again; D_n = dL/dS_n and dV_new run from the last chunk
    (_delta_state_grads), the gradients through T from dV_new (_delta_solve_grads), and those
    of A = tril(diag(beta) (K K^T ⊙ Gamma), -1) and of M go on to the queries, keys and beta;
    the gate's gradient from every decay factor (_gate_grads).
    """
    gamma, from_start, to_end, k_to_end, chunk_g = _scalar_decays(k_c, g_c)
    beta = beta_c.unsqueeze(-1)
    k_from_start = k_c if from_start is None else k_c * from_start  # diag(exp(b)) K
    k_scaled = k_from_start * beta
    q_from_start = q_c if from_start is None else q_c * from_start
    t_inv_t = t_inv.transpose(-1, -2)
    w = _bmm(t_inv, k_scaled)
    v_new = _bmm(t_inv, v_c) - _bmm(w, states_in)  # U - W S_n
    d_v_new, d_next, d_state = _delta_state_grads(
        do_c, scores, q_from_start, w, k_to_end, chunk_g, d_state
    )

    d_scores = _bmm(do_c, v_new.transpose(-1, -2))  # dM = dO V_new^T
    d_qk = _masked(d_scores, gamma)  # through the mask
    from_q = _bmm(do_c, states_in.transpose(-1, -2))  # dO S_n^T
    if from_start is not None:
        from_q = from_q * from_start
    dq = _bmm(d_qk, k_c, add=from_q)
    dv, d_k_scaled, d_a = _delta_solve_grads(t_inv_t, k_scaled, v_c, states_in, d_v_new)
    kk = _bmm(k_c, k_c.transpose(-1, -2))
    if gamma is not None:
        kk = kk * gamma
    d_kk = d_a * beta  # the gradient of K K^T ⊙ Gamma
    d_kk_raw = d_kk if gamma is None else d_kk * gamma
    from_k = _bmm(v_new, d_next.transpose(-1, -2))  # V_new D_{n+1}^T
    if to_end is not None:
        from_k = from_k * to_end
    d_k_from_start = d_k_scaled * beta
    if from_start is not None:
        d_k_from_start = d_k_from_start * from_start
    dk = _bmm(d_qk.transpose(-1, -2), q_c, add=from_k + d_k_from_start)
    dk = _bmm(d_kk_raw + d_kk_raw.transpose(-1, -2), k_c, add=dk)
    beta_in_w = (d_k_scaled * k_from_start).sum(-1)  # beta in diag(beta exp(b)) K
    dbeta = (d_a * kk).sum(-1) + beta_in_w
    dg = None
    if gate_grad:
        dg = _gate_grads(
            d_scores * scores + d_kk * kk,  # Gamma in M and in A
            (q_c * from_q).sum(-1) + beta_in_w * beta_c,  # exp(b_i) in Q and W
            (k_c * from_k).sum(-1),  # exp(b_C - b_j) in the state's writes
            (states_in * d_next).sum((-1, -2)) * chunk_g.exp(),  # <S_n, D_{n+1}> exp(G_n)
        )
    return [dq, dk, dv, dbeta.unsqueeze(-1), dg], d_state


def chunk_delta(q, k, v, beta, g=None, initial_state=None, chunk_size=64):
    """Chunked S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + k_t v_t^T, o_t = q_t S_t.

    v is the already-scaled write value (beta * v); beta only enters the
    transition. g=None: plain DeltaNet. Returns (o, final state).
    """
    seqs = [q, k, v, beta, g]
    return _own_backward(_delta_span, _delta_grads_span, 4, chunk_size, initial_state, seqs)
