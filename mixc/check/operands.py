"""The bfloat16 rule's model of a tensor-core kernel: the vectors a module hands a kernel to
multiply are rounded to bfloat16.

A module under test that declares `OPERANDS` (a Triton module: the kernels it calls with
`operands=`, each with the arguments that kernel then rounds to the caller's 16-bit dtype:
queries, keys, values, DPLR's a and b) multiplies bfloat16 operands even where the module
computed them in float32 from the inputs (`l2norm(k)`, `beta v`, `dt x`, DPLR's
`-beta exp(g) k`), and its backward multiplies the gradient of its output rounded too. Neither
rounding is the inputs', which the oracle sees, and both are carried through the recurrence.
`rounding_module(spec, OPERANDS)` models them in float64: the spec compiled by the PyTorch
backend, whose chunked form hands its kernels the same per-token values the lowering chose (one
lowering for every backend), with those arguments of those kernels rounded to bfloat16 on the
way in (straight through: gradients pass it unchanged, as a kernel's backward multiplies the
rounded operands) and the gradient of each kernel's output rounded on the way back. Run in
float64, its chunked form is the float64 reference with the kernels' operands rounded; beside
the same module without the rounding (which must agree with the oracle, or the model is not
used), it gives what rounding the operands costs each quantity (see `mixc.check.forms`).
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Mapping

import torch

from mixc.errors import Source
from mixc.frontend.spec import Spec

__all__ = ["declared_operands", "rounded_operands", "rounding_module"]


def rounded_operands(module: types.ModuleType) -> dict[str, tuple[str, ...]]:
    """What `module` declares it rounds: {kernel: its arguments} ({} for none)."""
    declared = getattr(module, "OPERANDS", None)
    if not isinstance(declared, Mapping):
        return {}
    return {str(k): tuple(map(str, v)) for k, v in declared.items()}


def declared_operands(text: str) -> dict[str, tuple[str, ...]]:
    """What the generated module `text` declares it rounds, read from its OPERANDS line ({} for
    none), without running it."""
    import ast

    for line in text.splitlines():
        if line.startswith("OPERANDS = "):
            return ast.literal_eval(line.removeprefix("OPERANDS = "))
    return {}


def rounding_module(
    spec: Spec, operands: Mapping[str, tuple[str, ...]]
) -> tuple[types.ModuleType, types.ModuleType]:
    """(the spec's PyTorch module, the same module whose kernels in `operands` round those
    arguments to bfloat16 first), both fresh, cached by spec text."""
    key = tuple(sorted((k, tuple(v)) for k, v in operands.items()))
    return _modules(spec.source, key)


@functools.lru_cache(maxsize=16)
def _modules(source: Source, operands: tuple) -> tuple[types.ModuleType, ...]:
    from mixc.driver import compile_source, load

    exact = load(source, "pytorch")
    rounded = types.ModuleType(f"{exact.__name__}_bf16_operands")
    exec(compile(compile_source(source, "pytorch"), exact.__file__, "exec"), rounded.__dict__)
    for kernel, names in operands:
        local = f"_{kernel}"  # a generated module calls kernel X as _X
        if callable(rounded.__dict__.get(local)):
            rounded.__dict__[local] = _rounding(rounded.__dict__[local], names)
    return exact, rounded


def _bf16(x):
    """x rounded to the nearest bfloat16, in its own dtype; autograd passes it unchanged."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        return x
    return x + (x.detach().to(torch.bfloat16).to(x.dtype) - x.detach())


class _RoundedGradient(torch.autograd.Function):
    """x as it is, its gradient rounded to the nearest bfloat16 on the way back."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.to(torch.bfloat16).to(grad.dtype)


def _rounding(kernel, names: tuple[str, ...]):
    """`kernel` with its arguments `names` rounded to bfloat16 as it is called, and the gradient
    of its output (its first result), which its backward multiplies too, as it comes back."""
    signature = inspect.signature(kernel)

    def call(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        for name in names:
            if name in bound.arguments:
                bound.arguments[name] = _bf16(bound.arguments[name])
        o, *rest = kernel(*bound.args, **bound.kwargs)
        if torch.is_grad_enabled() and o.requires_grad:
            o = _RoundedGradient.apply(o)
        return (o, *rest)

    return call
