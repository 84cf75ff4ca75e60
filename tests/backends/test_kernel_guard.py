"""The chunked kernels' guard of causality against non-finite inputs (common._guarded_spans).

On CPU a kernel runs unguarded and is run again guarded only when its final state is not finite.
That is sound only if every non-finite key, value, beta or gate reaches the final state, which is
checked here for each input of each kernel, including behind later hard resets; and the guarded
spans must compute the unguarded result, bit for bit, when the inputs are finite (elsewhere, and
in compiled graphs, every call is guarded)."""

from __future__ import annotations

import itertools

import pytest
import torch

from mixc.backends.pytorch.kernels.common import _guarded_spans
from mixc.backends.pytorch.kernels.delta import _delta_span
from mixc.backends.pytorch.kernels.diagonal import _diagonal_span
from mixc.backends.pytorch.kernels.dplr import chunk_dplr
from mixc.backends.pytorch.kernels.scalar_decay import _scalar_decay_span

B, NH, T, DK, DV, CHUNK = 2, 2, 19, 5, 3, 8


def _seqs(kind, seed=0):
    """(span function, its seqs [q, k, v, ...] with the gates' and beta's names) for a kernel."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    def gate(*shape):
        return torch.nn.functional.logsigmoid(randn(*shape) + 2)

    q, k, v = randn(B, NH, T, DK), randn(B, NH, T, DK), randn(B, NH, T, DV)
    if kind == "linear attention":
        return _scalar_decay_span, {"q": q, "k": k, "v": v, "g": None}
    if kind == "scalar decay":
        return _scalar_decay_span, {"q": q, "k": k, "v": v, "g": gate(B, NH, T)}
    if kind in ("key-side", "value-side", "both sides"):
        gk = gate(B, NH, T, DK) if kind != "value-side" else None
        gv = gate(B, NH, T, DV) if kind != "key-side" else None
        return _diagonal_span, {"q": q, "k": k, "v": v, "gk": gk, "gv": gv}
    k = torch.nn.functional.normalize(k, dim=-1)
    beta = torch.sigmoid(randn(B, NH, T))
    g = gate(B, NH, T) if kind == "gated delta" else None
    return _delta_span, {"q": q, "k": k, "v": v, "beta": beta, "g": g}


KINDS = [
    "linear attention",
    "scalar decay",
    "key-side",
    "value-side",
    "both sides",
    "delta",
    "gated delta",
]


@pytest.mark.parametrize("kind", KINDS)
def test_guarded_spans_compute_the_unguarded_result_on_finite_inputs(kind):
    span_fn, seqs = _seqs(kind)
    state = torch.randn(B, NH, DK, DV, generator=torch.Generator().manual_seed(1))
    runs = {}
    for guard in (False, True):
        kept = []
        outs, final, used = _guarded_spans(span_fn, list(seqs.values()), state, CHUNK, kept, guard)
        assert used is guard
        runs[guard] = (outs[0], final, [x for own in kept for x in own])
    (o, s, kept), (o_guarded, s_guarded, kept_guarded) = runs[False], runs[True]
    assert torch.equal(o, o_guarded) and torch.equal(s, s_guarded)
    assert len(kept) == len(kept_guarded)
    assert all(torch.equal(a, b) for a, b in zip(kept, kept_guarded))
    # and on CPU, finite inputs need no second, guarded run
    assert _guarded_spans(span_fn, list(seqs.values()), state, CHUNK)[2] is False


@pytest.mark.parametrize("kind", KINDS)
def test_every_non_finite_input_reaches_the_unguarded_final_state(kind):
    """The check that decides a guarded run: a non-finite key, value, beta or gate at any token
    leaves a non-finite final state, even when a hard reset (a gate of -inf) follows it."""
    span_fn, seqs = _seqs(kind)
    state = torch.zeros(B, NH, DK, DV)
    gates = [n for n in ("g", "gk", "gv") if seqs.get(n) is not None]
    for name, x in seqs.items():
        if name == "q" or x is None:
            continue  # a query only reads the state
        values = (float("nan"), float("inf")) + (() if name in gates else (-float("inf"),))
        for value, t, reset in itertools.product(values, (0, 6, CHUNK, T - 1), (False, True)):
            changed = dict(seqs)
            changed[name] = x.clone()
            changed[name][1, 0, t] = value
            if reset and t + 1 < T:
                for gate in gates:
                    changed[gate] = changed[gate].clone()
                    changed[gate][:, :, t + 1] = -float("inf")
            _, final, _ = _guarded_spans(span_fn, list(changed.values()), state, CHUNK, None, False)
            assert not torch.isfinite(final[1, 0]).all(), (name, value, t, reset)


@pytest.mark.parametrize("chunk_size", [4, 8])
def test_dplr_outputs_before_a_growing_erase_that_overflows_keep_their_bits(chunk_size):
    """Diagonal plus low rank: a later token's erase row a_r, finite but near the float range,
    times the chunk's decays from its start (gates above 0 grow, which no stable spec has but a
    kernel may be given) overflows; W = T (exp(b_{r-1}) ⊙ A) would carry that inf back to the
    earlier rows through T's zeros above its diagonal (0 * inf = NaN). The outputs before the
    token keep their bits, and the token's own output is not finite."""
    gen = torch.Generator().manual_seed(5)
    q, k, a, b = (torch.randn(B, NH, T, DK, generator=gen) for _ in range(4))
    v = torch.randn(B, NH, T, DV, generator=gen)
    gk = torch.nn.functional.logsigmoid(torch.randn(B, NH, T, DK, generator=gen) + 2)
    state = torch.randn(B, NH, DK, DV, generator=gen)
    base, _ = chunk_dplr(q, k, v, a, b, gk, state, chunk_size)
    t = chunk_size + 2  # inside the second chunk
    a_big, gk_up = a.clone(), gk.clone()
    a_big[:, :, t + 1 :] = 3e38
    gk_up[:, :, t:] = 1.0
    o, _ = chunk_dplr(q, k, v, a_big, b, gk_up, state, chunk_size)
    assert torch.equal(o[:, :, :t].view(torch.int32), base[:, :, :t].view(torch.int32))
    assert not torch.isfinite(o[:, :, t + 2]).all()
