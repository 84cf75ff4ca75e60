"""The spec language's functions that are more than one torch call, and the token positions.

A generated module copies the definitions it uses (see ``kernel_source``), so this file, like
the kernels, imports only torch. Layout: a vector is a column [..., d, 1].

Angles. A position (``pos_t``) is a float64 tensor, and an angle argument (of cos, sin and the
rotations) that reads one is computed in float64: at position 10^6 a float32 product
position * frequency is off by up to 0.03 rad (its ulp there is 0.0625). cos and sin then run
in float64 and are rounded to the compute dtype (error 3e-8 in float32): on CPU that costs less
than reducing the angle modulo 2 pi in float64 and running them in float32 (benchmarks/
rotations.py measures both). Over a long sequence RoPE's angles pos_t theta are turned from two
small tables of such cos and sin, multiplied in the compute dtype (_turning_at). A summed
angle (Mamba-3's), which no table serves, is reduced modulo 2 pi in float64 and turned in the
compute dtype over whole sequences, where that costs less (_turning_summed).
"""

import torch


def _cos(x, dtype):
    """cos(x) in `dtype`, from an angle that may be float64 (see the module's docstring)."""
    return torch.cos(x).to(dtype)


def _sin(x, dtype):
    """sin(x) in `dtype`, from an angle that may be float64 (see the module's docstring)."""
    return torch.sin(x).to(dtype)


def _softmax(x):
    """exp(x - max x) / sum: every entry of a vector at once (the max taken out first)."""
    return torch.softmax(x.flatten(-2), -1).reshape(x.shape)


def _onehot_argmax(x):
    """1 at the (first) largest entry of a vector, 0 elsewhere. Its gradient is softmax(x)'s
    (the straight-through estimator): hard + (soft - soft), with the second soft detached, is
    the one-hot exactly and passes the softmax's gradient."""
    flat = x.flatten(-2)
    hard = torch.zeros_like(flat).scatter_(-1, flat.argmax(-1, keepdim=True), 1.0)
    soft = torch.softmax(flat, -1)
    return (hard + (soft - soft.detach())).reshape(x.shape)


def _compact(x, rows=None):
    """x with each leading axis that only repeats its entries (stride 0, as `expand` makes it:
    a per-head parameter the same for every head, positions the same for every sequence) cut to
    size 1, so that an angle computed from such views is computed once for each distinct value;
    broadcasting gives the same values at every index. The last two axes (the spec's rows and
    columns) are kept whole, or the rows cut to the first `rows` where given (an angle that is
    elementwise along them, of which a turn reads its first `rows` only)."""
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        return x
    lead = tuple(slice(0, 1) if s == 0 else slice(None) for s in x.stride()[:-2])
    return x[(*lead, slice(rows), slice(None))]


def _turning(theta, d, dtype, *leaves):
    """The turn e^(i theta) of each pair of a vector of `d` entries by the angles theta
    [..., p, 1]: complex [..., n], n = p pairs, or d / 2 when p = d (the first d / 2 read).
    theta may be computed from compacted views (_compact) of `leaves`: the turn is then
    computed on theta's entries and expanded (a view) to the shape of the angle of the leaves
    themselves."""
    n = _pairs_read(theta.shape[-2], d)
    turn = _unit_turn(theta[..., :n, 0], dtype)
    shapes = [x.shape for x in leaves if isinstance(x, torch.Tensor)]
    if not shapes:
        return turn
    return turn.expand(*_broadcast(theta.shape, *shapes)[:-2], n)


def _pairs_read(p, d):
    """The pairs a turn by p angles turns in a vector of d entries: p, or d / 2 where p = d."""
    n = d // 2 if p == d else p
    if 2 * n > d:
        _fail(  # noqa: F821 - defined by the compiled module
            f"rotate: {p} angles for a vector of {d} entries; give at most {d // 2} (one a pair"
            f" of the leading channels), or {d} (the first {d // 2} are read)"
        )
    return n


