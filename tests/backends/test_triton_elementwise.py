"""The Triton scan of the elementwise-gate class against the PyTorch kernel in float64 (checked
against the oracle by the fuzzer), in triton's interpreter: the gate's broadcast shapes the
module passes (Mamba-1's per-token vector times a per-head matrix, a full gate, a gate constant
in time), a hard reset, two chunks (the second part-filled) from an initial state; outputs,
state and every gradient."""

from __future__ import annotations

import os

import pytest
import torch

triton = pytest.importorskip("triton", reason="the Triton backend needs triton (mixc[triton])")
if os.environ.get("TRITON_INTERPRET") != "1":  # pragma: no cover - set by tests/conftest.py
    pytest.skip(
        "the Triton kernels run on CPU only in triton's interpreter", allow_module_level=True
    )

from mixc.backends.pytorch.kernels.elementwise import chunk_elementwise as torch_kernel  # noqa: E402
from mixc.backends.triton.kernels.elementwise import chunk_elementwise as triton_kernel  # noqa: E402

pytestmark = pytest.mark.triton

#: Two value blocks of 32 (the second masked), and two chunks of 16: the interpreter's time is
#: programs (value blocks x sequences x heads) times tokens, each token a step of the scan; a
#: third chunk (T = 37 before) passes its state on as the second does.
B, NH, T, K, V = 2, 2, 24, 8, 40


def _gates(case, gen):
    if case == "dt times A":
        return torch.rand(B, NH, T, 1, V, generator=gen), -torch.rand(1, NH, 1, K, V, generator=gen)
    if case == "full with a hard reset":
        g = -torch.rand(B, NH, T, K, V, generator=gen)
        g[0, 1, 20, :3] = -float("inf")
        return g, None
    return -torch.rand(1, NH, 1, K, 1, generator=gen), None  # constant in time


def _run(fn, inputs, dtype):
    leaves = [None if x is None else x.detach().to(dtype).requires_grad_() for x in inputs]
    q, k, v, g, g_scale, s0 = leaves
    o, state = fn(q, k, v, g, g_scale=g_scale, initial_state=s0, chunk_size=16)
    weights = torch.linspace(-1, 1, o.numel(), dtype=dtype).reshape(o.shape)
    ((o * weights).sum() + state.square().sum()).backward()
    return [o, state] + [x.grad for x in leaves if x is not None]


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # exp(-inf) * 0
@pytest.mark.parametrize("case", ["dt times A", "full with a hard reset", "constant in time"])
def test_the_elementwise_scan_matches_the_pytorch_kernel_in_fp64(case):
    gen = torch.Generator().manual_seed(5)
    q, k = torch.randn(B, NH, T, K, generator=gen), torch.randn(B, NH, T, K, generator=gen)
    v, s0 = torch.randn(B, NH, T, V, generator=gen), torch.randn(B, NH, K, V, generator=gen)
    inputs = [q, k, v, *_gates(case, gen), s0]
    got = _run(triton_kernel, inputs, torch.float32)
    want = _run(torch_kernel, inputs, torch.float64)
    for g, w in zip(got, want):
        err = ((g.double() - w).norm() / w.norm()).item()
        assert err < 1e-5, err  # fp32 roundings (about 1e-7 each), not a wrong formula
