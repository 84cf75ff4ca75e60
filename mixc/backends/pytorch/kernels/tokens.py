"""Moves of a query and of a kernel's output by one token, for a state read before the token's
update (`S_{t-1} q_t`: the kernel reads the next token's query, and its output moves one token
later; see docs/algorithms.md), each one copy, and for a state that runs backward in time one
gather that also reverses. Generated modules carry the ones they call, as the kernels; this
file imports only torch and common.
"""

import torch

from mixc.backends.pytorch.kernels.common import _reverse_tokens


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
    final states [B, NH, ...] (packed: [N, NH, ...]); one cumulative sum, the rest shifts."""
    initial = initial.to(torch.float64)
    full = torch.broadcast_shapes(v.shape, (v.shape[0], v.shape[1], *initial.shape[1:]))
    sums = v.to(torch.float64).expand(full).cumsum(1)
    if cu_seqlens is None:
        after = initial[:, None] + sums
        before = torch.cat([initial[:, None], after[:, :-1]], 1)
        return before, after, (after[:, -1] if after.shape[1] else initial)
    sums = torch.cat([sums.new_zeros(1, 1, *sums.shape[2:]), sums], 1)[0]  # before token t
    starts, ends = cu_seqlens[:-1].long(), cu_seqlens[1:].long()
    order = torch.arange(len(starts), device=v.device)
    sequence = order.repeat_interleave(ends - starts, output_size=full[1])  # each token's
    offset = (initial - sums[starts])[sequence]  # its sequence's initial state, less the sum
    final = initial + (sums[ends] - sums[starts])  # an empty sequence's: initial, exactly
    return (sums[:-1] + offset)[None], (sums[1:] + offset)[None], final