def _unit_turn(angle, dtype):
    """e^(i angle), complex of `dtype`'s precision: cos and sin in the angle's precision (float64
    from a position: exact at 10^6, and on CPU cheaper than reducing it modulo 2 pi), rounded as
    they are written into the real and imaginary parts (on CPU, torch.polar is 10x slower and
    stacking them 3x)."""
    if not angle.is_contiguous():  # cos and sin of a strided float64 angle run 1.6x slower
        angle = angle.contiguous()
    turn = torch.empty(angle.shape, dtype=_complex_of(dtype), device=angle.device)
    parts = torch.view_as_real(turn)
    if angle.requires_grad or torch.compiler.is_compiling():  # out= takes no gradient
        parts[..., 0], parts[..., 1] = torch.cos(angle), torch.sin(angle)
    else:  # straight into the parts: no float64 temporaries of the sequence's size
        torch.cos(angle, out=parts[..., 0])
        torch.sin(angle, out=parts[..., 1])
    return turn


def _turning_summed(theta, d, dtype, *leaves):
    """_turning_of(theta, d, dtype, *leaves) over whole sequences in a mixer that sums angles
    (a state of angles, Mamba-3's Th: float64, growing without bound): a float64 theta for a
    float32 turn first reduced modulo 2 pi in float64, theta - 2 pi round(theta / 2 pi), within
    1e-10 rad of it at |theta| = 10^6, then rounded to float32 (within 1.2e-7 rad), so that cos
    and sin run there (_unit_turn: the angle's precision). On CPU the reduction and float32's cos
    and sin cost 0.75x float64's cos and sin at angles of 10, 0.3x at 10^6; the turn is within
    1.5e-7 of the exact one (float64's rounded: 4.2e-8; mpmath's reference, 1 thread, 262144
    angles). A float64 turn takes theta as it is, and so does torch.compile (the rotation's
    operator takes float64 angles, where the reduction would be a kernel, a C++ build, of its
    own)."""
    if theta.dtype != torch.float64 or dtype == torch.float64 or torch.compiler.is_compiling():
        return _turning_of(theta, d, dtype, *leaves)
    turns = torch.mul(theta.detach(), 1 / 6.283185307179586).round_()
    if theta.requires_grad:  # out= takes no gradient
        reduced = (theta - 6.283185307179586 * turns).to(dtype)
    else:
        reduced = torch.empty(theta.shape, dtype=dtype, device=theta.device)
        torch.add(theta, turns, alpha=-6.283185307179586, out=reduced)
    return _turning_of(reduced, d, dtype, *leaves)


def _wide_tanh(x):
    """tanh(x) where angles are summed in float64 (Mamba-3's pi dt_t tanh(w_t)): for a float64
    x on CPU, 1 - 2 / (1 + e^(2x)) in place on one temporary, within 1e-15 of torch.tanh
    (absolutely: the angle it scales is summed so) and about 3x cheaper there (1 thread, 262144
    entries: torch's float64 tanh runs far slower than its exp). Elsewhere (float32, under
    autograd or torch.compile, another device) torch.tanh."""
    if x.dtype != torch.float64 or x.device.type != "cpu":
        return torch.tanh(x)
    if x.requires_grad or torch.compiler.is_compiling():
        return torch.tanh(x)
    # e^(2x) = inf at large x gives 1, 0 at very negative x gives -1
    return torch.mul(x, 2).exp_().add_(1).reciprocal_().mul_(-2).add_(1)


def _tanh_angle_sums(scale, x, initial, cu_seqlens=None):
    """_angle_sums(scale * _wide_tanh(x.double()), initial, cu_seqlens): a state of angles
    summed from scale_t tanh(x_t) (Mamba-3's pi dt_t tanh(w_t)), scale float64. Where nothing
    records it, on CPU, for whole sequences, computed in the buffer the sum runs in: x doubled
    into it (exactly, from the compute dtype), _wide_tanh's steps and the scale in place, the
    initial states before them, one cumulative sum. The same values to the bit, without the
    float64 copy of x, the tensors of tanh and of the angles, nor the copy of the angles after
    the initial states (Mamba-3, T = 4096, 4 heads, R = 16, 1 thread: 0.71x the time)."""
    if x.device.type != "cpu" or cu_seqlens is not None or torch.compiler.is_compiling():
        return _angle_sums(scale * _wide_tanh(x.double()), initial, cu_seqlens)  # noqa: F821
    if _needs_grad(scale, x, initial):  # noqa: F821
        return _angle_sums(scale * _wide_tanh(x.double()), initial, cu_seqlens)  # noqa: F821
    full = torch.broadcast_shapes(
        scale.shape, x.shape, (x.shape[0], x.shape[1], *initial.shape[1:])
    )
    sums = torch.empty(full[0], full[1] + 1, *full[2:], dtype=torch.float64, device=x.device)
    sums[:, 0] = initial
    angles = sums[:, 1:]
    torch.mul(x, 2, out=angles)
    angles.exp_().add_(1).reciprocal_().mul_(-2).add_(1).mul_(scale)
    sums.cumsum_(1)  # in the recurrence's order, from the initial states
    # the final states a copy: a view would hold the whole sum until the caller let go
    return sums[:, :-1], sums[:, 1:], sums[:, -1].clone()


