"""Moves of a query and of a kernel's output by one token, for a state read before the token's
update (`S_{t-1} q_t`: the kernel reads the next token's query, and its output moves one token
later; see docs/algorithms.md), each one copy, and for a state that runs backward in time one
gather that also reverses; a state's inputs reversed in time and several steps a token laid
out as sub-tokens. Generated modules carry the ones they call, as the kernels; this file
imports only torch and the kernels' common module.
"""

import torch

from mixc.backends.pytorch.kernels.common import _fresh_copy


def _sub_tokens(parts):
    """Several steps a token as sub-tokens: the steps' tensors [B, NH, T, ...] (the kernels'
    layout, packed or not) interleaved along time into [B, NH, n T, ...], token t's steps at
    n t, ..., n t + n - 1. Padding after a packed sequence's end stays after it."""
    return torch.stack(parts, 3).flatten(2, 3)


def _sub_token_factor(x, n):
    """A factor of a log-gate [B, NH, T, ...] shared by a token's n steps, laid out as
    _sub_tokens lays out the gate it multiplies: each token's repeated n times (a T axis of 1,
    constant in time, stays so). A step without a gate multiplies it by its gate of 0."""
    return x if x.shape[2] == 1 else x.repeat_interleave(n, 2)


def _reverse_tokens(x, cu_seqlens=None):
    """x [B, NH, T, ...] (the kernels' layout) in reverse time order, for a state that runs
    backward; packed ([N, NH, longest, ...], zeros after each sequence's end), each sequence
    reversed within its own length, its zeros left after it. Its own inverse. A tensor the same
    at every token (a time axis of 1) stays as it is."""
    if x.shape[2] == 1:
        return x
    if cu_seqlens is None:
        return x.flip(2)
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1])[:, None]  # [N, 1]
    tokens = torch.arange(x.shape[2], device=x.device)[None, :]  # [1, longest]
    order = torch.where(tokens < lengths, lengths - 1 - tokens, tokens)
    order = order.view(order.shape[0], 1, order.shape[1], *[1] * (x.dim() - 3))
    return x.gather(2, order.expand(x.shape))


def _shift_tokens(x, first, cu_seqlens=None):
    """x one token later, x_{t-1} at every token t of x [B, T, NH, ...] (the mixer's layout):
    each sequence starts from `first` [B, NH, ...] (packed, cu_seqlens given: one per
    sequence, [N, NH, ...]; None: zeros), so no token reads across a sequence boundary."""
    if first is None:
        first = torch.zeros_like(x[:, 0])
    if cu_seqlens is None:
        return torch.cat([first[:, None], x[:, :-1]], 1)
    tokens = torch.arange(x.shape[1], device=x.device, dtype=cu_seqlens.dtype)
    sequence = torch.searchsorted(cu_seqlens[1:], tokens, right=True)  # each token's sequence
    starts = (tokens == cu_seqlens[sequence]).view(1, -1, *[1] * (x.dim() - 2))
    earlier = torch.cat([x[:, :1], x[:, :-1]], 1)
    return torch.where(starts, first[sequence][None], earlier)


def _last_tokens(x, first, cu_seqlens=None):
    """The last token of each sequence of x [B, T, NH, ...]: [B, NH, ...] (packed: [N, NH, ...],
    an empty sequence keeping `first`, its token from before)."""
    if cu_seqlens is None:
        return x[:, -1]
    ends = cu_seqlens[1:]
    empty = (ends == cu_seqlens[:-1]).view(-1, *[1] * (first.dim() - 1))
    return torch.where(empty, first, x[0][(ends - 1).clamp(min=0)])


def _reversed_shift(x):
    """x [B, NH, T, ...] in reverse time order, one token on: token s holds x's token T - 2 - s
    (the last holds token 0, for the caller to overwrite). One gather of the tokens of the
    callers' layout [B, T, NH, ...], of which the kernels' tensors are views."""
    order = torch.arange(x.shape[2] - 2, -2, -1, device=x.device).clamp_(min=0)
    return x.transpose(1, 2).index_select(1, order).transpose(1, 2)


def _next_tokens(x, reverse=False, cu_seqlens=None):
    """x one token earlier, x_{t+1} at every token t of x [B, NH, T, ...] (the kernels' layout,
    packed or not), 0 at the last, in one copy (a zero-padded one would write every entry
    twice); with `reverse`, of x in reverse time order (as _reverse_tokens)."""
    if reverse and cu_seqlens is None:
        out = _reversed_shift(x)
    else:
        x = _reverse_tokens(x, cu_seqlens) if reverse else x
        out = torch.empty_like(x)
        out[:, :, :-1] = x[:, :, 1:]
    out[:, :, -1:] = 0
    return out


def _lagged_start(state, key, value, scale):
    """The state entering a chunked pass whose lagged write is folded into each token's own
    (mixc.analysis.folds): state [B, NH, K, V] (the kernels' layout) plus c_1 k_0 v_0^T, the
    previous token's write that the first token would decay, key [B, NH, K, 1] and value
    [B, NH, V, 1] before each sequence's first token, c_1 the first token's of scale
    [B, NH, T] (packed: [N, NH, longest], 0 for an empty sequence). No token: the state."""
    if scale.shape[2] == 0:
        return state
    return state + (scale[:, :, :1, None] * key) @ value.mT


