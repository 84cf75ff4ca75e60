"""The Triton kernels' products in the inputs' 16-bit dtype (tensor-core operands), run by
triton's interpreter: each class's kernel called with bfloat16 q, k, v (a, b) against the same
class's PyTorch kernel in float64 on the same rounded inputs (an independent implementation,
checked against the oracle by the fuzzer), within the bfloat16 rule of mixc fuzz: FACTOR times
the error of the reference's own result rounded to bfloat16 (docs/fuzzing.md#tolerances).
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

B, NH, T, K, V, CHUNK = 1, 1, 40, 32, 32, 16  # one head: the interpreter runs a program a head


def _inputs(cls, gen):
    """(the 16-bit inputs, the float32 ones, the keyword names of the float32 ones) of one
    class's kernel: q, k, v (and a, b) rounded to bfloat16; gates, betas and the initial state
    float32, as the module passes them."""
    q, k = torch.randn(B, NH, T, K, generator=gen), torch.randn(B, NH, T, K, generator=gen)
    k = torch.nn.functional.normalize(k, dim=-1)
    v = torch.randn(B, NH, T, V, generator=gen)
    s0 = torch.randn(B, NH, K, V, generator=gen)
    token_gate = -0.5 * torch.rand(B, NH, T, generator=gen)
    channel_gate = -torch.rand(B, NH, T, K, generator=gen)
    beta = torch.rand(B, NH, T, generator=gen)
    if cls == "scalar_decay":
        return [q, k, v], {"g": token_gate, "initial_state": s0}
    if cls == "delta":
        return [q, k, v * beta[..., None]], {"beta": beta, "g": token_gate, "initial_state": s0}
    if cls == "diagonal":
        return [q, k, v], {"gk": channel_gate, "initial_state": s0}
    a = -beta[..., None] * k * channel_gate.exp()
    return [q, k, v, a, k.clone()], {"gk": channel_gate, "initial_state": s0}


def _run(fn, sixteen, rest, dtype, rest_dtype):
    """Outputs, final state and every gradient of one call of fn, the 16-bit inputs in dtype and
    the others in rest_dtype, under a fixed weighting of the outputs and the state."""
    leaves = [x.detach().to(dtype).requires_grad_() for x in sixteen]
    kw = {n: x.detach().to(rest_dtype).requires_grad_() for n, x in rest.items()}
    o, state = fn(*leaves, **kw, chunk_size=CHUNK)
    weights = torch.linspace(-1, 1, o.numel(), dtype=torch.float64).reshape(o.shape)
    ((o.double() * weights).sum() + state.double().square().sum()).backward()
    return [o, state] + [x.grad for x in leaves] + [x.grad for x in kw.values()]


@pytest.mark.parametrize("cls", ["scalar_decay", "delta", "diagonal", "dplr"])
def test_bf16_operands_keep_the_bf16_accuracy_rule(cls):
    gen = torch.Generator().manual_seed(7)
    sixteen, rest = _inputs(cls, gen)
    sixteen = [x.to(torch.bfloat16) for x in sixteen]  # the inputs both sides see
    got = _run(_kernel("triton", cls), sixteen, rest, torch.bfloat16, torch.float32)
    want = _run(_kernel("pytorch", cls), sixteen, rest, torch.float64, torch.float64)
    assert got[0].dtype == torch.bfloat16 and got[1].dtype == torch.float32
    for i, (g, w) in enumerate(zip(got, want)):
        rounded = rel_error(w.to(torch.bfloat16), w)  # the reference's own bf16 rounding
        bound = max(FACTOR * rounded, 1e-4)
        assert rel_error(g, w) <= bound, (i, rel_error(g, w), bound)


def _kernel(backend, cls):
    module = importlib.import_module(f"mixc.backends.{backend}.kernels.{cls}")
    return getattr(module, f"chunk_{cls}")


def test_bf16_scalar_decay_backward_keeps_computed_operands_at_float32_accuracy():
    """With bfloat16 operands, the scalar-decay backward multiplies the two operands it computes
    at about float32's accuracy, each as two 16-bit parts: the decayed scores in dV = P^T dO
    (one rounding of a token's own score cost Mamba-2's dt gradient 6.1e-3 against mixc fuzz's
    bound 5.1e-3) and the decayed dO in the states' gradients (decays closer to 1 than a
    bfloat16 ulp were lost: Mamba-2's A gradient at tiny A, 1.97e-2 against 8.0e-3). The
    operands are bfloat16 values held in float32 (as a module passes them with operands=),
    the loss reads the outputs only, so dV and the initial state's gradient are these products
    alone; each must be within float32's gradient bound (1e-4) of the float64 kernel (about
    2e-3 with either operand rounded)."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 1, 16, n, generator=gen).bfloat16().float() for n in (8, 8, 4))
    g = -1e-4 * torch.rand(1, 1, 16, generator=gen)  # decays within a bfloat16 ulp of 1
    s0 = torch.randn(1, 1, 8, 4, generator=gen)
    weights = torch.randn(1, 1, 16, 4, generator=gen).bfloat16().double()

    def grads(fn, dtype, **kw):
        leaves = [x.detach().to(dtype).requires_grad_() for x in (q, k, v, s0)]
        o, _ = fn(*leaves[:3], g=g.to(dtype), initial_state=leaves[3], chunk_size=CHUNK, **kw)
        (o.double() * weights).sum().backward()
        return leaves[2].grad, leaves[3].grad

    got = grads(_kernel("triton", "scalar_decay"), torch.float32, operands=torch.bfloat16)
    want = grads(_kernel("pytorch", "scalar_decay"), torch.float64)
    for name, a, b in zip(("dv", "initial state"), got, want):
        assert rel_error(a, b) <= 1e-4, (name, rel_error(a, b))


def test_bf16_scalar_decay_gate_path_at_float32_accuracy():
    """The operands the log-gates' gradient reads, computed by the kernel, at about float32's
    accuracy too (_tl_split_dot): the decayed values written to the states the backward keeps,
    the decayed dO of the states' gradients and V D^T's D. Each rounded, Mamba-2's A gradient
    at a tiny A (terms cancelling to 1/17 of their magnitudes) failed mixc fuzz's bfloat16
    bound, 5.0e-2 against 2.8e-2. As above, two chunks: the final state, the log-gates' and
    the initial state's gradients within float32's bounds (1e-5, 1e-4) of the float64 kernel
    (dV's decayed keys and D in K D stay rounded)."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 1, 32, n, generator=gen).bfloat16().float() for n in (8, 8, 4))
    g = -1e-4 * torch.rand(1, 1, 32, generator=gen)
    s0 = torch.randn(1, 1, 8, 4, generator=gen)
    weights = torch.randn(1, 1, 32, 4, generator=gen).bfloat16().double()

    def run(fn, dtype, **kw):
        leaves = [x.detach().to(dtype).requires_grad_() for x in (q, k, v, g, s0)]
        o, final = fn(*leaves[:3], g=leaves[3], initial_state=leaves[4], chunk_size=CHUNK, **kw)
        (o.double() * weights).sum().backward()
        return final.detach(), leaves[3].grad, leaves[4].grad

    got = run(_kernel("triton", "scalar_decay"), torch.float32, operands=torch.bfloat16)
    want = run(_kernel("pytorch", "scalar_decay"), torch.float64)
    names = ("final state", "dg", "initial state")
    for name, bound, a, b in zip(names, (1e-5, 1e-4, 1e-4), got, want):
        assert rel_error(a, b) <= bound, (name, rel_error(a, b))
