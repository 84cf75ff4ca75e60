"""Pure-PyTorch chunked kernels for linear-attention-style mixers.

The code generator copies the source text of these functions verbatim into
standalone modules, so this file imports only ``torch``; every kernel is a top-level function
(or, for a kernel's own backward, a torch.autograd.Function) and ``DEPENDS`` names the helpers
each public kernel needs.

Layout (the caller transposes into it):
    q, k: [B, NH, T, K]      v: [B, NH, T, V]
    g, beta: [B, NH, T]      gk: [B, NH, T, K]      gv: [B, NH, T, V]
    state S: [B, NH, K, V] with S_t = G_t(S_{t-1}) + k_t v_t^T and o_t = q_t S_t.
All gates are log-gates (g = log a <= 0). Kernels compute in the dtype of their
inputs (the caller upcasts bf16/fp16 to fp32); the triangular inverse of
``chunk_delta`` runs in at least fp32. Formula references ("Class 1", ...)
point at ALGORITHMS.md.

Every kernel runs its chunks in spans (consecutive whole chunks) and passes the
state from span to span. Inside a span all chunks are batched: the intra-chunk
matmuls of every chunk are one batched matmul, and only the state passing is
sequential (one step per chunk). Chunks are laid out chunk-major, [N, B, NH, C, ...],
so that the tensors of one chunk (and the states entering each chunk) are contiguous:
without autograd the sequential steps write their results in place. On CPU a span
holds about 2 MiB per input, so its temporaries stay in cache and are recycled by the
C allocator instead of being mapped fresh from the OS on every call; on other devices
one span holds the whole sequence.

Under autograd the scalar-decay, delta and diagonal kernels run as one torch.autograd.Function
(_OwnBackward) with their own backward (span by span from the last, from what their forward kept: the
masked scores, the states entering each chunk and the delta rule's T; a fraction of what
autograd through the chunked form would keep); only value-side diagonal gates go through
autograd.

Inside a chunk, b_r = g_1 + ... + g_r and Gamma_ij = exp(b_i - b_j) for i >= j.
Numerical rules followed throughout: decays are products of per-token factors
exp(g) <= 1 (so nothing overflows), exp(b_i - b_j) is never split into
exp(b_i) * exp(-b_j), and every mask is applied after the values it masks are
finite (above the diagonal a decay is an empty product, 1): no inf * 0 = NaN,
forward or backward.
"""

import torch

# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def _check_chunk_size(chunk_size):
    """Reject chunk sizes that are not positive powers of two."""
    if chunk_size < 1 or (chunk_size & (chunk_size - 1)) != 0:
        raise ValueError(f"chunk_size must be a positive power of two, got {chunk_size}")


def _needs_grad(*tensors):
    """Whether autograd records operations on these tensors (None entries ignored): the
    in-place paths of the kernels are taken only when it does not."""
    return torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in tensors)


