"""Kernel of the full elementwise gate: S_t = exp(g_t) ⊙ S_{t-1} + k_t v_t^T, o_t = q_t S_t, with
a log-gate g_t [K, V] per token on every entry of the state (Mamba-1's selective scan: g_t the
outer product of dt_t and A; a vector state read entry by entry: one key channel). The
derivation is in docs/algorithms.md, section "Full elementwise gates".

chunk_elementwise runs the chunked form. Inside a chunk every token's state from a zero state
comes from the recurrence run one position at a time for all the chunks of a span at once, and
beside it the decay from the chunk's start exp(b_i) = a_1 ⊙ ... ⊙ a_i, a running product of
factors exp(g) <= 1 (never exp(-b)). A chunk's states then meet the state entering it,
exp(b_i) ⊙ S_0, and the chunks pass the state sequentially.

Every token's state is made, so the kernel's cost is the passes over them (on CPU it is bound
by memory, not arithmetic): the decays (the gate's product and its exp), the writes, the scan
with its running product, the entering state's term, the readout; seven passes in all. Without
autograd each pass writes in place into two span-sized buffers allocated once per call (a
freshly allocated tensor of a few MiB costs the OS's page faults on every touch) and the
readout goes straight into the output. Under autograd the forward runs so too, keeping the
inputs and the state entering each span, and the backward makes each span's states again under
autograd from its entering state, one span at a time (_elementwise_grads): the recurrence runs
once under autograd, not twice as with checkpoints (which remain for a double backward).

Uses the layout of common.py, and imports only torch and common, so the generated module can
hold a copy of its source (see kernel_source in this package).
"""

import torch

from mixc.backends.pytorch.kernels.common import _chain, _chunk_size_for, _needs_grad
from mixc.backends.pytorch.kernels.operators import _opaque_call


def _by_chunk(x, chunk_size, n_pad):
    """[B, NH, T, ...] -> [N, C, B, NH, ...]: chunk, then position inside it (so N and C
    flatten to token order), zero-padded to whole chunks (a zero token leaves the state
    unchanged: no write, a log-gate of 0); one contiguous copy (a small input: a vector per
    token). An input constant in time (a T axis of 1) becomes [1, 1, B, NH, ...]."""
    if x.shape[2] == 1:
        return x.movedim(2, 0).unsqueeze(0).contiguous()
    if n_pad:
        x = torch.nn.functional.pad(x, [0, 0] * (x.dim() - 3) + [0, n_pad])
    x = x.reshape(*x.shape[:2], -1, chunk_size, *x.shape[3:])
    return x.permute(2, 3, 0, 1, *range(4, x.dim())).contiguous()


def _buffers(shape, like):
    """The buffers of _span_in_place for spans of shape [n, C, B, NH, K, V] (like: a tensor of
    the dtype and device), with their views, made once for every span: (decays, writes,
    entering [n, 1, B, NH, K, V], each position of decays and of writes [C of n, B, NH, K, V],
    each chunk's last position of both and each slot of entering [n of B, NH, K, V])."""
    decays, writes = like.new_empty(shape), like.new_empty(shape)
    entering = like.new_empty(shape[0], 1, *shape[2:])
    a, w = decays.unbind(1), writes.unbind(1)
    return (
        decays,
        writes,
        entering,
        a,
        w,
        a[-1].unbind(0),
        w[-1].unbind(0),
        entering[:, 0].unbind(0),
    )


