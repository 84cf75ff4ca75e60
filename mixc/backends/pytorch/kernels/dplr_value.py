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

Imports only torch and the two kernels' files, so the generated module can hold a copy of its
source (see kernel_source in this package).
"""

import torch

from mixc.backends.pytorch.kernels.common import (
    _as_3d,
    _bmm,
    _chain,
    _needs_grad,
    _over_spans,
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
    if _fusable(q, k, v, a, gk, initial_state):
        fused = _value_fused(q, k, v, a, gk, initial_state, chunk_size)
        # None: a chunk decays too much for one pass; a non-finite input reaches the final
        # state, a value that overflows inside a chunk the outputs: then the two passes, guarded
        if fused is not None and all(bool(torch.isfinite(x.sum())) for x in fused):
            return fused
    s0 = initial_state.mT  # S = M^T [B, NH, V, K], a key-side state of chunk_dplr
    # pass 1: u_t = a_t^T S_{t-1}, chunk_dplr's output at token t - 1 for the query a_t
    a_next = torch.cat([a[:, :, 1:], torch.zeros_like(a[:, :, :1])], 2)
    read, state = chunk_dplr(a_next, k, v, a, k, gk, s0, chunk_size, gk_min)
    u = torch.cat([torch.matmul(a[:, :, :1], s0), read[:, :, :-1]], 2)
    # pass 2: M_t = M_{t-1} diag(exp(gk_t)) + (v_t + u_t) k_t^T, read along q
    gv = None if gk is None else gk.expand_as(k)
    o, _ = chunk_diagonal(q, v + u, k, gv=gv, initial_state=initial_state, chunk_size=chunk_size)
    return o, state.mT


def _fusable(*tensors):
    """Whether the one-pass form runs: without autograd (the two passes have their backwards),
    on CPU (its unguarded run is checked by the final state, which a device would wait for)
    and outside a compiled graph (which calls the two kernels' operators)."""
    if _needs_grad(*tensors) or tensors[0].device.type != "cpu":
        return False
    return not torch.compiler.is_compiling()


def _value_fused(q, k, v, a, gk, initial_state, chunk_size):
    """chunk_dplr_value's two passes in one, unguarded and without autograd, where every chunk's
    total decay is at least 2^-30 in every channel: (o, final state M), or None where a chunk
    decays more (`_value_span`). What the two passes compute and this does not: the first's
    outputs (its queries are the a's one token early, whose reads are its own pseudo-values)
    and the second's state passing (the first passes the same states)."""
    g = torch.zeros_like(k) if gk is None else gk.expand_as(k)
    fits = [True]

    def span(q_c, k_c, v_c, g_c, a_c, state):
        if fits[0]:
            fits[0], outs = _value_span(q_c, k_c, v_c, g_c, a_c, state)
            if fits[0]:
                return outs
        return [q_c.new_zeros(*q_c.shape[:-1], k_c.shape[-1])], state  # the rest is skipped

    (o,), state = _over_spans(span, [q, k, v, g, a], initial_state.mT, chunk_size)
    return (o, state.mT) if fits[0] else None


def _value_states(state, cols, w, writes, chunk_decay):
    """The states entering each chunk of a span [N, B, NH, V, K] and the state after it, from
    the state entering it [B, NH, V, K]: S_{n+1} = P S_n + F, P = diag(exp(b_C)) + (exp(b_C - b)
    ⊙ K)^T W, F = (exp(b_C - b) ⊙ K)^T (V + U') (the rank-one term along the write's own key:
    chunk_dplr's two kinds of columns are one), in place, one matmul per chunk."""
    n_chunks, batch, heads, _, d_v = cols.shape
    d_k = writes.shape[-1]
    to_end = cols.transpose(-1, -2)
    moves = _bmm(to_end, w)  # P [N, B, NH, V, V]
    torch.diagonal(moves, dim1=-2, dim2=-1).add_(chunk_decay.squeeze(-2))
    moves_n = moves.reshape(n_chunks, batch * heads, d_v, d_v).unbind(0)
    states = writes.new_empty(n_chunks + 1, batch * heads, d_v, d_k)
    torch.bmm(_as_3d(to_end), _as_3d(writes), out=states[1:].view(-1, d_v, d_k))

    def next_state(n, state, out):
        return torch.baddbmm(out, moves_n[n], state, out=out)

    states_in, state = _chain(state.reshape(-1, d_v, d_k), n_chunks, next_state, False, out=states)
    return states_in.view(n_chunks, batch, heads, d_v, d_k), state.view(batch, heads, d_v, d_k)


def _value_direct(a_c, k_c, g_c):
    """The rank-one term's scores of a span of chunks [N, B, NH, C, d]: ak [N, B, NH, C, C],
    a_r . (exp(b_{r-1} - b_j) ⊙ k_j) for j < r and 0 elsewhere (b = cumsum(g) per channel),
    each pair's decay split at the chunk's start into exp(b_{r-1}) and 1 / exp(b_j), one
    matmul a chunk; with the chunk's rows exp(b_{r-1}) ⊙ A, its columns exp(b_C - b) ⊙ K,
    exp(b_C) [N, B, NH, 1, d] and exp(b) [N, B, NH, C, d]. The split needs every chunk's
    total decay at least 2^-30 in every channel, so that both factors lie within [2^-30,
    2^30] (checked on the data, as this runs without autograd on CPU; the bound is written
    out, since a generated module copies functions, not constants): None where one decays
    more."""
    lead, chunk_size, d = a_c.shape[:3], a_c.shape[3], a_c.shape[-1]
    # exp(b_0) = 1, exp(b_1), ..., exp(b_C): running products of the decays
    from_start = a_c.new_empty(*lead, chunk_size + 1, d)
    from_start[..., 0, :] = 1
    torch.cumprod(g_c.exp(), dim=3, out=from_start[..., 1:, :])
    totals = from_start[..., -1:, :]
    if not bool(totals.min() >= 2.0**-30):  # NaN too
        return None
    decay = from_start[..., 1:, :]
    rows = a_c * from_start[..., :-1, :]  # exp(b_{r-1}) ⊙ A
    cols = k_c / decay  # exp(-b) ⊙ K
    scores = _bmm(rows, cols.transpose(-1, -2)).tril_(-1)
    return scores, rows, cols.mul_(totals), totals, decay


def _value_span(q_c, k_c, v_c, g_c, a_c, state):
    """The value-side recurrence on one span of chunks, on S = M^T (state [B, NH, V, K]): q_c,
    v_c [N, B, NH, C, K]; k_c, a_c, g_c [N, B, NH, C, V]. Returns (True, ([o [N, B, NH, C, V]],
    the state S after the span)), or (False, None) where a chunk decays too much for
    _value_direct. As chunk_dplr on S (its queries none, b = k, so that its a-against-k and
    a-against-b scores are one matrix ak): T = (I - ak)^{-1}, W = T (exp(b_{r-1}) ⊙ A), U' =
    T ak V, the states entering each chunk S_n and the pseudo-values u = W S_n + U'; then, as
    chunk_diagonal with value-side gates on M_t = M_{t-1} diag(exp(g_t)) + (v_t + u_t) k_t^T,
    the pairs inside each chunk, (tril(Q (V + U)^T) (exp(-b) ⊙ K)) ⊙ exp(b), and the states
    entering each chunk read along q, (Q S_n^T) ⊙ exp(b)."""
    direct = _value_direct(a_c, k_c, g_c)
    if direct is None:
        return False, None
    ak, rows, cols, chunk_decay, decay = direct
    solve_dtype = torch.promote_types(q_c.dtype, torch.float32)
    t_inv = _unit_lower_inverse(-ak.to(solve_dtype)).to(q_c.dtype)
    w = _bmm(t_inv, rows)
    u_own = _bmm(t_inv, _bmm(ak, v_c), add=v_c)  # v + U'
    states_in, state = _value_states(state, cols, w, u_own, chunk_decay)
    keys = _bmm(w, states_in, add=u_own)  # v + u, the second part's keys
    scores = _bmm(q_c, keys.transpose(-1, -2)).tril_()
    out = _bmm(scores, k_c / decay, add=_bmm(q_c, states_in.transpose(-1, -2)))
    return True, ([out.mul_(decay)], state)
