"""The Triton backend's emitter: the PyTorch backend's module, with fused Triton kernels.

The generated module is the PyTorch backend's (the same functions, layout, dtypes, states,
varlen and errors; the spec-specific part, its gates, betas and feature maps, stays PyTorch), but
a group whose class has a Triton kernel (`kernels/X.py` defines `chunk_X`) calls it instead of the
PyTorch one. Every other kernel, the quadratic forms and the recurrence stay PyTorch; `fallbacks`
says which groups those are and why, for `explain`. The module imports torch and triton.
"""

from __future__ import annotations

from mixc.analysis.plan import Plan
from mixc.backends.pytorch import emitter as _torch_emitter
from mixc.backends.triton import kernels as _triton_kernels

NAME = "triton"


def supports(plan: Plan) -> str | None:
    """None if this backend compiles `plan` (whatever the PyTorch backend compiles: a class
    without a Triton kernel runs the PyTorch one); otherwise the reason."""
    return _torch_emitter.supports(plan)


def kernel_notes(plan: Plan) -> tuple[str, ...]:
    """For `explain`: one line per group saying which kernel its chunked form runs, and for a
    group that falls back to the PyTorch kernel, why. The other forms are PyTorch throughout."""
    if not plan.chunkable:
        return ("no chunked form: every form is PyTorch (recurrent and step loops)",)
    if not plan.groups:
        return ("no state: every form is PyTorch (the output, token by token or all at once)",)
    lines = []
    for group in plan.groups:
        stable = group.log_scale is not None  # a write scale carried in log space
        kernel = _torch_emitter._stable_kernel(group) if stable else f"chunk_{group.kernel}"
        what = f"{' and '.join(group.states)} ({group.transition.label})"
        left = _triton_kernels.PYTORCH_ARGS.get(kernel, {})
        left = [left[a.name] for a in group.args if a.expr is not None and a.name in left]
        if left:
            lines.append(
                f"{what}: {kernel} runs the PyTorch kernel's chunked form: its Triton kernel "
                f"has no {' and '.join(left)} yet"
            )
        elif kernel in _triton_kernels.KERNELS:
            lines.append(f"{what}: {kernel} runs fused Triton kernels, forward and backward")
        else:
            have = ", ".join(_triton_kernels.KERNELS)
            lines.append(
                f"{what}: falls back to the PyTorch kernel {kernel}: the Triton backend has no "
                f"such kernel yet (it has {have})"
            )
    return tuple(lines)


def emit(plan: Plan) -> str:
    """The generated module's source text (deterministic), for a plan this backend `supports`."""
    return _Module(plan).source()


class _Module(_torch_emitter._Module):
    kernels = _triton_kernels
    imports = ("torch", "triton", "triton.language as tl")
