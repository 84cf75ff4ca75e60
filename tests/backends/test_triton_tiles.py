"""The Triton kernels' tiling, run by triton's interpreter: a state wider than one program's key
block (the scalar- and diagonal-decay kernels split the key rows in blocks of 64, one program
each, and sum their outputs' parts after the launch), with partial key and value blocks, against
the same class's PyTorch kernel in float64 (checked against the oracle by the fuzzer); and the
dtype of a module's 16-bit inputs reaching the kernels' products.
"""

from __future__ import annotations

import importlib
import os

import pytest
import torch

from mixc.check.tolerance import FACTOR, rel_error

triton = pytest.importorskip("triton", reason="the Triton backend needs triton (mixc[triton])")
if os.environ.get("TRITON_INTERPRET") != "1":  # pragma: no cover - set by tests/conftest.py
    pytest.skip(
        "the Triton kernels run on CPU only in triton's interpreter", allow_module_level=True
    )

pytestmark = pytest.mark.triton

#: Three key blocks of 64 (the last partial), two value blocks (the last partial), two chunks.
B, NH, T, K, V, CHUNK = 1, 1, 21, 136, 24, 16


def _kernel(backend, cls):
    module = importlib.import_module(f"mixc.backends.{backend}.kernels.{cls}")
    return getattr(module, f"chunk_{cls}")


