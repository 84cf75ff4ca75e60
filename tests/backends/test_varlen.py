"""Packed variable-length batches: cu_seqlens results equal running each sequence alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mixc
from tests.mixers import VARIANTS, positional, random_states, rel, spec_inputs

ROOT = Path(__file__).parents[2]
SPECS = [pytest.param(p, id=p.stem) for p in sorted(ROOT.glob("specs/*.mix"))] + [
    # inputs at t-1: the shift restarts at each sequence from its own carried token
    pytest.param(mixc.Source(VARIANTS["token_shift"]), id="token_shift")
]


def _alone(module, args, n_inputs, start, end, state):
    piece = [a[:, start:end] if i < n_inputs else a for i, a in enumerate(args)]
    return module.recurrent(*piece, initial_state=state, output_final_state=True)


@pytest.mark.parametrize("form", ["chunk", "recurrent"])
@pytest.mark.parametrize("path", SPECS)
def test_packed_sequences_equal_each_sequence_alone(path, form):
    if form == "chunk" and not mixc.analyze(mixc.load_spec(path)).chunkable:
        pytest.skip("no chunked form")
    check_packed(path, "pytorch", form)


def check_packed(path, backend, form, heads=2):
    """`form` of the module `backend` compiles, on packed sequences of lengths 1, 0, 17, 3 and
    19 (of `heads` heads), against the recurrent form on each sequence alone."""
    spec, module = mixc.load_spec(path), mixc.load(path, backend)
    cu = torch.tensor([0, 1, 1, 18, 21, 40])  # lengths 1, 0 (empty), 17, 3, 19
    inputs, params = spec_inputs(spec, B=1, T=40, NH=heads)
    args = positional(spec, inputs, params)
    states = random_states(spec, B=5, NH=heads)
    init = tuple(states[s.name] for s in spec.mixer.carried)
    init = init[0] if len(init) == 1 else init
    kw = {"chunk_size": 8} if form == "chunk" else {}
    y, finals = getattr(module, form)(
        *args, initial_state=init, output_final_state=True, cu_seqlens=cu, **kw
    )
    finals = finals if isinstance(finals, tuple) else (finals,)
    n = len(spec.mixer.inputs)
    for i in range(len(cu) - 1):
        start, end = cu[i].item(), cu[i + 1].item()
        own = tuple(states[s.name][i : i + 1] for s in spec.mixer.carried)
        if end == start:
            for got, want in zip(finals, own):
                assert torch.equal(
                    got[i : i + 1], want.to(got.dtype) if want.dim() == got.dim() else want
                )
            continue
        y_i, s_i = _alone(module, args, n, start, end, own[0] if len(own) == 1 else own)
        s_i = s_i if isinstance(s_i, tuple) else (s_i,)
        assert rel(y[:, start:end], y_i) <= 1e-12, f"sequence {i}"
        for got, want in zip(finals, s_i):
            assert rel(got[i : i + 1], want) <= 1e-12, f"final state of sequence {i}"


def test_bad_cu_seqlens_are_refused():
    path = ROOT / "specs/gla.mix"
    spec, module = mixc.load_spec(path), mixc.load(path)
    args = positional(spec, *spec_inputs(spec, B=1, T=10, NH=2))
    with pytest.raises(
        mixc.MixcError,
        match=r"cu_seqlens: expected non-decreasing offsets from 0 to T = 10, got \[0, 6, 4, 10\]",
    ):
        module.chunk(*args, cu_seqlens=torch.tensor([0, 6, 4, 10]))
    with pytest.raises(
        mixc.MixcError,
        match=r"cu_seqlens: expected non-decreasing offsets from 0 to T = 10, got \[0, 9\]",
    ):
        module.recurrent(*args, cu_seqlens=torch.tensor([0, 9]))
    with pytest.raises(mixc.MixcError, match="cu_seqlens: expected a 1-D integer tensor"):
        module.chunk(*args, cu_seqlens=torch.tensor([0.0, 10.0]))
    args2 = positional(spec, *spec_inputs(spec, B=2, T=10, NH=2))
    with pytest.raises(mixc.MixcError, match="cu_seqlens: packed sequences need B = 1, got B = 2"):
        module.chunk(*args2, cu_seqlens=torch.tensor([0, 10]))
    with pytest.raises(
        mixc.MixcError, match=r"initial_state H: expected shape \[B, NH, V, K\] = \[3, 2, 6, 8\]"
    ):
        module.chunk(
            *args,
            cu_seqlens=torch.tensor([0, 2, 5, 10]),
            initial_state=torch.zeros(1, 2, 6, 8, dtype=torch.float64),
        )


@pytest.mark.parametrize("path", SPECS)
def test_packed_gradients_equal_the_recurrent_forms(path):
    """Gradients through a packed batch: the chunked form's (its kernel's own backward, for
    the scalar-decay and delta classes) equal the recurrent form's, for every input,
    parameter and initial state."""
    spec, module = mixc.load_spec(path), mixc.load(path)
    if not mixc.analyze(spec).chunkable:
        pytest.skip("no chunked form")
    cu = torch.tensor([0, 1, 1, 18, 21, 40])  # lengths 1, 0 (empty), 17, 3, 19
    inputs, params = spec_inputs(spec, B=1, T=40, NH=2)
    args = positional(spec, inputs, params)
    states = random_states(spec, B=5, NH=2)
    init = [states[s.name] for s in spec.mixer.carried]

    def grads(form, **kw):
        leaves = [a.clone().requires_grad_(True) for a in args + init]
        own = leaves[len(args) :]
        y, finals = getattr(module, form)(
            *leaves[: len(args)],
            initial_state=own[0] if len(own) == 1 else tuple(own),
            output_final_state=True,
            cu_seqlens=cu,
            **kw,
        )
        finals = finals if isinstance(finals, tuple) else (finals,)
        cot = torch.randn(y.shape, generator=torch.Generator().manual_seed(4), dtype=y.dtype)
        loss = (y * cot).sum() + sum((f * (i + 1)).sum() for i, f in enumerate(finals))
        return torch.autograd.grad(loss, leaves)

    chunked, recurrent = grads("chunk", chunk_size=8), grads("recurrent")
    for i, (got, want) in enumerate(zip(chunked, recurrent, strict=True)):
        assert rel(got, want) <= 1e-10, f"gradient of argument {i}"