def _span_in_place(q, k, v, g, g_scale, state, buffers, out, end):
    """One span without autograd: q [n, C, B, NH, 1, K] (a row), k [n, C, B, NH, K, 1] (a
    column), v [n, C, B, NH, 1, V], g and g_scale broadcastable to [n, C, B, NH, K, V] (g_scale
    may be None), all in _by_chunk's layout, from the state entering the span; buffers from
    _buffers, overwritten; the outputs q_i S_i go into out [n, C, B, NH, 1, V] (None: not
    read out). Returns the state after the span's token `end` (its last, or the sequence's
    last before padding). A span of one chunk (n = 1) starts its recurrence from the state
    itself, so it needs no decay from the chunk's start: its decays keep each token's a_i."""
    decays, writes, entering, a, w, decay, last, slots = buffers
    if g_scale is None:
        torch.exp(g.expand_as(decays), out=decays)
    else:
        torch.exp_(torch.mul(g.expand_as(decays), g_scale, out=decays))
    torch.mul(k, v, out=writes)  # k_i v_i^T
    slots[0].copy_(state)
    if len(slots) == 1:
        w[0].addcmul_(a[0], entering[:, 0])
    for i in range(1, len(w)):  # one position of every chunk at a time
        w[i].addcmul_(a[i], w[i - 1])  # the state from the chunk's start, from zero
        if len(slots) > 1:
            a[i].mul_(a[i - 1])  # the decay from the chunk's start
    if len(slots) > 1:
        # the state entering each chunk: S_0 of the next = exp(b_C) ⊙ S_0 + the chunk's last
        for n in range(1, len(slots)):
            torch.addcmul(last[n - 1], decay[n - 1], slots[n - 1], out=slots[n])
        writes.addcmul_(decays, entering)  # every token's state
    if out is not None:
        torch.matmul(q, writes, out=out)
    return writes[divmod(end, len(w))].clone()


def _span_tracked(q, k, v, g, g_scale, state, shape, end):
    """_span_in_place's recurrence for autograd, shape = [n, C, B, NH, K, V]: new tensors, one
    position at a time, and the readout of each position as it comes (every token's state is
    never stacked). Returns (o [n, C, B, NH, 1, V], the state after the span's token `end`)."""
    gate = g if g_scale is None else g * g_scale
    w = (k * v).expand(shape).unbind(1)
    a = torch.exp(gate.expand(shape)).unbind(1)
    local, from_start = [w[0]], [a[0]]
    for i in range(1, len(w)):
        local.append(torch.addcmul(w[i], a[i], local[-1]))
        from_start.append(a[i] * from_start[-1])
    entering, _ = _chain(
        state,
        shape[0],
        lambda n, s, slot: torch.addcmul(local[-1][n], from_start[-1][n], s),
        True,
    )
    chunk, position = divmod(end, len(w))
    state = torch.addcmul(local[position][chunk], from_start[position][chunk], entering[chunk])
    queries = q.expand(*shape[:-2], 1, shape[-2]).unbind(1)
    o = [
        torch.matmul(qi, torch.addcmul(li, fi, entering))
        for qi, li, fi in zip(queries, local, from_start)
    ]
    return torch.stack(o, 1), state