def _split_chunks(x, chunk_size, n_pad=0):
    """[B, NH, T, ...] -> chunk-major [N, B, NH, chunk_size, ...], N = (T + n_pad) / chunk_size,
    zero-padded at the end by n_pad tokens (None stays None).

    One contiguous copy, so batched matmuls need no hidden copies and each chunk is
    contiguous. An input constant in time (stride 0 on T, as a broadcast per-head constant
    is) stays a broadcast view when no padding is needed: every chunk is the same.
    """
    if x is None:
        return None
    if n_pad == 0 and x.stride(2) == 0:
        first = x[:, :, :chunk_size].unsqueeze(0)
        return first.expand(x.shape[2] // chunk_size, *first.shape[1:])
    # [B, T, NH, ...]: the callers' layout, of which their inputs are transposed views; split
    # there, so that under autograd the gradient is copied straight into that layout
    x = x.transpose(1, 2)
    if n_pad:
        # pad lists (left, right) pairs starting from the last dim
        x = torch.nn.functional.pad(x, [0, 0] * (x.dim() - 2) + [0, n_pad])
    batch, length, heads = x.shape[:3]
    chunks = x.reshape(batch, length // chunk_size, chunk_size, heads, *x.shape[3:])
    return chunks.permute(1, 0, 3, 2, *range(4, chunks.dim())).contiguous()


def _span_tokens(q, v, chunk_size):
    """Tokens per span: a whole number of chunks, about 2 MiB of [B, NH, span, K + V + C] fp32
    on CPU (cache-sized, and small enough that the C allocator recycles it); all of them
    elsewhere."""
    if q.device.type != "cpu":
        return max(q.shape[2], 1)
    per_chunk = q.shape[0] * q.shape[1] * (q.shape[-1] + v.shape[-1] + chunk_size) * chunk_size
    return max(1, (1 << 19) // per_chunk) * chunk_size


def _over_spans(span_fn, seqs, carry, chunk_size, reverse=False):
    """Run span_fn(*chunks, carry) -> (outputs, carry) over consecutive spans of whole chunks of
    every tensor in seqs = [q, k, v, ...] ([B, NH, T, ...]; None stays None), passing the carry
    from span to span, first to last (reverse: last to first), and join each output over the
    spans. A carry of None starts from zeros [B, NH, K, V] (a zero state).

    span_fn gets its inputs chunk-major, [N, B, NH, C, ...], zero-padded to whole chunks (a
    zero token leaves the state unchanged: k = v = 0, and every gate 0), and returns a list
    of chunk-major outputs [N, B, NH, C, d] (None entries stay None). Without autograd each
    span's inputs are copied into the chunk layout as the span comes (cache-sized temporaries
    the C allocator recycles) and its outputs are copied into one tensor each; with autograd
    each input is copied into the chunk layout once and split into spans, and the outputs
    are concatenated (each backward is then one copy per input).

    Returns (the joined outputs, each [B, NH, T, d] as a view of a [B, T, NH, d] tensor, the
    callers' layout, so that their transpose back is contiguous; the final carry).
    """
    _check_chunk_size(chunk_size)
    q, v = seqs[0], seqs[2]
    batch, heads, length = q.shape[:3]
    if carry is None:
        carry = q.new_zeros(batch, heads, q.shape[-1], v.shape[-1])
    n_chunks = -(-length // chunk_size)
    n_pad = n_chunks * chunk_size - length
    per_span = _span_tokens(q, v, chunk_size) // chunk_size
    starts = range(0, n_chunks, per_span)

    def span_inputs(n):
        """The inputs of the span starting at chunk n, copied into the chunk layout."""
        tokens = slice(n * chunk_size, (n + per_span) * chunk_size)
        pad = n_pad if n + per_span >= n_chunks else 0
        return [
            None if x is None else _split_chunks(x[:, :, tokens], chunk_size, pad) for x in seqs
        ]

    if _needs_grad(*seqs, carry):
        whole = [_split_chunks(x, chunk_size, n_pad) for x in seqs]
        spans = list(
            zip(*[[None] * len(starts) if x is None else x.split(per_span) for x in whole])
        )
    else:
        spans = [None] * len(starts)
    order = range(len(starts) - 1, -1, -1) if reverse else range(len(starts))
    pieces, joined = {}, None
    for i in order:
        n = starts[i]
        outs, carry = span_fn(*(spans[i] or span_inputs(n)), carry)
        if any(o is not None and o.requires_grad for o in outs):
            pieces[i] = [None if o is None else o.permute(1, 0, 3, 2, 4) for o in outs]
            continue
        if joined is None:
            joined = [
                None if o is None else o.new_empty(batch, n_chunks, chunk_size, heads, o.shape[-1])
                for o in outs
            ]
        for whole_out, o in zip(joined, outs):
            if o is not None:
                whole_out[:, n : n + o.shape[0]].copy_(o.permute(1, 0, 3, 2, 4))
    if pieces:
        parts = zip(*[pieces[i] for i in sorted(pieces)])
        joined = [None if p[0] is None else torch.cat(p, dim=1) for p in parts]

    def unchunked(x):
        return x.reshape(batch, n_chunks * chunk_size, heads, -1)[:, :length].transpose(1, 2)

    return [None if x is None else unchunked(x) for x in joined], carry


def _chain(initial, n_steps, next_state, tracked, reverse=False):
    """The states of a sequential scan state_{n+1} = next_state(n, state_n, out), n < n_steps
    (reverse: state_n = next_state(n, state_{n+1}, out) from state_{n_steps} = initial, n from
    the last step to the first): (the state entering each step, stacked [n_steps, ...], and the
    final state).

    Without autograd (tracked False) every state is written in place (out = its slot of one
    buffer: no per-step allocation, no stacking copy); with autograd out is None and
    next_state returns a new tensor.
    """
    steps = range(n_steps - 1, -1, -1) if reverse else range(n_steps)
    if tracked:
        states = [initial]
        for n in steps:
            states.append(next_state(n, states[-1], None))
        if reverse:
            return torch.stack(states[-2::-1]), states[-1]
        return torch.stack(states[:-1]), states[-1]
    states = initial.new_empty(n_steps + 1, *initial.shape)
    slots = states.unbind(0)  # slot n holds the state between steps n - 1 and n
    slots[n_steps if reverse else 0].copy_(initial)
    for n in steps:
        if reverse:
            next_state(n, slots[n + 1], slots[n])
        else:
            next_state(n, slots[n], slots[n + 1])
    # the final state is copied out, so that holding it does not hold the whole buffer
    if reverse:
        return states[1:], slots[0].clone()
    return states[:-1], slots[-1].clone()


def _spans_keeping(span_fn, seqs, initial_state, chunk_size):
    """A kernel's forward over spans, keeping what its own backward needs: (o, final state, for
    each span the list span_fn(*chunks, state, kept) appended to kept)."""
    kept = []

    def span(*chunks_and_state):
        return span_fn(*chunks_and_state, kept)

    (o,), state = _over_spans(span, seqs, initial_state, chunk_size)
    return o, state, kept


def _spans_backward(
    span_fn, grads_fn, seqs, initial_state, kept, n_kept, chunk_size, d_o, d_state, gate_grad
):
    """A kernel's own backward over spans, from the last: grads_fn(*chunks, do_c, *the span's
    kept tensors, d_state, gate_grad) -> (gradients of seqs chunk-major, gradient of the state
    entering the span). kept: the tensors of _spans_keeping, n_kept of them for each span,
    span after span, flat. Returns (the gradients of seqs [B, NH, T, ...], the gradient of
    the initial state).

    When a graph of the backward is asked for (double backward), what was kept was made
    without one, so it is made again with it.
    """
    if torch.is_grad_enabled():
        kept = [
            x for own in _spans_keeping(span_fn, seqs, initial_state, chunk_size)[2] for x in own
        ]

    def span(*args):
        # the spans run from the last, so the tensors kept of each are the last ones left
        own = kept[len(kept) - n_kept :]
        del kept[len(kept) - n_kept :]
        return grads_fn(*args[:-1], *own, args[-1], gate_grad)

    return _over_spans(span, [*seqs, d_o], d_state, chunk_size, reverse=True)


def _gate_grads(pairs, starts, ends, whole):
    """The gradient of a chunk's log-gates g_l [..., C, 1] from what each decay factor holding
    exp(g_l) passes on (its gradient times its value, d exp(g) = exp(g) dg): pairs [..., C, C]
    for the mask's entries Gamma_ij (i >= j), which hold g_l for j < l <= i; starts [..., C]
    for exp(b_i), holding g_l for l <= i; ends [..., C] for exp(b_C - b_j), holding g_l for
    j < l; whole [...] for exp(G), holding every g_l of the chunk. Each is a sum of the
    contributions themselves (no sum of q·dq - k·dk over the sequence, whose terms cancel), so
    a hard reset (g = -inf, every factor holding it 0) gets exactly 0.
    """
    size = pairs.shape[-1]
    ones = torch.ones(size, size, dtype=pairs.dtype, device=pairs.device)
    before, from_l = torch.triu(ones, diagonal=1), torch.tril(ones)  # [j < l], [i >= l]
    dg = (torch.matmul(pairs, before) * from_l).sum(-2)  # over j < l, then over i >= l
    dg = dg + torch.matmul(starts, from_l) + torch.matmul(ends, before) + whole.unsqueeze(-1)
    return dg.unsqueeze(-1)


def _decay_mask(g):
    """Gamma_ij = exp(b_i - b_j) for i >= j and 0 for i < j: [..., L] -> [..., L, L].

    Built as running products of the per-token decays a_l = exp(g_l) <= 1, Gamma_ij =
    a_{j+1} ... a_i: one exp per token instead of one per pair (an exp costs several
    multiplies), never exp(b_i) * exp(-b_j), and a relative error that grows with the number
    of factors (at most about L roundings), not with the size of b_i - b_j as the exp of a
    summed exponent does. Above the diagonal every factor is 1 (the product
    is finite, so masking after it makes no NaN, forward or backward) and a multiply by the
    causal mask zeroes it. A gate of -inf (a hard reset) is a factor 0. Gates that repeat
    along the leading axis (stride 0: a decay constant in time, see _split_chunks, or
    broadcast over the batch) give one mask, built once and broadcast.
    """
    if g.dim() > 1 and g.shape[0] > 1 and g.stride(0) == 0:
        return _decay_mask(g[:1]).expand(*g.shape, g.shape[-1])
    length = g.shape[-1]
    ones = torch.ones(length, length, dtype=g.dtype, device=g.device)
    # rows[..., l, j] = a_l where l > j, else 1; a running product down each column
    rows = torch.addcmul(torch.triu(ones), g.exp().unsqueeze(-1), torch.tril(ones, diagonal=-1))
    return torch.cumprod(rows, dim=-2) * torch.tril(ones)


def _chunk_decays(gamma, g):
    """(exp(b_i), exp(b_C - b_j)) [..., C] from the decay mask Gamma [..., C, C] and gates g.

    Gamma's last row is exp(b_C - b_j); its first column times exp(g_1) is exp(b_i): the
    same direct sums, no further cumulative sums (a product of factors <= 1).
    """
    return gamma[..., :, 0] * torch.exp(g[..., :1]), gamma[..., -1, :]


def _scan_states(initial_state, chunk_decay_k, chunk_decay_v, chunk_kv, reverse=False):
    """Sequential state passing S_{n+1} = dk_n[:, None] * S_n * dv_n[None, :] + KV_n (reverse:
    from the last chunk to the first, S_n = dk_n[:, None] * S_{n+1} * dv_n[None, :] + KV_n, as
    a state's gradient flows).

    chunk_decay_k: [N, B, NH, K] or None, chunk_decay_v: [N, B, NH, V] or None,
    chunk_kv: [N, B, NH, K, V]. Returns (states entering each chunk
    [N, B, NH, K, V], final state [B, NH, K, V]), as _scan_scalar.
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


def _scan_scalar(initial_state, chunk_g, chunk_kv, reverse=False):
    """State passing S_{n+1} = exp(G_n) S_n + KV_n over the N chunks of a span (reverse: from the
    last chunk to the first, S_n = exp(G_n) S_{n+1} + KV_n, as a state's gradient flows).

    chunk_g: [N, B, NH] log-decay of each whole chunk (None: no decay), chunk_kv:
    [N, B, NH, K, V]. Returns (states entering each chunk [N, B, NH, K, V], final state
    [B, NH, K, V]); in reverse, chunk n is entered by S_{n+1} and the final state is S_0.
    Without decay the states are a running sum, one matmul with a triangular matrix of ones;
    with decay, one fused multiply-add per chunk (on CPU faster than a matmul with N x N
    decay weights).
    """
    n_chunks = chunk_kv.shape[0]
    if chunk_g is None:
        kv = chunk_kv.reshape(n_chunks, -1)
        ones = torch.ones(n_chunks + 1, n_chunks, dtype=kv.dtype, device=kv.device)
        # row r sums the chunks before r (reverse: from r on), so one row, the last (reverse:
        # the first), sums all of them: the final state
        rows = torch.triu(ones) if reverse else torch.tril(ones, diagonal=-1)
        states = torch.addmm(initial_state.reshape(1, -1), rows, kv)
        # split, not indexing: under autograd its backward is one concatenation
        if reverse:
            final, states = states.split([1, n_chunks])
        else:
            states, final = states.split([n_chunks, 1])
        # the final state is copied out, as in _chain
        return states.reshape(chunk_kv.shape), final.reshape(initial_state.shape).clone()
    # unbind, not indexing (see _scan_states)
    decay, kv = chunk_g.exp()[..., None, None].unbind(0), chunk_kv.unbind(0)

    def next_state(n, state, out):
        return torch.addcmul(kv[n], decay[n], state, out=out)

    tracked = _needs_grad(initial_state, chunk_g, chunk_kv)
    return _chain(initial_state, n_chunks, next_state, tracked, reverse)


def _as_3d(x):
    """[..., m, k] -> [batch, m, k], a view where the leading dims allow (a transposed view of
    a chunk-major tensor does: torch.bmm then gets it as transposed, not copied)."""
    return x.reshape(-1, x.shape[-2], x.shape[-1])


def _bmm(a, b, add=None):
    """a @ b (+ add) for [..., m, k] and [..., k, n] with equal leading dims: one torch.bmm (or
    baddbmm) on 3-D views.

    Unlike torch.matmul on 5-D operands, a transposed view (k.transpose(-1, -2)) is passed
    to the BLAS as transposed, not copied first.
    """
    if add is None:
        out = torch.bmm(_as_3d(a), _as_3d(b))
    else:
        out = torch.baddbmm(_as_3d(add), _as_3d(a), _as_3d(b))
    return out.reshape(*a.shape[:-2], a.shape[-2], b.shape[-1])


def _two_matmuls(a, b, c, d):
    """a @ b + c @ d for [..., m, k] operands with equal leading dims: one batched matmul, then
    a second one accumulating in place into its fresh result (no separate add)."""
    out = torch.bmm(_as_3d(a), _as_3d(b))
    out.baddbmm_(_as_3d(c), _as_3d(d))
    return out.reshape(*a.shape[:-2], a.shape[-2], b.shape[-1])


class _OwnBackward(torch.autograd.Function):
    """A chunked kernel with its own backward, for every class that has one: span_fn(*chunks,
    state, kept) runs a span's forward and appends to kept what grads_fn(*chunks, do_c, *kept,
    d_state, gate_grad) needs for the span's gradients (_spans_keeping, _spans_backward). It
    keeps the inputs and those per-chunk tensors (two to three inputs' worth), where autograd
    through the chunked form keeps every intermediate. seqs[gate] is the log-gate whose
    gradient grads_fn computes only when asked for."""

    @staticmethod
    def forward(ctx, span_fn, grads_fn, gate, chunk_size, initial_state, *seqs):
        o, state, kept = _spans_keeping(span_fn, list(seqs), initial_state, chunk_size)
        ctx.save_for_backward(initial_state, *seqs, *[x for own in kept for x in own])
        ctx.fns, ctx.gate, ctx.chunk_size = (span_fn, grads_fn), gate, chunk_size
        ctx.n_seqs, ctx.n_kept = len(seqs), len(kept[0])
        return o, state

    @staticmethod
    def backward(ctx, d_o, d_state):
        initial_state, *saved = ctx.saved_tensors
        seqs, kept = saved[: ctx.n_seqs], saved[ctx.n_seqs :]
        grads, d_initial = _spans_backward(
            *ctx.fns,
            seqs,
            initial_state,
            kept,
            ctx.n_kept,
            ctx.chunk_size,
            d_o,
            d_state,
            ctx.needs_input_grad[5 + ctx.gate],
        )
        # gradients of per-token inputs ([B, NH, T]) come back as [B, NH, T, 1]
        grads = [None if d is None else d.reshape(x.shape) for d, x in zip(grads, seqs)]
        return None, None, None, None, d_initial if ctx.needs_input_grad[4] else None, *grads


# ---------------------------------------------------------------------------
# Class 1: identity / scalar decay
# ---------------------------------------------------------------------------


def _scalar_decays(k_c, g_c):
    """The scalar decays on a span of chunks (Class 1, and the gate of Class 3), g_c [N, B, NH,
    C] (None: no decay).

    Returns (Gamma, the decay mask [N, B, NH, C, C]; exp(b) and exp(b_C - b) [N, B, NH, C, 1];
    diag(exp(b_C - b)) K; G = b_C [N, B, NH]), every one None without decay but the keys,
    which are then k_c.
    """
    if g_c is None:
        return None, None, None, k_c, None
    gamma = _decay_mask(g_c)  # Gamma_ij = exp(b_i - b_j), 0 for i < j
    from_start, to_end = (x.unsqueeze(-1) for x in _chunk_decays(gamma, g_c))
    return gamma, from_start, to_end, k_c * to_end, g_c.sum(-1)


def _scalar_decay_span(q_c, k_c, v_c, g_c, state, kept=None):
    """Class 1 on one span of chunks: q_c, k_c [N, B, NH, C, K], v_c [N, B, NH, C, V], g_c
    [N, B, NH, C] or None. Returns ([o [N, B, NH, C, V]], state after the span); appends the
    masked scores Q K^T ⊙ Gamma and the states entering each chunk to kept if given."""
    gamma, from_start, _, k_to_end, chunk_g = _scalar_decays(k_c, g_c)
    scores = _bmm(q_c, k_c.transpose(-1, -2))  # [N, B, NH, C, C]
    # Class 1: S_C = exp(b_C) S_0 + (diag(exp(b_C - b)) K)^T V
    chunk_kv = _bmm(k_to_end.transpose(-1, -2), v_c)  # [N, B, NH, K, V]
    states_in, state = _scan_scalar(state, chunk_g, chunk_kv)
    # Class 1: Y = (Q K^T ⊙ Gamma) V + diag(exp(b)) Q S_0, the intra part for all chunks at once
    if gamma is None:
        scores, q_from_start = scores.tril_(), q_c
    else:
        scores, q_from_start = scores * gamma, q_c * from_start  # diag(exp(b)) Q
    if kept is not None:
        kept.append([scores, states_in])
    # intra part, then the inter part accumulated into it by the same matmul call
    return [_two_matmuls(scores, v_c, q_from_start, states_in)], state


def _scalar_decay_grads_span(q_c, k_c, v_c, g_c, do_c, probs, states_in, d_state, gate_grad):
    """Gradients of Class 1 on one span of chunks, from the forward's masked scores P = Q K^T ⊙
    Gamma [N, B, NH, C, C] and states entering each chunk [N, B, NH, K, V], the output
    gradient do_c [N, B, NH, C, V] and the gradient d_state of the state leaving the span.

    Returns ([dq, dk, dv, dg [N, B, NH, C, 1] (None unless gate_grad)], the gradient of the
    state entering the span). With A = Q K^T, P = A ⊙ Gamma, dA = (dO V^T) ⊙ Gamma, the
    states S_n entering each chunk and D_n = dL/dS_n, D_n = (diag(exp(b)) Q)^T dO_n +
    exp(G_n) D_{n+1}:
        dQ = dA K + diag(exp(b)) dO S_n^T      dK = dA^T Q + diag(exp(b_C - b)) V D_{n+1}^T
        dV = P^T dO + diag(exp(b_C - b)) K D_{n+1}
    and the gate's gradient from every decay factor (_gate_grads).
    """
    gamma, from_start, to_end, k_to_end, chunk_g = _scalar_decays(k_c, g_c)
    d_probs = _bmm(do_c, v_c.transpose(-1, -2))  # dP = dO V^T
    if gamma is None:
        d_scores, q_from_start, v_to_end, do_from_start = d_probs.tril_(), q_c, v_c, do_c
    else:
        d_scores, q_from_start = d_probs * gamma, q_c * from_start
        v_to_end, do_from_start = v_c * to_end, do_c * from_start
    local = _bmm(q_from_start.transpose(-1, -2), do_c)  # (diag(exp(b)) Q)^T dO [N, B, NH, K, V]
    d_next, d_state = _scan_scalar(d_state, chunk_g, local, reverse=True)  # D_{n+1}, D_0
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
        )
    dq = _bmm(d_scores, k_c, add=from_q)
    dk = _bmm(d_scores.transpose(-1, -2), q_c, add=from_k)
    return [dq, dk, dv, dg], d_state


def chunk_scalar_decay(q, k, v, g=None, initial_state=None, chunk_size=64):
    """Chunked S_t = exp(g_t) S_{t-1} + k_t v_t^T, o_t = q_t S_t (g=None: linear attention).

    Returns (o [B, NH, T, V], final state [B, NH, K, V]).
    """
    if _needs_grad(q, k, v, g, initial_state):
        return _OwnBackward.apply(
            _scalar_decay_span, _scalar_decay_grads_span, 3, chunk_size, initial_state, q, k, v, g
        )
    (o,), state = _over_spans(_scalar_decay_span, [q, k, v, g], initial_state, chunk_size)
    return o, state


def parallel_scalar_decay(q, k, v, g=None):
    """Quadratic form o = (Q K^T ⊙ L) V, L_ij = exp(B_i - B_j) for i >= j (g=None: L = causal mask).

    Returns o [B, NH, T, V] (the quadratic form keeps no state).
    """
    scores = torch.matmul(q, k.transpose(-1, -2))  # [B, NH, T, T]
    if g is None:
        scores = scores.tril_()
    else:
        # Class 1 dual form: L_ij = exp(B_i - B_j) for i >= j, the decay mask of one chunk of T
        decay = _decay_mask(g)
        scores = scores * decay
    return torch.matmul(scores, v)


# ---------------------------------------------------------------------------
# Class 2: diagonal (key-side / value-side / outer-product) gates
# ---------------------------------------------------------------------------


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


def _diagonal_span(q_c, k_c, v_c, gk_c, gv_c, state, kept=None):
    """Class 2 on one span of chunks: q_c, k_c [N, B, NH, C, K], v_c [N, B, NH, C, V], log-gates
    gk_c [N, B, NH, C, K] and gv_c [N, B, NH, C, V] (either None). Returns ([o [N, B, NH, C,
    V]], state after the span); without value-side gates, appends the decayed scores A and the
    states entering each chunk to kept if given.

    Inside a chunk, the pairs j < i are split by the aligned blocks of 2, 4, ..., C tokens:
    each pair belongs to exactly one block in which j is in the left half and i in the right
    half. For that block the decay exp(b_i - b_j) = exp(b_i - b_r) exp(b_r - b_j) is measured
    from the boundary r (the last token of the left half): q_i ⊙ exp(b_i - b_r) and
    k_j ⊙ exp(b_r - b_j), both factors <= 1, built as products of per-token decays inside
    the halves (never exp(b_i) exp(-b_j)); the block's scores are one batched matmul. The
    pairs i = j need no decay. The same factors at the chunk level carry the state.
    """
    chunk_size = q_c.shape[3]
    # per-level segment decays (see _double_decays); at block size 1: exp(g_i) and 1
    pre_k = None if gk_c is None else torch.exp(gk_c)
    pre_v = None if gv_c is None else torch.exp(gv_c)
    suf_k = suf_v = None

    # --- intra-chunk: the diagonal, then blocks of 2, 4, ..., C tokens -------------------
    diag = (q_c * k_c).sum(dim=-1)  # i = j: q_i . k_i  [N, B, NH, C]
    if pre_v is None:
        # one score matrix per chunk, filled block by block in place: A [N, B, NH, C, C]
        scores = torch.diag_embed(diag)
    else:
        out = diag.unsqueeze(-1) * v_c  # outputs from inside blocks of 1 token
    block = 1
    while block < chunk_size:
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

    # --- inter-chunk: the chunk-level factors are the last level's ---------------------
    # Class 2: S_C = diag(exp(bk_C)) S_0 diag(exp(bv_C)) + (K ⊙ exp(bk_C - bk))^T (V ⊙ exp(bv_C - bv))
    # and y_i += ((q_i ⊙ exp(bk_i)) S_0) ⊙ exp(bv_i)
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
    if pre_v is None:
        if kept is not None:
            kept.append([scores, states_in])
        # A V, then the inter part accumulated into it by the same matmul call
        o = _two_matmuls(scores, v_c, q_from_start, states_in)
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


def _diagonal_grads_span(q_c, k_c, v_c, gk_c, gv_c, do_c, scores, states_in, d_state, gate_grad):
    """Gradients of Class 2 without value-side gates (gv_c None) on one span of chunks, from the
    forward's decayed scores A [N, B, NH, C, C] and states entering each chunk S_n, the output
    gradient do_c and the gradient d_state of the state leaving the span.

    Returns ([dq, dk, dv, dgk (None unless gate_grad), None], the gradient of the state
    entering the span). dA = dO V^T on A's support, dV = A^T dO + diag(exp(bk_C - bk)) K
    D_{n+1}; the diagonal, then every level of the binary split of _diagonal_span, hands
    dA's corner blocks back to the decayed queries and keys of that level; the chunk level
    carries the state's gradient D_n = (Q ⊙ exp(bk))^T dO + diag(exp(bk_C)) D_{n+1}. The gate's
    gradient, per channel, sums what each decay factor holding exp(g_l) passes on (its
    gradient times its value): a right half's exp(b_i - b_r) holds g_l for the l <= i of that
    half, a left half's exp(b_r - b_j) the l > j of that half, and at the chunk level exp(b_i),
    exp(b_C - b_j) and exp(b_C) hold l <= i, l > j and every l.
    """
    chunk_size = q_c.shape[3]
    pre_k = None if gk_c is None else torch.exp(gk_c)
    suf_k = None
    d_scores = _bmm(do_c, v_c.transpose(-1, -2)).tril_()  # dA on A's support
    dq = k_c * torch.diagonal(d_scores, dim1=-2, dim2=-1).unsqueeze(-1)  # i = j
    dk = q_c * torch.diagonal(d_scores, dim1=-2, dim2=-1).unsqueeze(-1)
    dg = None if pre_k is None or not gate_grad else torch.zeros_like(q_c)
    block = 1
    while block < chunk_size:
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
    if gv is None and _needs_grad(q, k, v, gk, initial_state):
        return _OwnBackward.apply(
            _diagonal_span, _diagonal_grads_span, 3, chunk_size, initial_state, q, k, v, gk, None
        )
    (o,), state = _over_spans(_diagonal_span, [q, k, v, gk, gv], initial_state, chunk_size)
    return o, state


# ---------------------------------------------------------------------------
# Class 3: DeltaNet / Gated DeltaNet
# ---------------------------------------------------------------------------


def _pair_blocks(x, block):
    """The diagonal blocks of 2 * block rows and columns of x [..., C, C] as
    [..., C / (2 * block), 2 * block, 2 * block] (a view of x, writable)."""
    lead, size = x.shape[:-2], x.shape[-1]
    n_pairs = size // (2 * block)
    grid = x.reshape(*lead, n_pairs, 2 * block, n_pairs, 2 * block)
    return torch.diagonal(grid, dim1=-4, dim2=-2).movedim(-1, -3)


def _unit_lower_inverse(a):
    """(I + a)^{-1} for strictly lower-triangular a [..., C, C] (C a power of two), no autograd.

    The diagonal blocks of up to 4 x 4 first, all at once by the finite Neumann product
    (I + L)^{-1} = (I - L)(I + L^2) (L^4 = 0 for a strictly lower 4 x 4 block): two batched
    matmuls instead of two levels of 1 x 1 and 2 x 2 products. (Not larger blocks: with
    nearly parallel keys the powers of L grow and cancel; 8 x 8 blocks lose 10-30x in accuracy
    against the recursion, 4 x 4 blocks nothing measurable.) Then
    block recursion on the diagonal: the inverse of [[L11, 0], [L21, L22]] is
    [[X11, 0], [-X22 L21 X11, X22]], with X11, X22 the inverses of the halves; each level is
    batched matmuls over every block at once, writing its corner blocks in place.
    """
    size = a.shape[-1]
    base = min(size, 4)
    if base == 1:
        return torch.ones_like(a)
    inverse = torch.zeros_like(a)
    diagonal = _pair_blocks(inverse, base // 2)  # the base x base diagonal blocks (a view)
    minus_l = -_pair_blocks(a, base // 2)
    shape = minus_l.shape
    minus_l = minus_l.reshape(-1, base, base)
    x = minus_l + torch.eye(base, dtype=a.dtype, device=a.device)  # I - L
    power, step = minus_l, 1
    while 2 * step < base:
        power = torch.bmm(power, power)  # L^(2 step)
        x = torch.baddbmm(x, x, power)  # x (I + L^(2 step))
        step *= 2
    diagonal.copy_(x.reshape(shape))
    minus_a = -a
    block = base
    while block < size:
        blocks = _pair_blocks(inverse, block)
        upper, lower = blocks[..., :block, :block], blocks[..., block:, block:]  # X11, X22
        minus_lower_left = _pair_blocks(minus_a, block)[..., block:, :block]  # -L21
        blocks[..., block:, :block] = torch.matmul(torch.matmul(lower, minus_lower_left), upper)
        block *= 2
    return inverse


def _delta_span(q_c, k_c, v_c, beta_c, g_c, state, kept=None):
    """Class 3 on one span of chunks: q_c, k_c [N, B, NH, C, K], v_c [N, B, NH, C, V], beta_c
    and log-gates g_c [N, B, NH, C] (g_c None: no decay). Returns ([o [N, B, NH, C, V]], state
    after the span); appends the masked scores Q K^T ⊙ Gamma, T = (I + A)^{-1} and the states
    entering each chunk to kept if given."""
    n_chunks, batch, heads, chunk_size, d_k = q_c.shape
    d_v = v_c.shape[-1]

    gamma, from_start, _, k_to_end, chunk_g = _scalar_decays(k_c, g_c)
    kk = _bmm(k_c, k_c.transpose(-1, -2))  # K K^T [N, B, NH, C, C]
    scores = _bmm(q_c, k_c.transpose(-1, -2))  # Q K^T
    k_scaled = k_c * beta_c.unsqueeze(-1)  # diag(beta) K
    if gamma is None:
        scores = scores.tril_()  # M
        q_from_start = q_c
    else:
        kk = kk * gamma
        scores = scores * gamma
        k_scaled = k_scaled * from_start  # diag(beta exp(b)) K
        q_from_start = q_c * from_start

    # Class 3: A = tril(diag(beta) (K K^T ⊙ Gamma), -1), T = (I + A)^{-1} in >= fp32;
    # W = T diag(beta exp(b)) K, U = T V (v pre-scaled by beta)
    solve_dtype = torch.promote_types(q_c.dtype, torch.float32)
    a_strict = (beta_c.unsqueeze(-1) * kk).tril_(-1).to(solve_dtype)
    t_inv = _unit_lower_inverse(a_strict.detach())
    if a_strict.requires_grad:
        # d(I + A)^{-1} = -T dA T: attach that gradient (the value is unchanged, the added
        # term is exactly zero) instead of differentiating through the recursion
        t_inv = t_inv - _bmm(t_inv, _bmm(a_strict - a_strict.detach(), t_inv))
    w = _bmm(t_inv, k_scaled.to(solve_dtype)).to(q_c.dtype)  # [N, B, NH, C, K]
    u = _bmm(t_inv, v_c.to(solve_dtype)).to(q_c.dtype)  # [N, B, NH, C, V]

    # sequential part, two fused matmuls per chunk: V_new = U - W S_0,
    # S_C = exp(b_C) S_0 + (diag(exp(b_C - b)) K)^T V_new
    flat = batch * heads
    # per-chunk views by unbind, not indexing (see _scan_states)
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
    v_new = torch.stack(v_new) if tracked else u
    states_in = states_in.reshape(n_chunks, batch, heads, d_k, d_v)
    if kept is not None:
        kept.append([scores, t_inv, states_in])

    # Class 3: Y = diag(exp(b)) Q S_0 + (Q K^T ⊙ Gamma) V_new, all chunks at once
    o = _two_matmuls(scores, v_new.reshape(u.shape), q_from_start, states_in)
    return [o], state.reshape(batch, heads, d_k, d_v)


def _delta_grads_span(
    q_c, k_c, v_c, beta_c, g_c, do_c, scores, t_inv, states_in, d_state, gate_grad
):
    """Gradients of Class 3 on one span of chunks, from the forward's masked scores M = Q K^T ⊙
    Gamma, T = (I + A)^{-1} and states entering each chunk S_n, the output gradient do_c and
    the gradient d_state of the state leaving the span.

    Returns ([dq, dk, dv, dbeta, dg] (dbeta, dg [N, B, NH, C, 1]; dg None unless gate_grad),
    the gradient of the state entering the span). W = T diag(beta exp(b)) K, U = T V and
    V_new = U - W S_n are made again; D_n = dL/dS_n runs from the last chunk:
        dV_new = M^T dO + diag(exp(b_C - b)) K D_{n+1}
        D_n = (diag(exp(b)) Q)^T dO + exp(G_n) D_{n+1} - W^T dV_new
    then dU = dV_new, dW = -dV_new S_n^T, dT = dW (diag(beta exp(b)) K)^T + dU V^T and
    dA = -T^T dT T^T on A's strictly lower support (A_ij = beta_i (K K^T ⊙ Gamma)_ij); the
    gate's gradient from every decay factor (_gate_grads).
    """
    n_chunks, batch, heads, size, d_k = q_c.shape
    d_v = v_c.shape[-1]
    gamma, from_start, to_end, k_to_end, chunk_g = _scalar_decays(k_c, g_c)
    beta = beta_c.unsqueeze(-1)
    k_from_start = k_c if from_start is None else k_c * from_start  # diag(exp(b)) K
    k_scaled = k_from_start * beta
    q_from_start = q_c if from_start is None else q_c * from_start
    t_inv_t = t_inv.transpose(-1, -2)
    w = _bmm(t_inv, k_scaled)
    v_new = _bmm(t_inv, v_c) - _bmm(w, states_in)  # U - W S_n

    # the state's gradient, from the last chunk: dV_new written over M^T dO in place
    flat = batch * heads
    d_v_new = _bmm(scores.transpose(-1, -2), do_c)  # M^T dO [N, B, NH, C, V]
    local = _bmm(q_from_start.transpose(-1, -2), do_c)  # (diag(exp(b)) Q)^T dO
    x_n = d_v_new.reshape(n_chunks, flat, size, d_v).unbind(0)
    y_n = local.reshape(n_chunks, flat, d_k, d_v).unbind(0)
    w_t_n = w.reshape(n_chunks, flat, size, d_k).transpose(-1, -2).unbind(0)
    k_end_n = k_to_end.reshape(n_chunks, flat, size, d_k).unbind(0)
    decay_n = None if chunk_g is None else chunk_g.exp().reshape(n_chunks, flat, 1, 1).unbind(0)
    tracked = _needs_grad(d_state, do_c, q_c, k_c, v_c, beta_c, g_c, scores, t_inv, states_in)
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
    d_next = d_next.reshape(states_in.shape)

    d_scores = _bmm(do_c, v_new.transpose(-1, -2))  # dM = dO V_new^T
    d_qk = d_scores.tril_() if gamma is None else d_scores * gamma  # through the mask
    from_q = _bmm(do_c, states_in.transpose(-1, -2))  # dO S_n^T
    if from_start is not None:
        from_q = from_q * from_start
    dq = _bmm(d_qk, k_c, add=from_q)
    d_w = _bmm(d_v_new, states_in.transpose(-1, -2)).neg_()  # dW = -dV_new S_n^T
    d_k_scaled = _bmm(t_inv_t, d_w)
    dv = _bmm(t_inv_t, d_v_new)  # dU = dV_new
    d_t = _two_matmuls(d_w, k_scaled.transpose(-1, -2), d_v_new, v_c.transpose(-1, -2))
    d_a = _bmm(t_inv_t, _bmm(d_t, t_inv_t)).neg_().tril_(-1)  # -T^T dT T^T on A's support
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
    return [dq, dk, dv, dbeta.unsqueeze(-1), dg], d_state.reshape(batch, heads, d_k, d_v)


def chunk_delta(q, k, v, beta, g=None, initial_state=None, chunk_size=64):
    """Chunked S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + k_t v_t^T, o_t = q_t S_t.

    v is the already-scaled write value (beta * v); beta only enters the
    transition. g=None: plain DeltaNet. Returns (o, final state).
    """
    if _needs_grad(q, k, v, beta, g, initial_state):
        return _OwnBackward.apply(
            _delta_span, _delta_grads_span, 4, chunk_size, initial_state, q, k, v, beta, g
        )
    (o,), state = _over_spans(_delta_span, [q, k, v, beta, g], initial_state, chunk_size)
    return o, state


DEPENDS: dict[str, tuple[str, ...]] = {
    "chunk_scalar_decay": (
        "_check_chunk_size",
        "_needs_grad",
        "_span_tokens",
        "_over_spans",
        "_split_chunks",
        "_decay_mask",
        "_chunk_decays",
        "_as_3d",
        "_bmm",
        "_two_matmuls",
        "_chain",
        "_scan_scalar",
        "_scalar_decays",
        "_scalar_decay_span",
        "_scalar_decay_grads_span",
        "_gate_grads",
        "_spans_keeping",
        "_spans_backward",
        "_OwnBackward",
    ),
    "parallel_scalar_decay": ("_decay_mask",),
    "chunk_diagonal": (
        "_check_chunk_size",
        "_needs_grad",
        "_span_tokens",
        "_over_spans",
        "_split_chunks",
        "_as_3d",
        "_bmm",
        "_two_matmuls",
        "_halves",
        "_double_decays",
        "_decayed_halves",
        "_pair_blocks",
        "_chain",
        "_scan_states",
        "_diagonal_span",
        "_within",
        "_diagonal_grads_span",
        "_spans_keeping",
        "_spans_backward",
        "_OwnBackward",
    ),
    "chunk_delta": (
        "_check_chunk_size",
        "_needs_grad",
        "_span_tokens",
        "_over_spans",
        "_split_chunks",
        "_decay_mask",
        "_chunk_decays",
        "_scalar_decays",
        "_as_3d",
        "_bmm",
        "_two_matmuls",
        "_pair_blocks",
        "_unit_lower_inverse",
        "_chain",
        "_delta_span",
        "_delta_grads_span",
        "_gate_grads",
        "_spans_keeping",
        "_spans_backward",
        "_OwnBackward",
    ),
}
