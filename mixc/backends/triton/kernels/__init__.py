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


def _takes_operands(name: str, file: str) -> bool:
    """Whether the kernel `name` of `file` takes `operands=` (the dtype of a caller's inputs
    that the module widened), read from its text."""
    for node in ast.parse((_HERE / f"{file}.py").read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return "operands" in [a.arg for a in node.args.args + node.args.kwonlyargs]
    return False


OPERANDS = tuple(name for name, file in KERNELS.items() if _takes_operands(name, file))
"""The Triton kernels whose products take the dtype of a caller's 16-bit inputs (operands=)."""

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
