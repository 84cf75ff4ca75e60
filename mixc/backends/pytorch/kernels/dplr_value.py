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
    s0 = initial_state.mT  # S = M^T [B, NH, V, K], a key-side state of chunk_dplr
    # pass 1: u_t = a_t^T S_{t-1}, chunk_dplr's output at token t - 1 for the query a_t
    a_next = torch.cat([a[:, :, 1:], torch.zeros_like(a[:, :, :1])], 2)
    read, state = chunk_dplr(a_next, k, v, a, k, gk, s0, chunk_size, gk_min)
    u = torch.cat([torch.matmul(a[:, :, :1], s0), read[:, :, :-1]], 2)
    # pass 2: M_t = M_{t-1} diag(exp(gk_t)) + (v_t + u_t) k_t^T, read along q
    gv = None if gk is None else gk.expand_as(k)
    o, _ = chunk_diagonal(q, v + u, k, gv=gv, initial_state=initial_state, chunk_size=chunk_size)
    return o, state.mT
