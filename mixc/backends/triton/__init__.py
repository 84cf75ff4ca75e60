"""The Triton backend: the PyTorch backend's module around a kernel library in which a class
that has a fused Triton kernel (`kernels/X.py` defines `chunk_X`) runs it instead of the PyTorch
one.

The module is the PyTorch backend's (the same functions, layout, dtypes, states, varlen and
errors; the spec-specific part, its gates, betas and feature maps, stays PyTorch), rendered
through the PyTorch backend's public `render_module` with this library. Every other kernel, the
quadratic forms and the recurrence stay PyTorch; `kernel_notes` says which calls those are and
why, for `explain`. The module imports torch and triton.
"""

from mixc.backends.pytorch import LIBRARY as PYTORCH_LIBRARY
from mixc.backends.pytorch import KernelLibrary, refusal, render_module
from mixc.backends.pytorch.kernels import DEFINITIONS as PYTORCH_DEFINITIONS
from mixc.backends.pytorch.kernels import decayed, ordered
from mixc.backends.triton import kernels
from mixc.lowering.program import Program

__all__ = ["BACKEND", "LIBRARY", "TritonBackend"]

#: The PyTorch kernels, those with a Triton kernel replaced by it.
LIBRARY = KernelLibrary(
    PYTORCH_LIBRARY.kernels,
    kernels.DEFINITIONS,
    ("torch", "triton", "triton.language as tl"),
    operands=kernels.OPERANDS,
    ordered=ordered(kernels.DEFINITIONS),
    decayed=decayed(kernels.DEFINITIONS),
)


class TritonBackend:
    """Renders the PyTorch backend's module with the fused Triton kernels where a class has one."""

    name = "triton"

    def supports(self, program: Program) -> str | None:
        """Whatever the PyTorch backend renders: a class without a Triton kernel runs the
        PyTorch one."""
        return refusal(program, LIBRARY, "Triton")

    def render(self, program: Program) -> str:
        return render_module(program, LIBRARY)

    def kernel_notes(self, program: Program) -> tuple[str, ...]:
        """One line per call of the chunked form saying which kernel it runs, and for a call
        that falls back to the PyTorch kernel, why. The other forms are PyTorch throughout."""
        if program.chunk is None:
            return ("no chunked form: every form is PyTorch (recurrent and step loops)",)
        if not program.chunk.calls:
            return ("no state: every form is PyTorch (the output, token by token or all at once)",)
        return tuple(_note(call) for call in program.chunk.calls)


def _note(call) -> str:
    what = f"{' and '.join(call.states)} ({call.label})"
    kernel = call.kernel
    pytorch_args = kernels.PYTORCH_ARGS.get(kernel, {})
    passed = dict.fromkeys(a.name for step in call.steps for a in step.args if a.expr is not None)
    left = [pytorch_args[a] for a in passed if a in pytorch_args]
    if left:
        return (
            f"{what}: {kernel} runs the PyTorch kernel's chunked form: its Triton kernel "
            f"has no {' and '.join(left)} yet"
        )
    if kernel in kernels.KERNELS:
        return f"{what}: {kernel} runs fused Triton kernels, forward and backward"
    have = ", ".join(kernels.KERNELS)
    inner = [k for k in _kernels_called(kernel) if k in kernels.KERNELS]
    inside = f", which calls the Triton backend's {' and '.join(inner)}" if inner else ""
    return (
        f"{what}: falls back to the PyTorch kernel {kernel}{inside}: the Triton backend has no "
        f"{kernel} yet (it has {have})"
    )


def _kernels_called(kernel: str) -> list[str]:
    """The other public kernels a PyTorch kernel calls (chunk_dplr_value: two passes)."""
    used = PYTORCH_DEFINITIONS[kernel][2] if kernel in PYTORCH_DEFINITIONS else ()
    return sorted(n for n in used if n in PYTORCH_LIBRARY.kernels and n != kernel)


BACKEND = TritonBackend()