def _inputs(cls, gen):
    """q, k, v, the gate (per token, or per key channel with a hard reset and decays near 1
    beside strong ones) and an initial state, float64."""
    q, k = torch.randn(B, NH, T, K, generator=gen), torch.randn(B, NH, T, K, generator=gen)
    k = torch.nn.functional.normalize(k, dim=-1)
    v = torch.randn(B, NH, T, V, generator=gen)
    s0 = torch.randn(B, NH, K, V, generator=gen)
    if cls == "scalar_decay":
        gates = {"g": -torch.rand(B, NH, T, generator=gen)}
    else:
        gk = -5 * torch.rand(B, NH, T, K, generator=gen)
        gk[..., ::3] = -1e-3 * torch.rand(B, NH, T, (K + 2) // 3, generator=gen)
        gk[0, 0, 9, 70:90] = -float("inf")  # a hard reset of rows in the second key block
        gates = {"gk": gk}
    return [x.double() for x in (q, k, v)], {**gates, "initial_state": s0.double()}


def _run(fn, sixteen, rest, dtype, **options):
    """Outputs, final state and every gradient of one call, under a fixed weighting."""
    leaves = [x.detach().to(dtype).requires_grad_() for x in sixteen]
    kw = {n: x.detach().to(dtype).requires_grad_() for n, x in rest.items()}
    o, state = fn(*leaves, **kw, chunk_size=CHUNK, **options)
    weights = torch.linspace(-1, 1, o.numel(), dtype=torch.float64).reshape(o.shape)
    ((o.double() * weights).sum() + state.double().square().sum()).backward()
    return [o, state] + [x.grad for x in leaves] + [x.grad for x in kw.values()]


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # exp(-1e30) * 0
@pytest.mark.parametrize("cls", ["scalar_decay", "diagonal"])
def test_key_blocks_sum_to_the_whole_state_fp32(cls):
    gen = torch.Generator().manual_seed(11)
    sixteen, rest = _inputs(cls, gen)
    got = _run(_kernel("triton", cls), sixteen, rest, torch.float32)
    want = _run(_kernel("pytorch", cls), sixteen, rest, torch.float64)
    for i, (g, w) in enumerate(zip(got, want)):
        err = (g.double() - w).norm() / w.norm()
        assert err < 1e-5, (i, err)  # fp32 roundings (about 1e-7 each), not a wrong formula


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("cls", ["scalar_decay", "diagonal"])
def test_float32_inputs_of_bf16_callers_multiply_in_bf16(cls):
    """Float32 tensors that hold a bfloat16 caller's inputs, with operands=torch.bfloat16 (what
    a generated module passes), give what bfloat16 tensors give (the same products, on the
    same rounded operands), within the bfloat16 rule of mixc fuzz against float64; without
    operands they multiply in float32."""
    gen = torch.Generator().manual_seed(5)
    sixteen, rest = _inputs(cls, gen)
    sixteen = [x.to(torch.bfloat16).double() for x in sixteen]
    fn = _kernel("triton", cls)
    widened = _run(fn, sixteen, rest, torch.float32, operands=torch.bfloat16)
    plain = _run(fn, sixteen, rest, torch.float32)
    want = _run(_kernel("pytorch", cls), sixteen, rest, torch.float64)
    for i, (g, p, w) in enumerate(zip(widened, plain, want)):
        bound = max(FACTOR * rel_error(w.to(torch.bfloat16), w), 1e-4)
        assert rel_error(g, w) <= bound, (i, rel_error(g, w), bound)
        assert rel_error(p, w) < 1e-5  # float32 products
    # the products did round: float32 ones are far closer to float64 than bf16 ones
    assert rel_error(widened[0], want[0]) > 10 * rel_error(plain[0], want[0])


@pytest.mark.slow  # about 18 s of CPU in the interpreter
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # exp(-1e30) * 0
def test_dplr_key_and_value_blocks_fp32():
    """The DPLR kernels' loops over blocks: the forward's scores three key blocks of 64 (the
    last partial), the backward's key-side gradients five of 32 and two value blocks of 32 a
    chunk, the state passes two value blocks (the last partial); outputs, final state and every
    gradient against the PyTorch kernel in float64."""
    gen = torch.Generator().manual_seed(7)
    (q, k, _), rest = _inputs("dplr", gen)
    v = torch.randn(B, NH, T, 40, generator=gen).double()
    rest["initial_state"] = torch.randn(B, NH, K, 40, generator=gen).double()
    beta = torch.rand(B, NH, T, 1, generator=gen).double()
    a, b = -beta * k * rest["gk"].clamp(min=-30).exp(), k.clone()
    got = _run(_kernel("triton", "dplr"), [q, k, v, a, b], rest, torch.float32)
    want = _run(_kernel("pytorch", "dplr"), [q, k, v, a, b], rest, torch.float64)
    for i, (g, w) in enumerate(zip(got, want)):
        err = (g.double() - w).norm() / w.norm()
        assert err < 1e-5, (i, err)  # fp32 roundings (about 1e-7 each), not a wrong formula


@pytest.mark.slow  # about 10 s of CPU in the interpreter
def test_delta_key_and_value_blocks_fp32():
    """The delta rule's backward over its blocks: dQ, dK and dW three key blocks of 64 (the
    last partial; the gates' gradient summed over their parts), the value columns two blocks
    of 32 (the last partial), 2 x 3 heads (each head's chunks in the kept tiles); outputs,
    final state and every gradient, the gates' included, against the PyTorch kernel in
    float64."""
    gen = torch.Generator().manual_seed(5)
    shape = (2, 3, T)
    q, k = torch.randn(*shape, K, generator=gen), torch.randn(*shape, K, generator=gen)
    k = torch.nn.functional.normalize(k, dim=-1)
    v = torch.randn(*shape, 40, generator=gen)
    rest = {
        "g": -torch.rand(*shape, generator=gen),
        "initial_state": torch.randn(2, 3, K, 40, generator=gen),
    }
    beta = torch.rand(*shape, generator=gen)
    inputs = [x.double() for x in (q, k, v, beta)]
    rest = {n: x.double() for n, x in rest.items()}
    got = _run(_kernel("triton", "delta"), inputs, rest, torch.float32)
    want = _run(_kernel("pytorch", "delta"), inputs, rest, torch.float64)
    for i, (g, w) in enumerate(zip(got, want)):
        err = (g.double() - w).norm() / w.norm()
        assert err < 1e-5, (i, err)  # fp32 roundings (about 1e-7 each), not a wrong formula
