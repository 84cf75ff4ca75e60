"""What the chunked kernels of every transition class share: the layout, the spans, the batched
matmuls, the decay masks and their gradients, and the autograd Function of the own backwards.

The code generator copies the source text of the definitions a module needs (see
``kernel_source`` in this package) into the generated file, which imports only ``torch``: so this
file imports only ``torch``, and everything in it is a top-level function or, for the own
backwards, a torch.autograd.Function. An input that is not a tensor is a _Turned (functions.py),
which splits itself.

Layout (the caller transposes into it):
    q, k: [B, NH, T, K]      v: [B, NH, T, V]
    g, beta: [B, NH, T]      gk: [B, NH, T, K]      gv: [B, NH, T, V]
    state S: [B, NH, K, V] with S_t = G_t(S_{t-1}) + k_t v_t^T and o_t = q_t S_t.
All gates are log-gates (g = log a <= 0). Kernels compute in the dtype of their inputs (the
caller upcasts bf16/fp16 to fp32).

Every kernel runs its chunks in spans (consecutive whole chunks) and passes the state from span
to span. Inside a span all chunks are batched: the intra-chunk matmuls of every chunk are one
batched matmul, and only the state passing is sequential (one step per chunk). Chunks are laid
out chunk-major, [N, B, NH, C, ...], so that the tensors of one chunk (and the states entering
each chunk) are contiguous: without autograd the sequential steps write their results in place.
On CPU a span holds about 2 MiB per input, so its temporaries stay in cache and are recycled by
the C allocator instead of being mapped fresh from the OS on every call; on other devices one
span holds the whole sequence.

Under autograd a kernel with its own backward runs as one torch.autograd.Function
(_OwnBackward): span by span from the last, from what its forward kept (a fraction of what
autograd through the chunked form would keep). Which kernels have one, and what they keep, is
said in their own files.

Inside a chunk, b_r = g_1 + ... + g_r and Gamma_ij = exp(b_i - b_j) for i >= j. Numerical rules
followed throughout: decays are products of per-token factors exp(g) <= 1 (so nothing
overflows), exp(b_i - b_j) is never split into exp(b_i) * exp(-b_j) (but where a proven lower
bound of the gate keeps a chunk's total decay at least 2^-30, and both factors within [2^-30,
2^30]: chunk_dplr's gk_min), and a mask selects
instead of multiplying by 0 (above the diagonal a decay is an empty product, 1, and a score
there holds a later token, whose inf times 0 would be NaN). No output depends on a later token,
bit for bit, whatever the later token holds: see _guarded_spans for non-finite inputs.
"""

import torch


def _chunk_size_for(chunk_size, length):
    """The chunk size to run a sequence of `length` tokens with: chunk_size, a positive power of
    two, capped at the least power of two >= length. A longer chunk would only pad the sequence
    with zero tokens, its C x C temporaries growing with the request instead of the sequence."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
        raise ValueError(f"chunk_size must be an int, got {type(chunk_size).__name__}")
    if chunk_size < 1 or (chunk_size & (chunk_size - 1)) != 0:
        raise ValueError(f"chunk_size must be a positive power of two, got {chunk_size}")
    return min(chunk_size, 1 << max(length - 1, 0).bit_length())


def _fresh_copy(x):
    """x as a new tensor with the strides of a new contiguous one, as the fakes give (an
    operator's outputs may alias neither its inputs nor each other)."""
    return torch.empty(x.shape, dtype=x.dtype, device=x.device).copy_(x)


def _needs_grad(*tensors):
    """Whether autograd records operations on these tensors (None entries ignored): the
    in-place paths of the kernels are taken only when it does not."""
    return torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in tensors)