def _span_chunks(q, v, chunk_size):
    """Chunks per span: about 2^17 state entries on CPU (the span's buffers stay in a core's
    cache; on one thread 2^17 measured 1.1-1.2x faster than 2^16 and 2^18), 2^24 elsewhere;
    never the whole sequence's states at once."""
    budget = (1 << 17) if q.device.type == "cpu" else (1 << 24)
    per_token = q.shape[0] * q.shape[1] * q.shape[-1] * v.shape[-1]
    return max(1, budget // (per_token * chunk_size))


def chunk_elementwise(q, k, v, g, g_scale=None, initial_state=None, chunk_size=64):
    """Chunked S_t = exp(g_t) ⊙ S_{t-1} + k_t v_t^T, o_t = q_t S_t.

    q, k: [B, NH, T, K], v: [B, NH, T, V]; g: log-gates (<= 0) broadcastable to
    [B, NH, T, K, V] (a T axis of 1: constant in time), times g_scale (broadcastable alike) when
    given: a per-token vector times a per-head matrix stays two small tensors, multiplied a span
    at a time. initial_state
    [B, NH, K, V] or None (zeros). Returns (o [B, NH, T, V], final state).
    """
    tensors = [q, k, v, g, g_scale, initial_state]
    return _opaque_call(_elementwise, tensors, chunk_size, _elementwise_grads)


def _plan(q, v, chunk_size):
    """How _elementwise cuts a sequence: (the chunk size, the spans' count, the padding tokens
    after the sequence (every span whole), the spans' shape [n, C, B, NH, K, V], the position
    in its span of the token each span's state leaves after: its last, the last span's the
    sequence's last, so that the padding after it, where an input constant in time is not zero,
    is never read back)."""
    batch, heads, length = q.shape[:3]
    chunk_size = _chunk_size_for(chunk_size, length)
    per_span = min(_span_chunks(q, v, chunk_size), -(-length // chunk_size))
    n_spans = -(-length // (per_span * chunk_size))
    n_pad = n_spans * per_span * chunk_size - length
    shape = (per_span, chunk_size, batch, heads, q.shape[-1], v.shape[-1])
    span_tokens = per_span * chunk_size
    ends = [span_tokens - 1] * (n_spans - 1) + [span_tokens - 1 - n_pad]
    return chunk_size, n_spans, n_pad, shape, ends


def _span_pieces(tensors, chunk_size, n_pad, n_spans):
    """For each span, its (q a row, k a column, v a row of each token's matrices, g, g_scale),
    from tensors [q, k, v, g, g_scale], in _by_chunk's layout; split, not indexed: under
    autograd the backward of a split is one concatenation, of an index a zero-filled gradient
    of the whole tensor per span; an input constant in time is the same for every span."""
    q, k, v, g, g_scale = tensors

    def spans(x):
        if x is None:
            return [None] * n_spans
        x = _by_chunk(x, chunk_size, n_pad)
        return [x] * n_spans if x.shape[0] == 1 else list(x.split(x.shape[0] // n_spans))

    rows = (q.unsqueeze(-2), k.unsqueeze(-1), v.unsqueeze(-2), g, g_scale)
    return [list(p) for p in zip(*(spans(x) for x in rows))]


def _elementwise(q, k, v, g, g_scale, initial_state, chunk_size, kept=None):
    """chunk_elementwise: under autograd its spans checkpointed, else in place, appending to kept
    (a list; None: nothing kept) what _elementwise_grads needs: the state entering each span
    [spans, B, NH, K, V]."""
    batch, heads, length = q.shape[:3]
    state = initial_state
    if state is None:
        state = q.new_zeros(batch, heads, q.shape[-1], v.shape[-1])
    if length == 0:
        if kept is not None:
            kept.append(state.new_empty(0, *state.shape))
        return q.new_zeros(batch, heads, 0, v.shape[-1]), state
    chunk_size, n_spans, n_pad, shape, ends = _plan(q, v, chunk_size)
    pieces = _span_pieces([q, k, v, g, g_scale], chunk_size, n_pad, n_spans)
    if _needs_grad(q, k, v, g, g_scale, state):
        outs = []
        for inputs, end in zip(pieces, ends):
            # the span's states are made again in the backward, one span at a time
            o, state = torch.utils.checkpoint.checkpoint(
                _span_tracked, *inputs, state, shape, end, use_reentrant=False
            )
            outs.append(o)
        out = outs[0] if len(outs) == 1 else torch.cat(outs)
    else:
        buffers, entering = _buffers(shape, q), []
        out = q.new_empty(n_spans * shape[0], *shape[1:4], 1, v.shape[-1])
        for inputs, o, end in zip(pieces, out.split(shape[0]), ends):
            entering.append(state)
            state = _span_in_place(*inputs, state, buffers, o, end)
        if kept is not None:
            kept.append(torch.stack(entering))
    # [N, C, B, NH, 1, V] -> [B, NH, T, V], a view of a [T, B, NH, V] tensor
    return out.flatten(0, 1).squeeze(-2).permute(1, 2, 0, 3)[:, :, :length], state


def _sum_to(x, like):
    """x summed over the axes along which `like` (a tensor of as many axes) is broadcast."""
    axes = [i for i, (n, m) in enumerate(zip(x.shape, like.shape)) if m == 1 and n != 1]
    return x.sum(axes, keepdim=True) if axes else x


def _span_grads(q, k, v, g, g_scale, state, d_out, d_state, end, buffers):
    """The gradients of one span's inputs (as _span_in_place takes them, of their shapes) and of
    the state entering it, without autograd, for d_out [n, C, B, NH, 1, V] the gradient of its
    outputs and d_state that of the state after its token `end`. The span's states S_t are made
    again in place (_span_in_place); then G_t, the gradient of S_t, runs back as the states ran
    forward: G_t = q_t^T do_t + a_{t+1} ⊙ G_{t+1} (a = exp(g ⊙ g_scale), d_state added at
    `end`), one position of every chunk at a time from a zero gradient at each chunk's end, and
    the gradient leaving each chunk, from the last, added with its decay a_{t+1} ... a_C. Then
    dq_t = do_t S_t^T, dk_t = G_t v_t^T, dv_t = k_t^T G_t and the log-gate's a_t ⊙ S_{t-1} ⊙ G_t.
    buffers: _buffers', then two more of the span's shape."""
    decays, states, entering = buffers[:3]
    grads, tails = buffers[-2:]
    _span_in_place(q, k, v, g, g_scale, state, buffers[:-2], None, end)
    several = entering.shape[0] > 1  # else the decays hold each a_t already
    if several:
        gate = g.expand_as(decays)
        gate = gate if g_scale is None else torch.mul(gate, g_scale, out=decays)
        torch.exp(gate, out=decays)  # a_t
    torch.mul(q.mT, d_out, out=grads)  # q_t^T do_t
    grads[divmod(end, grads.shape[1])] += d_state
    a, gs, rs = decays.unbind(1), grads.unbind(1), tails.unbind(1)
    rs[-1].fill_(1)
    for i in range(len(gs) - 2, -1, -1):  # from each chunk's end, from zero
        gs[i].addcmul_(a[i + 1], gs[i + 1])
        if several:
            torch.mul(rs[i + 1], a[i + 1], out=rs[i])  # a_{i+1} ... a_C
    if several:
        # the gradient of the state leaving each chunk, from the later ones; the span's last: 0
        leaving = torch.zeros_like(entering[:, 0])
        for n in range(len(leaving) - 1, 0, -1):
            leaving[n - 1] = a[0][n] * torch.addcmul(gs[0][n], rs[0][n], leaving[n])
        grads.addcmul_(tails, leaving.unsqueeze(1))  # G_t
    d_start = a[0][0] * gs[0][0]
    # a_t ⊙ S_{t-1} ⊙ G_t, S_{t-1} the state before each token (entering its chunk at the first)
    d_gate = torch.mul(grads, decays, out=tails)
    d_gate[:, 1:].mul_(states[:, :-1])
    d_gate[:, :1].mul_(entering)
    d_g = d_gate.clone() if g_scale is None else d_gate * g_scale  # not the reused buffer
    d_scale = None if g_scale is None else _sum_to(d_gate * g, g_scale)
    found = (d_out @ states.mT, grads @ v.mT, k.mT @ grads, d_g)
    return [*(_sum_to(d, x) for d, x in zip(found, (q, k, v, g))), d_scale], d_start


def _elementwise_grads(tensors, chunk_size, kept, d_outs, wanted):
    """The gradients of _elementwise's tensors [q, k, v, g, g_scale, initial_state] (None where
    not wanted) for those of its outputs d_outs (o, final state; None: zero), from the states
    entering each span its forward kept: span by span from the last (_span_grads), passing the
    gradient of the state entering each to the span before; the spans' inputs are made under
    autograd, and their gradients go back to the tensors in one call."""
    (entering,), (d_o, d_state), q, v = kept, d_outs, tensors[0], tensors[2]
    if d_state is None:
        d_state = q.new_zeros(*q.shape[:2], q.shape[-1], v.shape[-1])
    if q.shape[2] == 0:
        return [None] * 5 + [d_state if wanted[5] else None]
    if d_o is None:
        d_o = q.new_zeros(*q.shape[:3], v.shape[-1])
    chunk_size, n_spans, n_pad, shape, ends = _plan(q, v, chunk_size)
    d_out = _by_chunk(d_o.unsqueeze(-2), chunk_size, n_pad).split(shape[0])
    buffers = [*_buffers(shape, q), q.new_empty(shape), q.new_empty(shape)]
    with torch.enable_grad():
        leaves = [
            None if x is None else x.detach().requires_grad_(w) for x, w in zip(tensors, wanted)
        ]
        pieces = _span_pieces(leaves[:5], chunk_size, n_pad, n_spans)
        roots, root_grads = [], []
        for i in range(n_spans - 1, -1, -1):
            inputs = [None if x is None else x.detach() for x in pieces[i]]
            found, d_state = _span_grads(*inputs, entering[i], d_out[i], d_state, ends[i], buffers)
            for x, d in zip(pieces[i], found):
                if x is not None and x.requires_grad:
                    roots.append(x)
                    root_grads.append(d)
        wrt = [x for x in leaves[:5] if x is not None and x.requires_grad]
        found = iter(torch.autograd.grad(roots, wrt, root_grads, allow_unused=True) if wrt else ())
    grads = [next(found) if x is not None and x.requires_grad else None for x in leaves[:5]]
    return [*grads, d_state if wanted[5] else None]
