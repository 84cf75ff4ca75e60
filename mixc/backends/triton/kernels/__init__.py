"""The Triton kernels, and the definitions a generated module copies.

Each class file here defines the class's `chunk_X` kernel as fused Triton kernels, forward and
backward, under the same name and signature as the PyTorch kernel it replaces; common.py holds
what they share. A generated module carries the PyTorch kernels' definitions with these in
place of the ones they replace: the quadratic forms and the classes without a Triton kernel keep
the PyTorch kernels. As in the PyTorch package, the files are read as text, so compiling a spec
needs neither torch nor triton.
"""

import ast
from pathlib import Path

from mixc.backends.pytorch import kernels as _torch_kernels

_HERE = Path(__file__).parent

#: The class files: every module of this package but common, in name order.
CLASS_FILES = tuple(
    sorted(p.stem for p in _HERE.glob("*.py") if p.stem not in ("__init__", "common"))
)

_OWN = _torch_kernels.definitions(("common", *CLASS_FILES), _HERE)

KERNELS: dict[str, str] = {
    name: file
    for name, (file, _, _) in _OWN.items()
    if file != "common" and not name.startswith("_")
}
"""The Triton kernels, each with the class file that defines it."""


def _pytorch_args(file: str) -> dict[str, str]:
    """A class file's PYTORCH_ARGS (the keyword arguments its kernel leaves to the PyTorch
    kernel, and what they are), read from its text; {} if it has none."""
    for node in ast.parse((_HERE / f"{file}.py").read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets] == ["PYTORCH_ARGS"]:
            return ast.literal_eval(node.value)
    return {}


PYTORCH_ARGS: dict[str, dict[str, str]] = {name: _pytorch_args(f) for name, f in KERNELS.items()}
"""Per Triton kernel, the arguments with which it runs the PyTorch kernel's chunked form."""


#: The arguments a kernel multiplies on the tensor cores, by the names every class's kernel gives
#: them: queries, keys, values and DPLR's a and b (gates, betas and states stay float32).
MULTIPLIED = ("q", "k", "v", "a", "b")


def _rounded_operands(name: str, file: str) -> tuple[str, ...] | None:
    """The arguments of kernel `name` of `file` that it rounds to a caller's 16-bit dtype when
    given `operands=` (those among MULTIPLIED it takes), read from its text; None where it takes
    no `operands=`."""
    for node in ast.parse((_HERE / f"{file}.py").read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            args = [a.arg for a in node.args.args + node.args.kwonlyargs]
            return tuple(a for a in args if a in MULTIPLIED) if "operands" in args else None
    return None


#: Kernels that take `operands=` but that a generated module calls without it: their transition
#: subtracts a product of the state from the state ((I - beta k k^T) S, (diag + b a^T) S), and
#: with 16-bit operands that product rounds the state (and the chunk's W, U or sub-chunk
#: factors), which mixc fuzz's bfloat16 model (the caller's operands only) does not cover:
#: DeltaNet's final state at K = 1, beta near 1 (an overwrite, exact in bfloat16) erred 4.5e-3
#: against 1e-5. Their products multiply float32 (docs/triton.md).
STATE_ROUNDED = ("chunk_delta", "chunk_dplr")

OPERANDS: dict[str, tuple[str, ...]] = {
    name: found
    for name, file in KERNELS.items()
    if name not in STATE_ROUNDED and (found := _rounded_operands(name, file)) is not None
}
"""The Triton kernels a generated module calls with `operands=` (their products then take the
dtype of a caller's 16-bit inputs), each with the arguments it then rounds to that dtype."""

#: The PyTorch kernels' definitions, those of KERNELS replaced by the Triton ones (the others of
#: this package added after them).
DEFINITIONS = {
    **{n: d for n, d in _torch_kernels.DEFINITIONS.items() if n not in _OWN},
    **_OWN,
}
_clashes = sorted(set(_OWN) & set(_torch_kernels.DEFINITIONS) - set(KERNELS))
if _clashes:  # a helper of both backends: a generated module would keep only one of them
    raise RuntimeError(f"{', '.join(_clashes)}: defined by both the PyTorch and Triton kernels")


def kernel_source(names) -> str:
    """The source text a generated module needs to call the named kernels: the Triton ones where
    this package has them, the PyTorch ones otherwise (see the PyTorch package's kernel_source)."""
    return _torch_kernels.kernel_source(names, DEFINITIONS)