def _complex_of(dtype):
    """The complex dtype of a turn in the compute dtype `dtype`."""
    return torch.complex128 if dtype == torch.float64 else torch.complex64


def _turning_at(positions, freq, d, dtype, *leaves):
    """_turning_of(positions * freq, d, dtype, *leaves): the turn by angles that are a position
    times frequencies the same at every token (RoPE's pos_t theta), given as the emitter's
    compacted views of them, positions [..., T, h, 1, 1] and freq [..., p, 1] (no token axis).

    Where the positions advance by the same step s at every token (_position_step), by the
    angle-addition formula, e^(i (a + j s) f) = e^(i a f) e^(i j s f): a the position of the
    first of each run of R = 64 tokens, 0 <= j < R. Each table is cos and sin of float64
    angles (T / R and R a frequency, in place of T), rounded to the compute dtype as _turning
    rounds them, and their product is taken there: in float32 within 1.5e-7 of the exact turn
    (_turning's 4.2e-8) at any position, 10^6 included (the angles stay float64); in float64
    within 6e-11 at 10^6, as _turning's. A float64 product rounded to float32 would cost more
    than the cos and sin it saves (on CPU its complex128 -> complex64 cast runs at 1 ns an
    entry). The turn so built is kept for the next calls from the same positions by the same
    frequencies (_TurnTables)."""
    step = _position_step(positions, freq)
    if step is None:
        return _turning_of(positions * freq, d, dtype, *leaves)
    n = _pairs_read(freq.shape[-2], d)
    key = _TurnTables.key(positions, freq, step, n, dtype)
    turn = _TurnTables.kept.pop(key, None)  # taken out: put back as the most recently used
    if turn is None:
        turn = _turn_from_tables(positions, freq, step, n, dtype)
    _TurnTables.keep(key, turn)
    shapes = [x.shape for x in (positions, freq, *leaves) if isinstance(x, torch.Tensor)]
    return turn.expand(*_broadcast(*shapes)[:-2], n)


