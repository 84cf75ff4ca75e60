"""Kernel of the full elementwise gate: S_t = exp(g_t) ⊙ S_{t-1} + k_t v_t^T, o_t = q_t S_t, with
a log-gate g_t [K, V] per token on every entry of the state (Mamba-1's selective scan: g_t the
outer product of dt_t and A; a vector state read entry by entry: one key channel). The
derivation is in docs/algorithms.md, section "Full elementwise gates".

chunk_elementwise runs the chunked form. Inside a chunk every token's state (from a zero
state) comes from a log-depth scan over the chunk's tokens: at step s each token adds the
state s tokens back, decayed by the product of the s gates between them, and that product
doubles (a product of factors exp(g) <= 1, never exp(-b)). A chunk's states then meet the
state entering it, exp(b_i) ⊙ S_0, and the chunks pass the state sequentially. Only the states
of one span of chunks exist at a time; under autograd each span is checkpointed (its states
are made again in the backward), so what the backward keeps is the inputs and one state per
span.

Uses the layout of common.py, and imports only torch and common, so the generated module can
hold a copy of its source (see kernel_source in this package).
"""

import torch

from mixc.backends.pytorch.kernels.common import _chunk_size_for, _needs_grad


def _scan_chunks(writes, decays):
    """The scan x_i = a_i ⊙ x_{i-1} + w_i over the token positions i of every chunk at once,
    from x_0 = 0: writes and decays [C, N, B, NH, K, V] (position-major: the tensors of one
    position are contiguous). Returns (the states x_i, the decays from each chunk's start
    exp(b_i) = a_1 ⊙ ... ⊙ a_i), both [C, N, B, NH, K, V].

    One step per position, each on that position of every chunk of the span, without autograd
    in place (the caller's fresh tensors); exp(b_i) as a cumulative product of factors <= 1
    (never exp(-b)).
    """
    from_start = torch.cumprod(decays, 0)
    if not _needs_grad(writes, decays):
        for i in range(1, writes.shape[0]):
            writes[i].addcmul_(decays[i], writes[i - 1])
        return writes, from_start
    w, a = writes.unbind(0), decays.unbind(0)
    states = [w[0]]
    for i in range(1, len(w)):
        states.append(torch.addcmul(w[i], a[i], states[-1]))
    return torch.stack(states), from_start


def _elementwise_span(q, k, v, g, g_scale, state, chunk_size):
    """The recurrence on one span of chunks: q, k [B, NH, L, K], v [B, NH, L, V], the log-gate
    g (times g_scale, if given) broadcastable to [B, NH, L, K, V] (a T axis of 1: constant in
    time), from the state [B, NH, K, V] entering it; the last chunk is padded with tokens that
    leave the state unchanged (no write, a log-gate of 0). Returns (o [B, NH, L, V], the state
    after the span)."""
    batch, heads, length = q.shape[:3]
    n_chunks = -(-length // chunk_size)
    n_pad = n_chunks * chunk_size - length

    def positions(x):
        # [B, NH, L, ...] -> position-major [C, N, B, NH, ...], zero-padded (a copy of a small
        # input: the products of these copies come out position-major and contiguous)
        if x.shape[2] == 1 and length > 1:  # constant in time: broadcast
            return x.movedim(2, 0).unsqueeze(0)
        x = torch.nn.functional.pad(x, [0, 0] * (x.dim() - 3) + [0, n_pad])
        x = x.reshape(*x.shape[:2], n_chunks, chunk_size, *x.shape[3:])
        return x.permute(3, 2, 0, 1, *range(4, x.dim())).contiguous()

    gate = positions(g) if g_scale is None else positions(g) * positions(g_scale)
    shape = (chunk_size, n_chunks, batch, heads, k.shape[-1], v.shape[-1])
    decays = torch.exp(gate.expand(shape))
    writes = positions(k).unsqueeze(-1) * positions(v).unsqueeze(-2)  # k_i v_i^T
    local, from_start = _scan_chunks(writes, decays)
    entering = []
    for n in range(n_chunks):  # S_C = exp(b_C) ⊙ S_0 + (the chunk's own last state)
        entering.append(state)
        state = torch.addcmul(local[-1, n], from_start[-1, n], state)
    states_in = torch.stack(entering)  # [N, B, NH, K, V]
    if _needs_grad(local, from_start, states_in):
        states = torch.addcmul(local, from_start, states_in)  # every token's state
    else:
        states = local.addcmul_(from_start, states_in)
    o = torch.matmul(positions(q).unsqueeze(-2), states).squeeze(-2)  # q_i S_i [C, N, B, NH, V]
    o = o.permute(2, 3, 1, 0, 4).reshape(batch, heads, n_chunks * chunk_size, -1)
    return o[:, :, :length], state


def _span_length(q, v, chunk_size):
    """Tokens per span: whole chunks holding about 2^18 state entries on CPU (cache-sized, and
    recycled by the C allocator), 2^24 elsewhere; never the whole sequence's states at once."""
    budget = (1 << 18) if q.device.type == "cpu" else (1 << 24)
    per_token = q.shape[0] * q.shape[1] * q.shape[-1] * v.shape[-1]
    return max(1, budget // (per_token * chunk_size)) * chunk_size


def chunk_elementwise(q, k, v, g, g_scale=None, initial_state=None, chunk_size=64):
    """Chunked S_t = exp(g_t) ⊙ S_{t-1} + k_t v_t^T, o_t = q_t S_t.

    q, k: [B, NH, T, K], v: [B, NH, T, V]; g: log-gates (<= 0) broadcastable to
    [B, NH, T, K, V] (a T axis of 1: constant in time), times g_scale (broadcastable alike) when
    given: a per-token vector times a per-head matrix stays two small tensors, multiplied a span
    at a time. initial_state
    [B, NH, K, V] or None (zeros). Returns (o [B, NH, T, V], final state).
    """
    batch, heads, length = q.shape[:3]
    chunk_size = _chunk_size_for(chunk_size, length)
    state = initial_state
    if state is None:
        state = q.new_zeros(batch, heads, q.shape[-1], v.shape[-1])
    if length == 0:
        return q.new_zeros(batch, heads, 0, v.shape[-1]), state
    span = _span_length(q, v, chunk_size)
    tracked = _needs_grad(q, k, v, g, g_scale, state)
    n_spans = -(-length // span)

    def spans(x):
        # split, not indexed: under autograd the backward of a split is one concatenation, of
        # an index a zero-filled gradient of the whole tensor per span; a gate constant in time
        # (T axis of size 1) is the same for every span
        if x is None or (x.shape[2] == 1 and length > 1):
            return [x] * n_spans
        return x.split(span, dim=2)

    outs = []
    for pieces in zip(*(spans(x) for x in (q, k, v, g, g_scale))):
        if tracked:
            # the span's states are made again in the backward, one span at a time
            o, state = torch.utils.checkpoint.checkpoint(
                _elementwise_span, *pieces, state, chunk_size, use_reentrant=False
            )
        else:
            o, state = _elementwise_span(*pieces, state, chunk_size)
        outs.append(o)
    return (outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)), state