def _split_chunks(x, chunk_size, n_pad=0, view=False):
    """[B, NH, T, ...] -> chunk-major [N, B, NH, chunk_size, ...], N = (T + n_pad) / chunk_size,
    zero-padded at the end by n_pad tokens (None stays None).

    One contiguous copy, so batched matmuls need no hidden copies and each chunk is
    contiguous; with `view` and no padding, a strided view of x instead (for an input only
    read elementwise, whose first elementwise operation is then the copy). An input constant
    in time (stride 0 on T, as a broadcast per-head constant is) stays a broadcast view when
    no padding is needed: every chunk is the same.
    """
    if x is None:
        return None
    if not isinstance(x, torch.Tensor):  # a _Turned (a rotated q or k) splits itself
        return x.chunks(chunk_size, n_pad)
    if n_pad == 0 and x.stride(2) == 0:
        first = x[:, :, :chunk_size].unsqueeze(0)
        return first.expand(x.shape[2] // chunk_size, *first.shape[1:])
    if n_pad == 0 and view:
        batch, heads, length = x.shape[:3]
        chunks = x.reshape(batch, heads, length // chunk_size, chunk_size, *x.shape[3:])
        return chunks.movedim(2, 0)
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
    elsewhere (every chunk, the last one padded: a sequence shorter than a chunk is one)."""
    if q.device.type != "cpu":
        return max(-(-q.shape[2] // chunk_size), 1) * chunk_size
    per_chunk = q.shape[0] * q.shape[1] * (q.shape[-1] + v.shape[-1] + chunk_size) * chunk_size
    return max(1, (1 << 19) // per_chunk) * chunk_size


def _span_inputs(seqs, chunk_size, n_chunks, first, per_span, strided):
    """The inputs of the span of per_span chunks starting at chunk `first`, each copied into the
    chunk layout (_split_chunks; those of `strided` may stay strided views), the last span
    zero-padded to whole chunks."""
    length = seqs[0].shape[2]
    tokens = slice(first * chunk_size, (first + per_span) * chunk_size)
    pad = n_chunks * chunk_size - length if first + per_span >= n_chunks else 0
    return [
        None if x is None else _split_chunks(x[:, :, tokens], chunk_size, pad, i in strided)
        for i, x in enumerate(seqs)
    ]


def _tracked_spans(seqs, chunk_size, n_chunks, per_span):
    """Under autograd, the inputs of every span: each input copied into the chunk layout once
    (so that its backward is one copy) and split into spans of per_span chunks, span by span."""
    n_pad = n_chunks * chunk_size - seqs[0].shape[2]
    whole = [_split_chunks(x, chunk_size, n_pad) for x in seqs]
    n_spans = -(-n_chunks // per_span)
    return list(zip(*[[None] * n_spans if x is None else x.split(per_span) for x in whole]))


def _join_span(joined, outs, first, lead):
    """Copy a span's untracked outputs (chunk-major [n, B, NH, C, d]) into the joined outputs
    [*lead, d], lead = [B, N, C, NH] (the callers' layout), from chunk `first` on; the first
    span to come allocates them (joined None). Returns the joined outputs."""
    if joined is None:
        joined = [None if o is None else o.new_empty(*lead, o.shape[-1]) for o in outs]
    for whole_out, o in zip(joined, outs):
        if o is not None:
            whole_out[:, first : first + o.shape[0]].copy_(o.permute(1, 0, 3, 2, 4))
    return joined


def _over_spans(span_fn, seqs, carry, chunk_size, reverse=False, strided=()):
    """Run span_fn(*chunks, carry) -> (outputs, carry) over consecutive spans of whole chunks of
    every tensor in seqs = [q, k, v, ...] ([B, NH, T, ...]; None stays None), passing the carry
    from span to span, first to last (reverse: last to first), and join each output over the
    spans. A carry of None starts from zeros [B, NH, K, V] (a zero state). `strided`: the
    indices in seqs of inputs span_fn only reads elementwise (never in place), which it may
    get as strided views instead of copies (_split_chunks).

    span_fn gets its inputs chunk-major, [N, B, NH, C, ...], zero-padded to whole chunks (a
    zero token leaves the state unchanged: k = v = 0, and every gate 0), and returns a list
    of chunk-major outputs [N, B, NH, C, d] (None entries stay None). Without autograd each
    span's inputs are copied into the chunk layout as the span comes (cache-sized temporaries
    the C allocator recycles, _span_inputs) and its outputs are copied into one tensor each
    (_join_span); with autograd each input is copied into the chunk layout once and split into
    spans (_tracked_spans), and the outputs are concatenated (each backward is then one copy
    per input).

    Returns (the joined outputs, each [B, NH, T, d] as a view of a [B, T, NH, d] tensor, the
    callers' layout, so that their transpose back is contiguous; the final carry).
    """
    q, v = seqs[0], seqs[2]
    batch, heads, length = q.shape[:3]
    chunk_size = _chunk_size_for(chunk_size, length)
    if carry is None:
        carry = q.new_zeros(batch, heads, q.shape[-1], v.shape[-1])
    n_chunks = -(-length // chunk_size)
    per_span = _span_tokens(q, v, chunk_size) // chunk_size
    starts = range(0, n_chunks, per_span)
    if _needs_grad(*seqs, carry):
        spans = _tracked_spans(seqs, chunk_size, n_chunks, per_span)
    else:
        spans = [None] * len(starts)
    order = range(len(starts) - 1, -1, -1) if reverse else range(len(starts))
    pieces, joined = {}, None
    for i in order:
        n = starts[i]
        inputs = spans[i] or _span_inputs(seqs, chunk_size, n_chunks, n, per_span, strided)
        outs, carry = span_fn(*inputs, carry)
        if any(o is not None and o.requires_grad for o in outs):
            pieces[i] = [None if o is None else o.permute(1, 0, 3, 2, 4) for o in outs]
        else:
            joined = _join_span(joined, outs, n, (batch, n_chunks, chunk_size, heads))
    if pieces:
        parts = zip(*[pieces[i] for i in sorted(pieces)])
        joined = [None if p[0] is None else torch.cat(p, dim=1) for p in parts]

    def unchunked(x):
        return x.reshape(batch, n_chunks * chunk_size, heads, -1)[:, :length].transpose(1, 2)

    return [None if x is None else unchunked(x) for x in joined], carry


def _chain(initial, n_steps, next_state, tracked, reverse=False, out=None):
    """The states of a sequential scan state_{n+1} = next_state(n, state_n, out), n < n_steps
    (reverse: state_n = next_state(n, state_{n+1}, out) from state_{n_steps} = initial, n from
    the last step to the first): (the state entering each step, stacked [n_steps, ...], and the
    final state).

    Without autograd (tracked False) every state is written in place (out = its slot of one
    buffer: no per-step allocation, no stacking copy); with autograd out is None and
    next_state returns a new tensor. The buffer [n_steps + 1, ...] may be given (untracked
    only), its slots holding what next_state adds onto in place; slot 0 (reverse: the last)
    gets initial.
    """
    steps = range(n_steps - 1, -1, -1) if reverse else range(n_steps)
    if tracked:
        states = [initial]
        for n in steps:
            states.append(next_state(n, states[-1], None))
        if reverse:
            return torch.stack(states[-2::-1]), states[-1]
        return torch.stack(states[:-1]), states[-1]
    states = initial.new_empty(n_steps + 1, *initial.shape) if out is None else out
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


def _guarded_spans(
    span_fn, seqs, carry, chunk_size, kept=None, guard=None, strided=(), reverse=False
):
    """A kernel's forward over spans, span_fn(*chunks, state, kept, guard) (kept: a list the
    spans append what an own backward needs to, or None): (the outputs of _over_spans, the final
    state, guard). strided, reverse (a kernel that runs backward in time, from the last span):
    as _over_spans takes them.

    Inside a chunk a later token meets the earlier ones in triangular products, where its inf or
    NaN would reach their outputs (0 * inf = NaN). Guarded, span_fn first makes the values those
    products read finite and poisons the outputs from such a token on (_finite_rows,
    _poison_rows): two passes over them, on CPU about a tenth of a linear attention forward. So
    with guard None, on CPU outside a compiled graph, the spans run unguarded and the final
    state is checked: a non-finite key, value, beta or gate always reaches it (inf * 0 and
    NaN * 0 are NaN, and every later step scales it or adds to it), so a finite one means there
    was none; only otherwise do they run again, guarded. Elsewhere they always run guarded: the
    check would wait for the device or break the graph, and there the passes cost little.
    """

    def run(guarded):
        if kept is not None:
            kept.clear()

        def span(*chunks_and_state):
            return span_fn(*chunks_and_state, kept, guarded)

        return _over_spans(span, seqs, carry, chunk_size, reverse, strided)

    if guard is None:
        if seqs[0].device.type == "cpu" and not torch.compiler.is_compiling():
            outs, state = run(False)
            # the sum is finite if every entry is (a sum that overflows only costs a guarded run)
            if bool(torch.isfinite(state.detach().sum())):
                return outs, state, False
        guard = True
    outs, state = run(guard)
    return outs, state, guard


def _spans_keeping(span_fn, seqs, initial_state, chunk_size, guard=None, reverse=False):
    """A kernel's forward over spans (_guarded_spans), keeping what its own backward needs: (o,
    final state, for each span the list span_fn(*chunks, state, kept, guard) appended to kept,
    in the order the spans ran, guard)."""
    kept = []
    (o,), state, guard = _guarded_spans(
        span_fn, seqs, initial_state, chunk_size, kept, guard, reverse=reverse
    )
    return o, state, kept, guard


def _spans_backward(
    span_fn,
    grads_fn,
    seqs,
    initial_state,
    kept,
    n_kept,
    chunk_size,
    d_o,
    d_state,
    gate_grad,
    guard,
    reverse=False,
):
    """A kernel's own backward over spans, from the last (reverse: a kernel that runs backward
    in time, from the first): grads_fn(*chunks, do_c, *the span's kept tensors, d_state,
    gate_grad) -> (gradients of seqs chunk-major, gradient of the state entering the span).
    kept: the tensors of _spans_keeping, n_kept of them for each span, span after span, flat.
    Returns (the gradients of seqs [B, NH, T, ...], the gradient of the initial state).

    When a graph of the backward is asked for (double backward), what was kept was made
    without one, so it is made again with it (guarded as the forward was).
    """
    if torch.is_grad_enabled():
        again = _spans_keeping(span_fn, seqs, initial_state, chunk_size, guard, reverse)[2]
        kept = [x for own in again for x in own]

    def span(*args):
        # the spans run opposite to the forward, so the tensors kept of each are the last left
        own = kept[len(kept) - n_kept :]
        del kept[len(kept) - n_kept :]
        return grads_fn(*args[:-1], *own, args[-1], gate_grad)

    return _over_spans(span, [*seqs, d_o], d_state, chunk_size, reverse=not reverse)


def _gate_grads(pairs, starts, ends, whole, reverse=False, strict=False):
    """The gradient of a chunk's log-gates g_l [..., C, 1] from what each decay factor holding
    exp(g_l) passes on (its gradient times its value, d exp(g) = exp(g) dg): pairs [..., C, C]
    for the mask's entries Gamma_ij (i >= j), which hold g_l for j < l <= i; starts [..., C]
    for exp(b_i), holding g_l for l <= i; ends [..., C] for exp(b_C - b_j), holding g_l for
    j < l; whole [...] for exp(G), holding every g_l of the chunk. Each is a sum of the
    contributions themselves (no sum of q·dq - k·dk over the sequence, whose terms cancel), so
    a hard reset (g = -inf, every factor holding it 0) gets exactly 0.

    The factors of a kernel that reads the state before the token's update (strict) or runs
    backward in time (reverse; see _ordered_decays) hold other runs of l, each bounded by j on
    one side and i on the other as these are: j < l < i (strict), i <= l < j (reverse), i < l
    < j (both); exp(b_i) and exp(b_C - b_j) stand for the decays of the state read and of a
    write, holding the l on i's side and on j's side of those runs.
    """
    size = pairs.shape[-1]
    ones = torch.ones(size, size, dtype=pairs.dtype, device=pairs.device)
    # [j < l] and [i >= l] (strict: i > l); reverse: [l < j] and [i <= l] (strict: i < l)
    if reverse:
        before, from_l = torch.tril(ones, diagonal=-1), torch.triu(ones, int(strict))
    else:
        before, from_l = torch.triu(ones, diagonal=1), torch.tril(ones, -int(strict))
    dg = (torch.matmul(pairs, before) * from_l).sum(-2)  # over j, then over i
    dg = dg + torch.matmul(starts, from_l) + torch.matmul(ends, before) + whole.unsqueeze(-1)
    return dg.unsqueeze(-1)


def _pair_decays(g):
    """Gamma_ij = exp(b_i - b_j) for i >= j, and 1 above the diagonal: [..., L] -> [..., L, L].

    Built as running products of the per-token decays a_l = exp(g_l) <= 1, Gamma_ij =
    a_{j+1} ... a_i: one exp per token instead of one per pair (an exp costs several
    multiplies), never exp(b_i) * exp(-b_j), and a relative error that grows with the number
    of factors (at most about L roundings), not with the size of b_i - b_j as the exp of a
    summed exponent does. Above the diagonal the product is empty, 1, and what it multiplies is
    masked afterwards by selection (_masked): a 0 there would make a later token's inf NaN. A
    gate of -inf (a hard reset) is a factor 0. Gates that repeat along the leading axis (stride
    0: a decay constant in time, see _split_chunks, or broadcast over the batch) give one
    matrix, built once and broadcast.
    """
    if g.dim() > 1 and g.shape[0] > 1 and g.stride(0) == 0:
        return _pair_decays(g[:1]).expand(*g.shape, g.shape[-1])
    length = g.shape[-1]
    ones = torch.ones(length, length, dtype=g.dtype, device=g.device)
    # rows[..., l, j] = a_l where l > j, else 1; a running product down each column
    rows = torch.addcmul(torch.triu(ones), g.exp().unsqueeze(-1), torch.tril(ones, diagonal=-1))
    return torch.cumprod(rows, dim=-2)


def _masked(x, gamma, reverse=False, strict=False):
    """x ⊙ Gamma on and below the diagonal and 0 above it, for x [..., C, C] indexed by pairs of
    tokens (i, j) and the pair decays Gamma (_pair_decays; None: no decay), in place when gamma
    is None; strict: below the diagonal only (a state read before the token's update); reverse:
    on and above it (a state that runs backward in time), strict: above it.

    The mask selects: above the diagonal a score holds a later token, whose inf times a 0 would
    be NaN, which a product over the rows (the scores times V) carries into the earlier ones.
    """
    x = x if gamma is None else x * gamma
    return x.triu_(int(strict)) if reverse else x.tril_(-int(strict))


def _finite_rows(x):
    """(x [..., C, d] with its non-finite entries set to 0, and for each row a poison [..., C]:
    0, or NaN where the row held a non-finite entry).

    A product with a lower-triangular matrix over the rows of x (the masked scores times V, a
    triangular inverse) multiplies every row by the 0s of the earlier rows too: a later row's
    inf would make them NaN (0 * inf). The product takes the finite rows instead, and the poison
    makes the rows from the first non-finite one on NaN (_poison_rows), as in the recurrence.
    The poison is the row's sum times 0, one pass over x: a finite row whose sum overflows
    (entries near the float range divided by d) counts as non-finite too.
    """
    poison = x.detach().sum(-1) * 0
    return torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0), poison


def _finite_rows_(x):
    """_finite_rows of an intermediate the kernel owns: in place where autograd does not track
    it (one pass fewer and no new tensor), else as _finite_rows."""
    if x.requires_grad:
        return _finite_rows(x)
    poison = x.sum(-1) * 0
    return torch.nan_to_num_(x, nan=0.0, posinf=0.0, neginf=0.0), poison


def _finite_gates(g):
    """(log-gates g [..., C] with those whose decay exp(g) is not finite set to 0, and their
    poison [..., C], as _finite_rows). A gate of -inf, a hard reset, decays by 0 and stays."""
    decay = g.detach().exp()
    return torch.where(torch.isfinite(decay), g, 0.0), decay * 0


def _poison_rows(scores, poison, reverse=False, strict=False):
    """Make every row of the masked scores [..., C, C] from the first poisoned token on NaN, in
    place, through its diagonal (the row's output then is NaN whatever it multiplies); a poison
    of 0 adds nothing. Returns the scores. strict: from the token after the first poisoned one
    (the row reads the state before the token's update); reverse: up to the last poisoned one
    (a state that runs backward in time), strict: up to the token before it."""
    run = poison.flip(-1).cumsum(-1).flip(-1) if reverse else torch.cumsum(poison, -1)
    if strict:  # one token on (reverse: back), the end's row unpoisoned
        run = torch.nn.functional.pad(run, (0, 1) if reverse else (1, 0))
        run = run[..., 1:] if reverse else run[..., :-1]
    torch.diagonal(scores, dim1=-2, dim2=-1).add_(run)
    return scores


def _chunk_decays(gamma, g):
    """(exp(b_i), exp(b_C - b_j)) [..., C] from the pair decays Gamma [..., C, C] and gates g.

    Gamma's last row is exp(b_C - b_j); its first column times exp(g_1) is exp(b_i): the
    same direct sums, no further cumulative sums (a product of factors <= 1).
    """
    return gamma[..., :, 0] * torch.exp(g[..., :1]), gamma[..., -1, :]


def _scalar_decays(k_c, g_c, reverse=False, strict=False):
    """The scalar decays on a span of chunks (of a scalar-decay kernel, or the gate of the delta
    rule), g_c [N, B, NH, C] (None: no decay); reverse, strict: see _ordered_decays.

    Returns (Gamma, the pair decays [N, B, NH, C, C]; exp(b) and exp(b_C - b) [N, B, NH, C, 1];
    diag(exp(b_C - b)) K; G = b_C [N, B, NH]), every one None without decay but the keys,
    which are then k_c.
    """
    if g_c is None:
        return None, None, None, k_c, None
    if reverse or strict:
        gamma, from_start, to_end = _ordered_decays(g_c, reverse, strict)
    else:
        gamma = _pair_decays(g_c)  # Gamma_ij = exp(b_i - b_j), 1 for i < j
        from_start, to_end = _chunk_decays(gamma, g_c)
    from_start, to_end = from_start.unsqueeze(-1), to_end.unsqueeze(-1)
    return gamma, from_start, to_end, k_c * to_end, g_c.sum(-1)


def _ordered_decays(g, reverse, strict):
    """_pair_decays and _chunk_decays of a state read before the token's update (strict: S_{i-1}
    q_i, the pair (i, j) decayed by a_{j+1} ... a_{i-1}, the state entering the chunk by a_1
    ... a_{i-1}) or updated backward in time (reverse: S_i = a_i S_{i+1} + k_i v_i^T, the pair
    (i, j >= i) decayed by a_i ... a_{j-1}, and strict, a_{i+1} ... a_{j-1}; the state entering
    from the chunk after by a_i ... a_C, strict a_{i+1} ... a_C; a write reaches the chunk's
    start decayed by a_1 ... a_{j-1}): (Gamma [..., C, C], the decays of the state read and
    of each write [..., C]), Gamma as _masked(reverse, strict) reads it.

    Every pair decay is a running product, as _pair_decays builds it, of the factors a_l moved
    one token on, down the columns (l <= i) or, for reverse, along the rows (l <= j): the
    upper triangle is built as it is read, not transposed. The decays of the state and of the
    writes are the edges of Gamma times the factor it lacks there. A non-finite factor spreads
    across its whole row (reverse: column), so a span run guarded gives finite gates
    (_scalar_decay_span).
    """
    a = g.exp()
    moved = torch.nn.functional.pad(a[..., :-1], (1, 0), value=1.0)  # a_{l-1} at l
    ones = torch.ones(g.shape[-1], g.shape[-1], dtype=g.dtype, device=g.device)
    shift = 1 + int(strict)  # pair (i, j) holds the moved factors of l >= j + shift (i + shift)
    if not reverse:
        rows = torch.addcmul(torch.triu(ones, 1 - shift), moved.unsqueeze(-1), ones.tril(-shift))
        gamma = rows.cumprod(-2)  # a strict read: a_{j+1} .. a_{i-1}
        before = gamma[..., 1:, 0] * a[..., :1]  # a_1 .. a_{i-1}, from the second token
        after = gamma[..., -1, :-1] * a[..., -1:]  # a_{j+1} .. a_C, to the one before the last
        return gamma, _padded(before, 1, 0), _padded(after, 0, 1)
    cols = torch.addcmul(torch.tril(ones, shift - 1), moved.unsqueeze(-2), ones.triu(shift))
    gamma = cols.cumprod(-1)  # a_i .. a_{j-1} (strict: a_{i+1} .. a_{j-1})
    if not strict:  # a_i .. a_C, and a_1 .. a_{j-1}
        return gamma, gamma[..., :, -1] * a[..., -1:], gamma[..., 0, :]
    after = gamma[..., :-1, -1] * a[..., -1:]  # a_{i+1} .. a_C, to the one before the last
    before = gamma[..., 0, 1:] * a[..., :1]  # a_1 .. a_{j-1}, from the second token
    return gamma, _padded(after, 0, 1), _padded(before, 1, 0)


def _padded(x, left, right):
    """x [..., n] with `left` and `right` ones around it on its last axis."""
    return torch.nn.functional.pad(x, (left, right), value=1.0)


def _as_3d(x):
    """[..., m, k] -> [batch, m, k], a view where the leading dims allow (a transposed view of
    a chunk-major tensor does: torch.bmm then gets it as transposed, not copied). A matrix
    with neither of its last two strides 1 (every other column of an interleaved matrix) is
    copied first: torch.bmm would otherwise copy it matrix by matrix, several times slower."""
    if x.stride(-1) != 1 and x.stride(-2) != 1:
        x = x.contiguous()
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


def _pair_blocks(x, block):
    """The diagonal blocks of 2 * block rows and columns of x [..., C, C] as
    [..., C / (2 * block), 2 * block, 2 * block] (a view of x, writable)."""
    lead, size = x.shape[:-2], x.shape[-1]
    n_pairs = size // (2 * block)
    grid = x.reshape(*lead, n_pairs, 2 * block, n_pairs, 2 * block)
    return torch.diagonal(grid, dim1=-4, dim2=-2).movedim(-1, -3)


def _unit_lower_inverse(a):
    """(I + a)^{-1} for strictly lower-triangular a [..., C, C], no autograd: one batched
    triangular solve against the identity (forward substitution, backward stable; only the
    strictly lower part of a is read). On CPU at C = 32 this was 3.5x faster than a batched
    block recursion of matmuls, and half as far from the float64 inverse with nearly parallel
    keys; solving against the right-hand sides instead (128 columns) was slower than the
    inverse and its two matmuls, and the backward needs T anyway.

    It is solved transposed, X (I + a)^T = I for X = T^T: LAPACK takes column-major matrices,
    which a^T of a row-major a already is, so nothing is copied on the way in, and T = X^T
    comes back row-major (on CPU a third faster at C = 32, the same bits)."""
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    return torch.linalg.solve_triangular(
        a.mT, eye.expand_as(a), upper=True, left=False, unitriangular=True
    ).mT


class _OwnBackward(torch.autograd.Function):
    """A chunked kernel with its own backward, for every class that has one: fns = (span_fn,
    grads_fn, turned), span_fn(*chunks, state, kept, guard) running a span's forward and
    appending to kept what grads_fn(*chunks, do_c, *kept, d_state, gate_grad) needs for the
    span's gradients (_spans_keeping, _spans_backward). It keeps the inputs and those per-chunk
    tensors (two to three inputs' worth), where autograd through the chunked form keeps every
    intermediate. seqs[gate] is the log-gate whose gradient grads_fn computes only when asked
    for. turned[i], where not None, is the _Turned of seqs[i] (a rotated q or k): the spans
    turn it as they split it, forward and backward, and its gradient is turned back."""

    @staticmethod
    def forward(ctx, fns, gate, chunk_size, reverse, initial_state, *seqs):
        span_fn, _, turned = fns
        seqs = [x if t is None else t for x, t in zip(seqs, turned)]
        o, state, kept, guard = _spans_keeping(
            span_fn, seqs, initial_state, chunk_size, reverse=reverse
        )
        xs = [x if t is None else t.x for x, t in zip(seqs, turned)]
        ctx.save_for_backward(initial_state, *xs, *[x for own in kept for x in own])
        ctx.fns, ctx.gate, ctx.chunk_size, ctx.guard = fns, gate, chunk_size, guard
        ctx.reverse = reverse
        ctx.n_seqs, ctx.n_kept = len(seqs), len(kept[0])
        return o, state

    @staticmethod
    def backward(ctx, d_o, d_state):
        initial_state, *saved = ctx.saved_tensors
        seqs, kept = saved[: ctx.n_seqs], saved[ctx.n_seqs :]
        turned = ctx.fns[2]
        seqs = [x if t is None else type(t)(x, t.turn) for x, t in zip(seqs, turned)]
        grads, d_initial = _spans_backward(
            *ctx.fns[:2],
            seqs,
            initial_state,
            kept,
            ctx.n_kept,
            ctx.chunk_size,
            d_o,
            d_state,
            ctx.needs_input_grad[5 + ctx.gate],
            ctx.guard,
            ctx.reverse,
        )
        # gradients of per-token inputs ([B, NH, T]) come back as [B, NH, T, 1]
        grads = [None if d is None else d.reshape(x.shape) for d, x in zip(grads, seqs)]
        grads = [d if t is None or d is None else t.back(d) for d, t in zip(grads, turned)]
        d_initial = d_initial if ctx.needs_input_grad[4] else None
        return None, None, None, None, d_initial, *grads