def _turn_from_tables(positions, freq, step, n, dtype):
    """_turning_at's turn [..., T, h, n] of the positions advancing by `step` (see there),
    from the two tables."""
    run, length = 64, positions.shape[-4]
    blocks = -(-length // run)
    ticks = torch.arange(max(blocks, run), dtype=torch.float64, device=freq.device)
    ticks = ticks.mul_(step)[:, None, None]  # 0, s, 2 s, ... along the token axis
    firsts = positions[..., :1, :, :, 0] + run * ticks[:blocks]  # [b, T / R, h, 1]
    within = ticks[:run].expand(*firsts.shape[:-3], run, *firsts.shape[-2:])
    # both tables' cos and sin at once: [b, T / R + R, h, n]
    turns = _unit_turn(torch.cat((firsts, within), -3) * freq[..., :n, 0], dtype)
    heads, within = turns[..., :blocks, None, :, :], turns[..., None, blocks:, :, :]
    return (heads * within).flatten(-4, -3).narrow(-3, 0, length)


class _TurnTables:
    """The turns _turning_at built from its tables, kept across calls of this module, as a RoPE
    layer keeps its cos and sin: a call on a sequence of the same length, from the same first
    positions, by the same frequencies, reads its turn here (T = 4096, 32 pairs: 1 MiB of
    complex64, on CPU about 200 us a call of cos, sin and their product, a few percent of
    linear attention's chunk forward). Keyed by all the turn is computed from (key), so a kept
    turn is the one a call would compute, to the bit; never written to (the rotations read it).
    Bounded: `limit` bytes in all, the least recently used dropped first, a turn larger than
    that not kept; `module._TurnTables.limit = 0` keeps none, `kept.clear()` empties it."""

    limit = 16 << 20  # bytes: 16 turns of 4096 tokens by 32 pairs in complex64
    kept = {}  # noqa: RUF012 - key -> turn, the least recently used first

    @staticmethod
    def key(positions, freq, step, n, dtype):
        """What the turn of the tables is computed from: each sequence's and head's first
        position and the frequencies, by value (bytes of CPU tensors: _position_step took the
        tables' path), the length, step, pairs, dtype and device, and whether inference mode is
        on (a turn made there could not be saved for a later backward)."""
        first, freq = positions[..., :1, :, :, 0].detach(), freq[..., :n, 0].detach()
        values = tuple((x.shape, x.dtype, x.numpy().tobytes()) for x in (first, freq))
        inference = torch.is_inference_mode_enabled()
        return (positions.shape[-4], step, n, dtype, positions.device, inference, values)

    @staticmethod
    def keep(key, turn):
        """Keep `turn` under `key` as the most recently used, then drop the least recently used
        turns until the kept ones hold at most `limit` bytes. Safe from several threads: each
        step one call on the dict (a turn dropped twice, or built twice, costs only time)."""
        kept, limit = _TurnTables.kept, _TurnTables.limit
        if turn.untyped_storage().nbytes() <= limit:
            kept[key] = turn
        while kept and sum(t.untyped_storage().nbytes() for t in list(kept.values())) > limit:
            kept.pop(next(iter(list(kept)), None), None)


def _position_step(positions, freq):
    """The step s by which positions [B, T, NH, 1, 1] advance at every token (positions t0 +
    t s, the same s for every sequence and head: whole sequences), where _turning_at builds the
    turn from tables; None where it does not: a short sequence (the tables would save little),
    positions that restart (packed sequences), frequencies with a token or batch axis, a turn
    that takes a gradient, and off the CPU or inside a compiled graph (the read would wait for
    the device or break the graph)."""
    if not isinstance(freq, torch.Tensor) or (freq.dim() > 3 and set(freq.shape[:-3]) != {1}):
        return None
    if positions.device.type != "cpu" or torch.compiler.is_compiling():
        return None
    if torch.is_grad_enabled() and (positions.requires_grad or freq.requires_grad):
        return None
    if positions.dim() != 5 or positions.shape[1] < 256:
        return None
    steps = positions.diff(dim=1)
    first = steps.reshape(-1)[:1]  # every sequence's and head's step is the first one's
    return first.item() if torch.equal(steps, first.expand_as(steps)) else None


def _broadcast(*shapes):
    """The shape that shapes broadcast to (torch.broadcast_shapes, without its cost per call: it
    is one of the few things a short sequence's turn pays). The shapes broadcast (the angle was
    computed from them)."""
    rank = max(len(s) for s in shapes)
    padded = [(1,) * (rank - len(s)) + tuple(s) for s in shapes]
    return tuple(max(sizes) if min(sizes) else 0 for sizes in zip(*padded))


def _rotate(x, turning):
    """Half-split pairs (GPT-NeoX): entries i and i + n, for the n pairs of `turning` (see
    _turning), as the complex number x_i + i x_(i+n) times it; the entries past 2n are kept."""
    n = turning.shape[-1]
    return _turn_two_slices(x, turning, n)


def _rotate_halves(x, turning):
    """Pairs of the two halves of the whole vector (Mamba-3 MIMO's kernels): entries i and
    i + d // 2 of a vector of d entries, for the n pairs of `turning` (see _turning), as the
    complex number x_i + i x_(i+d//2) times it; the entries in no pair are kept. The same as
    _rotate where n = d // 2."""
    return _turn_two_slices(x, turning, x.shape[-2] // 2)


def _turn_two_slices(x, turning, half):
    """x's entries i and i + half, i < n (the n pairs of `turning`), as the complex numbers
    x_i + i x_(i+half), times the turn; the rest kept. One path eagerly and under torch.compile:
    the pairs stacked and viewed as complex numbers (inductor once miscomputed the angle's
    gradient through torch.complex of two slices: Mamba-3 MIMO's layer, 3e-2 off in dt's and
    w's; test_torch_compile checks a compiled layer of each rotation against float64)."""
    n = turning.shape[-1]
    first, second = x[..., :n, 0], x[..., half : half + n, 0]
    turned = torch.view_as_complex(torch.stack((first, second), -1)) * turning
    lead = turned.shape[:-1]
    kept = x[..., n:half, 0].expand(*lead, -1), x[..., half + n :, 0].expand(*lead, -1)
    return torch.cat((turned.real, kept[0], turned.imag, kept[1]), -1)[..., None]


def _rotate_interleaved(x, turning):
    """Interleaved pairs (RoFormer, torchscale): entries 2i and 2i + 1, for the n pairs of
    `turning` (see _turning), as the complex number x_2i + i x_(2i+1) times it; the entries
    past 2n are kept."""
    n = turning.shape[-1]
    pairs = x[..., : 2 * n, 0].unflatten(-1, (n, 2))
    # torch.compile cannot read a storage offset: there a copy always (which it fuses away)
    odd = torch.compiler.is_compiling() or pairs.storage_offset() % 2
    odd = odd or any(s % 2 for s in pairs.stride()[:-1])
    if pairs.stride(-1) != 1 or odd:  # not a view of complex numbers: a copy is
        pairs = pairs.clone(memory_format=torch.contiguous_format)
    turned = torch.view_as_complex(pairs) * turning
    if 2 * n == x.shape[-2]:
        return torch.view_as_real(turned).flatten(-2)[..., None]
    # stacked, not viewed as real: the gradient of a slice of the cat may sit at an odd offset,
    # which the backward of view_as_real cannot view as complex numbers
    turned = torch.stack((turned.real, turned.imag), -1).flatten(-2)
    rest = x[..., 2 * n :, 0].expand(*turned.shape[:-1], -1)
    return torch.cat((turned, rest), -1)[..., None]


class _Turned:
    """An input x [B, NH, T, d] of a chunked kernel, its leading pairs of channels (2i, 2i + 1),
    i < n, turned by turn [B, NH, T, n] (complex: the pair as x_2i + i x_(2i+1) times it), the
    rest kept: turned as each span is copied into the chunk layout (_split_chunks calls its
    `chunks`), in place of a pass of its own over a tensor of the whole sequence. A rotated
    query or key (RoPE) comes so outside torch.compile, for whole sequences, and where its turn
    takes no gradient (_seq_turned); the spans read its sizes, dtype and device, and slice it
    along time (a _TurnedSpan). Under autograd a kernel with its own backward takes x as its
    input and turns x's gradient back (`back`); the others turn it in the chunks they track.
    `plus` (None, or a tensor of x's shape that takes no gradient, a bias): x + plus is turned,
    the sum written as each span is copied, not as a tensor of the whole sequence."""

    def __init__(self, x, turn, plus=None):
        self.x, self.turn, self.plus = x, turn, plus
        self.shape, self.dtype, self.device = x.shape, x.dtype, x.device
        self.requires_grad = x.requires_grad
        self.views = {}  # chunk size -> chunk-major views of the whole sequence (_chunked)

    def __getitem__(self, index):
        """x[:, :, tokens], the one slice the kernels take (_span_inputs): split as it comes."""
        return _TurnedSpan(self, index[2])

    def new_zeros(self, *size):
        return self.x.new_zeros(*size)

    def _pairs(self, x, turn, back=False):
        """x's leading pairs times turn (its conjugate if `back`), in place; x [..., d] is a
        fresh tensor, its last axis contiguous."""
        n = turn.shape[-1]
        turn = turn.conj_physical() if back else turn
        pairs = _complex_pairs(x[..., : 2 * n], n)
        if pairs is None:  # not a view of complex numbers (an odd d or offset)
            pairs = torch.view_as_complex(x[..., : 2 * n].unflatten(-1, (n, 2)).contiguous())
            x[..., : 2 * n].copy_(torch.view_as_real(pairs * turn).flatten(-2))
        else:
            pairs.mul_(turn)
        return x

    def _chunked(self, chunk_size):
        """Chunk-major views [N, B, NH, C, n, 2] of x's pairs and [N, B, NH, C, n] of the turn,
        where every entry of x is in a pair, no bias is added and whole chunks cover the
        sequence; else None. Made once a chunk size: each span is then a slice of them."""
        if chunk_size not in self.views:
            x, turn = self.x, self.turn
            n, length = turn.shape[-1], x.shape[2]
            whole = self.plus is None and 2 * n == x.shape[-1] and length % chunk_size == 0
            views = None
            if whole:
                views = [
                    t.unflatten(2, (-1, chunk_size)).movedim(2, 0)
                    for t in (x.unflatten(-1, (n, 2)), turn)
                ]
            self.views[chunk_size] = views
        return self.views[chunk_size]

    def chunks(self, chunk_size, n_pad, tokens=slice(None)):
        """_split_chunks of x[:, :, tokens] (plus `plus`) turned: x copied into a fresh buffer in
        the chunk layout (the copy the chunk layout needs anyway; the sum with `plus` written
        there), whose pairs are then turned in place, while the span is in cache (whole rows
        copied, then one product: cheaper on CPU than writing the turned pairs and the rest
        apart, or one product from x's layout); exactly the values of turning x, then
        splitting it. A span of whole chunks of a sequence of whole chunks, no bias added and
        every entry in a pair, reads slices of _chunked's views: a few torch calls a span,
        as many as a plain input's split."""
        start, stop, _ = tokens.indices(self.x.shape[2])
        views = None if n_pad or start % chunk_size else self._chunked(chunk_size)
        if views is not None and stop % chunk_size == 0:
            pairs, turn = (v[start // chunk_size : stop // chunk_size] for v in views)
            out = torch.empty(turn.shape, dtype=turn.dtype, device=turn.device)
            torch.view_as_real(out).copy_(pairs)
            return torch.view_as_real(out.mul_(turn)).flatten(-2)
        data, turn, plus = (
            None if t is None else t[:, :, start:stop] for t in (self.x, self.turn, self.plus)
        )
        if n_pad:
            data = torch.nn.functional.pad(data, [0, 0, 0, n_pad])
            turn = torch.nn.functional.pad(turn, [0, 0, 0, n_pad])
            plus = None if plus is None else torch.nn.functional.pad(plus, [0, 0, 0, n_pad])
        batch, heads, length, d = data.shape

        def chunked(t):  # [B, NH, T, ...] -> a chunk-major view [N, B, NH, C, ...]
            return t.unflatten(2, (-1, chunk_size)).movedim(2, 0)

        out = data.new_empty(length // chunk_size, batch, heads, chunk_size, d)
        if plus is None:
            out.copy_(chunked(data))
        else:
            torch.add(chunked(data), chunked(plus), out=out)
        return self._pairs(out, chunked(turn))

    def back(self, grad):
        """The gradient of x from grad [B, NH, T, d], that of x turned: its pairs turned back
        (times the conjugate turn), in place; the rest as it is."""
        return self._pairs(grad, _compact(self.turn), back=True)


class _TurnedSpan:
    """The tokens `tokens` (a slice) of a _Turned, split into chunks as a kernel's span asks."""

    def __init__(self, whole, tokens):
        self.whole, self.tokens = whole, tokens

    def chunks(self, chunk_size, n_pad):
        return self.whole.chunks(chunk_size, n_pad, self.tokens)


def _complex_pairs(x, n):
    """x [..., 2n] (its last axis contiguous) viewed as n complex numbers, or None where its
    strides or offset are odd (view_as_complex needs them even)."""
    pairs = x.unflatten(-1, (n, 2))
    if pairs.stride(-1) != 1 or any(s % 2 for s in (x.storage_offset(), *pairs.stride()[:-1])):
        return None
    return torch.view_as_complex(pairs)


def _seq_turned(x, turning, sizes, cu_seqlens=None, plus=None):
    """_seq_vector(_rotate_interleaved(x + plus, turning), sizes, cu_seqlens) (plus None: of
    x): a rotated query or key of a chunked kernel. Outside torch.compile, for whole sequences
    and a turn that takes no gradient, a _Turned, which the kernel turns as it copies each span
    into its chunk layout: no pass of its own and no tensor of the whole sequence (on CPU that
    pass and its fresh memory cost as much as the kernel's copies of q and k); with nothing
    that takes a gradient, the sum with `plus` (a bias) is written there too. Elsewhere turned
    first, as an expression is."""
    if torch.compiler.is_compiling() or cu_seqlens is not None:
        return _seq_vector(_rotated(_rotate_interleaved, x, turning, plus), sizes, cu_seqlens)  # noqa: F821
    tracked = _needs_grad(x, turning, plus)  # noqa: F821
    if plus is not None and tracked:
        x, plus = x + plus, None
    if tracked and turning.requires_grad:
        return _seq_vector(_rotate_interleaved(x, turning), sizes, cu_seqlens)  # noqa: F821
    lead = (sizes["B"], sizes["T"], sizes["NH"], turning.shape[-1])
    plus = None if plus is None else _seq_vector(plus, sizes)  # noqa: F821
    return _Turned(_seq_vector(x, sizes), turning.expand(lead).transpose(1, 2), plus)  # noqa: F821


class _Angles:
    """What _turning_of gives under torch.compile in place of a turn: the angles `theta`
    [..., p, 1] (expanded to the turn's leading axes), the size `d` of the vectors they turn and
    the compute dtype, which _rotated hands to one opaque operator."""

    def __init__(self, theta, d, dtype):
        self.theta, self.d, self.dtype = theta, d, dtype


def _turning_of(theta, d, dtype, *leaves):
    """_turning(theta, d, dtype, *leaves), the turn a rotation reads (_rotated). Under
    torch.compile, in a module that registered its operators, the angles instead (_Angles):
    each rotation is then one opaque operator, the turn and the turned pairs computed inside it
    as they are eagerly (cos and sin of the float64 angles), where inductor would otherwise write
    a kernel of its own for each step around the complex numbers (their cos, sin, copies,
    stacks; forward and backward), a C++ build each."""
    if _Operators.rotate is None or not torch.compiler.is_compiling():  # noqa: F821
        return _turning(theta, d, dtype, *leaves)
    shapes = [x.shape for x in leaves if isinstance(x, torch.Tensor)]
    lead = _broadcast(theta.shape, *shapes)[:-2]
    return _Angles(theta.expand(*lead, *theta.shape[-2:]), d, dtype)


def _rotated(rotate, x, turning, plus=None):
    """rotate(x + plus, turning) (plus None: rotate(x, turning)), `rotate` one of the rotations
    (_rotate_interleaved, ...): _rotated_all of the one vector."""
    return _rotated_all(rotate, turning, (x, plus))[0]


def _rotated_all(rotate, turning, *sums):
    """[rotate(x + plus, turning) for (x, plus) in sums] (plus None: x alone). For the angles
    of _turning_of under torch.compile, one call of the operator `rotate` of rotations.py for
    them all: the turn computed once, each sum (a vector and its bias) added inside, so that
    inductor writes no kernel for the sums, nor for the biases' gradients (summed over the
    tokens) and the angle's (summed over the vectors) in the backward."""
    if not isinstance(turning, _Angles):
        return [rotate(x if p is None else x + p, turning) for x, p in sums]
    plus, added = [], []  # each addend once (a bias of several vectors), and where it is
    for _, p in sums:
        found = [i for i, q in enumerate(plus) if q is p]
        added.append(-1 if p is None else found[0] if found else len(plus))
        plus += [p] if p is not None and not found else []
    theta, d, dtype = turning.theta, turning.d, turning.dtype
    xs = [x for x, _ in sums]
    return _Operators.rotate(rotate.__name__, xs, plus, added, theta, d, dtype)  # noqa: F821


def _positions(start, sizes, device, cu_seqlens=None):
    """Each token's position, [B, T, NH, 1, 1] in float64, counted from the carried `start`
    [B, NH, 1, 1] (None: 0; with cu_seqlens, [N, NH, 1, 1]: each sequence from its first
    token), and the position after the last token of each sequence, in start's dtype."""
    if start is None:
        start = torch.zeros(sizes["B"], sizes["NH"], 1, 1, dtype=torch.float64, device=device)
    steps = torch.arange(sizes["T"], dtype=torch.float64, device=device)
    begin = start.to(torch.float64)[:, None]  # [B, 1, NH, 1, 1]
    if cu_seqlens is None:
        if _one_start(start):  # the same positions for every sequence and head: a view of them
            shared = begin[:1, :, :1] + steps[None, :, None, None, None]  # [1, T, 1, 1, 1]
            return shared.expand(sizes["B"], -1, sizes["NH"], 1, 1), start + sizes["T"]
        return begin + steps[None, :, None, None, None], start + sizes["T"]
    tokens = torch.arange(sizes["T"], device=device)
    seq = torch.searchsorted(cu_seqlens[1:], tokens, right=True)  # each token's sequence
    within = steps - cu_seqlens[seq].to(torch.float64)
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).to(start.dtype)
    return (begin[seq, 0] + within[:, None, None, None])[None], start + lengths[:, None, None, None]


def _one_start(start):
    """Whether every sequence and head starts at the same position, which their angles then
    share (_compact). Read on CPU outside a compiled graph only (elsewhere the read would wait
    for the device or break the graph), and not for a start that takes a gradient (each entry
    gets its own)."""
    if start.device.type != "cpu" or start.requires_grad or torch.compiler.is_compiling():
        return False
    return start.numel() > 0 and bool((start == start.reshape(-1)[0]).all())