def _tokenwise(fn, *xs):
    """fn(*xs), fn computed token by token (from each token's entries alone) in the mixers'
    layout: xs of 5 axes [B, T, NH, rows, cols] have the tokens on axis 1 (or 1 entry there,
    the same at every token), the others (parameters) are the same at every token, and so is
    fn's result laid out. Where nothing records it (no gradient, no compiler), computed a slice
    of tokens at a time: its temporaries (a sum of a vector and its bias) are then cache-sized,
    in memory the C allocator recycles, where over the whole sequence each is a fresh tensor of
    its size (on CPU its pages cost more than the pass that fills them). The same values."""
    seqs = [x for x in xs if isinstance(x, torch.Tensor) and x.dim() == 5 and x.shape[1] > 1]
    tracked = torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in xs
    )
    if not seqs or tracked or torch.compiler.is_compiling():
        return fn(*xs)
    length = seqs[0].shape[1]
    step = max(1, (1 << 17) // max(x[:, :1].numel() for x in seqs))  # 512 KiB of float32
    if length <= step:
        return fn(*xs)

    def part(x, s):
        return x[:, s : s + step] if any(x is y for y in seqs) else x

    return torch.cat([fn(*(part(x, s) for x in xs)) for s in range(0, length, step)], 1)


def _final_tokens(x, cu_seqlens=None):
    """The last token of each sequence of x [B, NH, T, ...] (the kernels' layout; packed:
    [N, NH, longest, ...]) as [.., 1, ...]: the first of the time-reversed sequence (an empty
    sequence's is its padding, 0)."""
    if cu_seqlens is None:
        return x[:, :, -1:]
    last = ((cu_seqlens[1:] - cu_seqlens[:-1]).clamp(min=1) - 1).to(torch.int64)
    last = last.view(-1, 1, 1, *[1] * (x.dim() - 3))
    return x.gather(2, last.expand(x.shape[0], x.shape[1], 1, *x.shape[3:]))


def _previous_tokens(x, first, reverse=False, cu_seqlens=None):
    """x one token later, x_{t-1} at every token t of x [B, NH, T, ...] (the kernels' layout),
    `first` [B, NH, 1, ...] at token 0, in one copy; with `reverse`, then in reverse time
    order (as _reverse_tokens)."""
    if reverse and cu_seqlens is None:
        out = _reversed_shift(x)
        out[:, :, -1:] = first
        return out
    out = torch.empty_like(x)
    out[:, :, 1:] = x[:, :, :-1]
    out[:, :, :1] = first
    return _reverse_tokens(out, cu_seqlens) if reverse else out


def _angle_sums(v, initial, cu_seqlens=None):
    """A state of angles summed over time, S_t = S_{t-1} + v_t, in float64 (a float32 sum of
    10^6 angles is off by about 10^6 of its ulps): v [B, T, NH, ...] the angles added at each
    token, `initial` [B, NH, ...] (packed: [N, NH, ...] for the N sequences of cu_seqlens,
    B = 1). Returns the states before each token's update and after it [B, T, NH, ...] and the
    final states [B, NH, ...] (packed: [N, NH, ...]); one cumulative sum, the rest shifts.
    Under torch.compile, in a module that registered it (_register_angle_sums), the opaque
    operator `angle_sums`: inductor would otherwise write the float64 sum's shifts and, in the
    backward, its reversed sum into its kernels (C++ builds of float64 code)."""
    if _Operators.angle_sums is not None and torch.compiler.is_compiling():  # noqa: F821
        return tuple(_Operators.angle_sums(v, initial, cu_seqlens))  # noqa: F821
    return _summed_angles(v, initial, cu_seqlens)


def _summed_angles(v, initial, cu_seqlens=None):
    """_angle_sums as it runs eagerly (and inside its operator): views of one cumulative sum."""
    initial = initial.to(torch.float64)
    full = torch.broadcast_shapes(v.shape, (v.shape[0], v.shape[1], *initial.shape[1:]))
    v = v.to(torch.float64).expand(full)
    if cu_seqlens is None:
        # the initial states, then each token's angles, summed along time in the recurrence's
        # order: the states before and after each update are two views of the one sum
        first = initial[:, None].expand(full[0], 1, *full[2:])
        sums = torch.cat([first, v], 1)
        sums = sums.cumsum(1) if sums.requires_grad else sums.cumsum_(1)
        # the final states a copy: a view would hold the whole sum until the caller let go
        return sums[:, :-1], sums[:, 1:], sums[:, -1].clone()
    # summed with time last, along unit strides, then viewed back
    sums = v.movedim(1, -1).contiguous().cumsum(-1).movedim(-1, 1)
    sums = torch.cat([sums.new_zeros(1, 1, *sums.shape[2:]), sums], 1)[0]  # before token t
    starts, ends = cu_seqlens[:-1].long(), cu_seqlens[1:].long()
    order = torch.arange(len(starts), device=v.device)
    sequence = order.repeat_interleave(ends - starts, output_size=full[1])  # each token's
    offset = (initial - sums[starts])[sequence]  # its sequence's initial state, less the sum
    final = initial + (sums[ends] - sums[starts])  # an empty sequence's: initial, exactly
    return (sums[:-1] + offset)[None], (sums[1:] + offset)[None], final


def _angle_sum_grads(v, initial, cu_seqlens, grads, wanted):
    """The operator `angle_sums_backward`: the gradients of v and of the initial states (those
    `wanted`) from those of the three outputs (None: 0). State S_t reads v_u at every u <= t
    of its sequence, so v_t's gradient is R_t, the sum of both states' gradients over the
    sequence's tokens from t on, less the gradient of the state before t (which does not read
    v_t), plus the final state's; an initial state's is its sequence's R at the first token
    plus the final state's. R is one reversed cumulative sum (packed: of the whole row, less its
    value after the sequence's end)."""
    full = torch.broadcast_shapes(v.shape, (v.shape[0], v.shape[1], *initial.shape[1:]))
    shapes = (full, full, (initial.shape[0], *full[2:]))
    before, after, final = (
        v.new_zeros(s, dtype=torch.float64) if g is None else g.to(torch.float64).expand(s)
        for g, s in zip(grads, shapes)
    )
    if cu_seqlens is None:
        reached = (before + after).flip(1).cumsum(1).flip(1)
        d_v, d_initial = reached - before + final[:, None], (before + after).sum(1) + final
    else:
        reached = (before + after)[0].flip(0).cumsum(0).flip(0)
        reached = torch.cat([reached, reached.new_zeros(1, *reached.shape[1:])])  # after the end
        starts, ends = cu_seqlens[:-1].long(), cu_seqlens[1:].long()
        order = torch.arange(len(starts), device=v.device)
        sequence = order.repeat_interleave(ends - starts, output_size=full[1])  # each token's
        d_v = (reached[:-1] - reached[ends][sequence] - before[0] + final[sequence])[None]
        d_initial = reached[starts] - reached[ends] + final
    found = [d_v.sum_to_size(v.shape), d_initial.sum_to_size(initial.shape)]
    return [_fresh_copy(d.to(t.dtype)) for d, t, w in zip(found, (v, initial), wanted) if w]


def _define_angle_sums(namespace):
    """Register the operators `angle_sums` (_summed_angles, each output a fresh tensor) and
    `angle_sums_backward` (_angle_sum_grads) of `namespace`, the first's gradient the second."""
    head = "(Tensor v, Tensor initial, Tensor? cu_seqlens"

    def forward(v, initial, cu_seqlens):
        with torch.no_grad():
            return tuple(_fresh_copy(x) for x in _summed_angles(v, initial, cu_seqlens))

    def fake(v, initial, cu_seqlens):
        full = torch.broadcast_shapes(v.shape, (v.shape[0], v.shape[1], *initial.shape[1:]))
        final = (initial.shape[0], *full[2:])
        return tuple(v.new_empty(s, dtype=torch.float64) for s in (full, full, final))

    def backward_fake(v, initial, cu_seqlens, grads, wanted):
        return [t.new_empty(t.shape) for t, w in zip((v, initial), wanted) if w]

    sums = torch.library.custom_op(f"{namespace}::angle_sums", forward, mutates_args=(),
                                   schema=f"{head}) -> (Tensor, Tensor, Tensor)")  # fmt: skip
    sums.register_fake(fake)
    sums_backward = torch.library.custom_op(
        f"{namespace}::angle_sums_backward", _angle_sum_grads, mutates_args=(),
        schema=f"{head}, Tensor?[] grads, bool[] wanted) -> Tensor[]",
    )  # fmt: skip
    sums_backward.register_fake(backward_fake)

    def save(ctx, inputs, output):
        ctx.save_for_backward(*inputs)
        ctx.set_materialize_grads(False)  # no zeros for an output no gradient reaches

    def formula(ctx, *grads):
        v, initial, cu_seqlens = ctx.saved_tensors
        wanted = list(ctx.needs_input_grad[:2])
        found = iter(sums_backward(v, initial, cu_seqlens, list(grads), wanted))
        return (*(next(found) if w else None for w in wanted), None)

    sums.register_autograd(formula, setup_context=save)


def _register_angle_sums(namespace, functions):
    """Register the operators of _define_angle_sums under `namespace` (as operators.py's
    _register_spans does), unless they are registered already, and let _angle_sums call
    `angle_sums` under torch.compile from now on (through the module's _Operators). Returns
    the operator."""
    ops = getattr(torch.ops, namespace)
    if not hasattr(ops, "angle_sums"):
        _define_angle_sums(namespace)
    functions["_Operators"].angle_sums = ops.angle_sums
    return ops.angle_sums
