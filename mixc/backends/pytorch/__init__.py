"""The PyTorch backend: a program -> a standalone module that imports only torch.

`render_module` and `KernelLibrary` are its public interface to other backends: a backend that
differs only in its kernels renders the same module around a library of its own.
"""

from mixc.backends.pytorch import kernels
from mixc.backends.pytorch.module import KernelLibrary, missing_kernels, render_module
from mixc.lowering.program import Program

__all__ = ["BACKEND", "LIBRARY", "KernelLibrary", "PyTorchBackend", "refusal", "render_module"]

#: The kernels of this package, which a generated module copies.
LIBRARY = KernelLibrary(
    frozenset(kernels.KERNELS),
    kernels.DEFINITIONS,
    ("torch",),
    turned=kernels.TURNED,
    ordered=kernels.ORDERED,
    decayed=kernels.DECAYED,
    diagonal=kernels.DIAGONAL,
)


def refusal(program: Program, library: KernelLibrary, backend: str) -> str | None:
    """Why a module rendered around `library` cannot compute `program` (None: it can)."""
    outputs = program.mixer.outputs
    if len(outputs) != 1:
        names = ", ".join(e.target for e in outputs)
        return f"NYI: a compiled module returns one output; this spec has {len(outputs)} ({names})"
    missing = missing_kernels(program, library)
    if missing:
        return f"NYI: the {backend} backend has no kernel {missing[0]}"
    return None


class PyTorchBackend:
    """Renders every form with the pure-PyTorch kernels."""

    name = "pytorch"

    def supports(self, program: Program) -> str | None:
        return refusal(program, LIBRARY, "PyTorch")

    def render(self, program: Program) -> str:
        return render_module(program, LIBRARY)

    def kernel_notes(self, program: Program) -> tuple[str, ...]:
        return ()


BACKEND = PyTorchBackend()
