"""Context parallelism: one long sequence split along T across the ranks of a process group.

Every supported update is affine in the state, so a slice of the sequence acts on the state as
`final = initial @ P + F` (the compiled module's `summary`; `P @ initial + F` for a transition
acting on the value side, `P * initial + F` for one acting entry by entry: `SUMMARY_ACTIONS`,
`P` then [V, V] or the state's shape). Each rank computes the summary of
its own slice from a zero state, all ranks exchange summaries (one all-gather), each composes
the summaries of the ranks before it into its incoming state, and runs its slice with
`chunk(..., initial_state=incoming)`. No rank waits for another's tokens, and the backward
pass flows through the exchange.

Communication per rank: one all-gather of its summary, for each state
`B * NH * (K * K + rows * K)` numbers (P and F; rows = V for a matrix state [V, K], 1 for a
vector state), i.e. `B * NH * K * (K + V)` for a single [V, K] state, independent of T.

A pipeline (a state whose update reads other states' readouts) passes its states' summaries
one state at a time, in the order its passes run: a later state's summary over a slice depends
on the earlier states' values at the slice's start, so each rank computes it (the module's
`summary(..., initial_state=...)`) only once the earlier states' incoming values are known,
one all-gather per state. Each round runs the summary again (its earlier passes included): a
pipeline of n states costs n summaries a rank, where one state costs one.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
import torch.distributed as dist

from mixc.errors import MixcError

__all__ = ["context_parallel"]


class _AllGather(torch.autograd.Function):
    """All-gather whose backward sums every rank's gradient for this rank's piece (all-reduce),
    which every backend supports (gloo has no reduce-scatter)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        pieces = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(pieces, x.contiguous(), group=group)
        return torch.stack(pieces)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return grad[dist.get_rank(ctx.group)], None


def _as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def context_parallel(mixer, group=None) -> Callable:
    """Wrap a compiled mixer (from `mixc.load` or a compiled file) for context parallelism.

    The returned function takes this rank's slice of the per-token inputs ([B, T_rank, NH, ..],
    ranks in order along T), the full per-head parameters, and an optional initial state for
    the whole sequence (the same on every rank). It returns this rank's outputs and, if asked,
    the final state of the whole sequence (the same on every rank: put it in a loss on one rank
    only; its gradient reaches every rank). Gradients of parameters and of the initial state are
    per rank: sum them over ranks (as DDP does for parameters). As with DDP, every rank must
    run the backward pass.
    """
    if "chunk" not in getattr(mixer, "FORMS", ()):
        raise MixcError(
            f"context parallelism needs a chunked form; {getattr(mixer, 'NAME', 'this mixer')} "
            "runs step by step only (its update is not in a class with an associative summary)"
        )

    default_chunk = getattr(mixer, "CHUNK_SIZE", 64)  # a module compiled before CHUNK_SIZE: 64
    # how each state's summary acts on a state, in the order of STATES (the summary returns
    # one P and one F per state)
    actions = [
        getattr(mixer, "SUMMARY_ACTIONS", {}).get(name, "matmul") for name, _ in mixer.STATES
    ]
    # a pipeline's summary takes the states its later states read (earlier modules have none)
    summary = getattr(mixer, "summary", None)
    pipeline = summary is not None and "initial_state" in inspect.signature(summary).parameters

    def run(
        *args, initial_state=None, output_final_state=False, chunk_size=default_chunk, **params
    ):
        if not dist.is_initialized():
            raise MixcError(
                "context_parallel: torch.distributed is not initialised (call init_process_group)"
            )
        if not mixer.STATES:  # a stateless mixer: a slice's outputs read only its own tokens
            y, final = mixer.chunk(
                *args,
                initial_state=initial_state,
                output_final_state=output_final_state,
                chunk_size=chunk_size,
                **params,
            )
            return y, final
        if pipeline:
            incoming, states = _pipeline_exchange(
                mixer, args, params, chunk_size, initial_state, actions, group
            )
        else:
            summary = mixer.summary(*args, chunk_size=chunk_size, **params)
            incoming, states = _exchange(summary, initial_state, actions, group)
        init = incoming[0] if len(incoming) == 1 else incoming
        y, _ = mixer.chunk(*args, initial_state=init, chunk_size=chunk_size, **params)
        if not output_final_state:
            return y, None
        return y, (states[0] if len(states) == 1 else states)

    return run


def _exchange(summary, initial_state, actions: list[str], group) -> tuple[tuple, tuple]:
    """(this rank's incoming states, the whole sequence's final states) from this rank's
    `summary` (P, F) of its slice: every rank's summary is gathered, and the states are carried
    from `initial_state` (zero where None) through the ranks' slices in order."""
    P, F = summary
    pieces = _as_tuple(P) + _as_tuple(F)
    # one collective per call, so every rank's backward runs the same sequence of them
    flat = torch.cat([x.reshape(-1) for x in pieces])
    gathered = _AllGather.apply(flat, group)  # [ranks, numel]
    rank, world = dist.get_rank(group), gathered.shape[0]
    summaries = [_unflatten(gathered[r], pieces) for r in range(world)]
    n = len(pieces) // 2
    states = _initial(initial_state, pieces[n:])
    incoming = states
    for r in range(world):
        if r == rank:
            incoming = states
        states = tuple(
            _apply(s, p, f, action)
            for s, p, f, action in zip(
                states, summaries[r][:n], summaries[r][n:], actions[:n], strict=True
            )
        )
    # every rank's graph reaches the exchange (rank 0's outputs do not depend on it), so
    # every rank joins the backward collective
    incoming = tuple(s + 0 * gathered.sum() for s in incoming)
    return incoming, states


def _pipeline_exchange(mixer, args, params, chunk_size, initial_state, actions, group):
    """`_exchange` for a pipeline, one state a round in the order of STATES (the order its
    passes run): round j's summary starts the states before j from their incoming values on
    this rank, known from the rounds before, so state j's (P, F) is its action on this slice
    given them; its exchange gives state j's incoming value and final state."""
    given = None if initial_state is None else _as_tuple(initial_state)
    names = [name for name, _ in mixer.STATES]
    order = [names.index(name) for name in getattr(mixer, "SUMMARY_ORDER", names)]
    incoming: dict[int, torch.Tensor] = {}
    finals: dict[int, torch.Tensor] = {}
    start = None  # the states the summary starts from: zeros, then the incoming ones known
    for j in order:
        P, F = mixer.summary(*args, initial_state=start, chunk_size=chunk_size, **params)
        P, F = _as_tuple(P), _as_tuple(F)
        own = None if given is None else given[j]
        (incoming[j],), (finals[j],) = _exchange((P[j], F[j]), own, [actions[j]], group)
        start = tuple(incoming.get(i, torch.zeros_like(f)) for i, f in enumerate(F))
    return tuple(incoming[i] for i in range(len(names))), tuple(
        finals[i] for i in range(len(names))
    )


def _unflatten(flat, like):
    out, start = [], 0
    for x in like:
        out.append(flat[start : start + x.numel()].view_as(x))
        start += x.numel()
    return tuple(out)


def _initial(initial_state, finals):
    if initial_state is None:
        return tuple(torch.zeros_like(f) for f in finals)
    return tuple(s.to(f.dtype) for s, f in zip(_as_tuple(initial_state), finals, strict=True))


def _apply(state, P, F, action="matmul"):
    """state @ P + F, for a matrix state [B, NH, V, K] or a vector state [B, NH, K]; P * state +
    F for a state that a sequence acts on entry by entry, P @ state + F for one it acts on from
    the left (`SUMMARY_ACTIONS`)."""
    if action == "elementwise":
        return P * state + F
    if action == "left":
        return P @ state + F
    if state.dim() == F.dim() and state.dim() == 3:
        return (state[..., None, :] @ P)[..., 0, :] + F
    return state @ P + F
