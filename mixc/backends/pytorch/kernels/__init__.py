"""The pure-PyTorch chunked kernels, and the part of them that a generated module copies.

common.py holds what the kernels of several transition classes share; each class file named in
CLASS_FILES holds its class's public kernels and their private helpers, importing only torch and
common. A generated module imports only torch, so it carries the source text of its kernels and
of every definition they reach: kernel_source computes that set from the names each definition
uses, so no list of dependencies is kept by hand. KERNELS names the public kernels. A new class
plugs in by writing its file: every module here but common is a class file.
"""

import ast
import importlib
import inspect
import pkgutil
from collections.abc import Iterable
from types import ModuleType

#: The class files: every module of this package but common, in name order.
CLASS_FILES = tuple(sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name != "common"))


def _free_names(node: ast.FunctionDef | ast.ClassDef) -> frozenset[str]:
    """The names a top-level definition reads and binds nowhere in its body (nested functions
    included): the globals it uses. Attribute access needs no entry, since only the object it
    starts from can be a global."""
    loaded, bound = set(), set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            (loaded if isinstance(sub.ctx, ast.Load) else bound).add(sub.id)
        elif isinstance(sub, ast.arg):
            bound.add(sub.arg)
        elif isinstance(sub, ast.FunctionDef | ast.ClassDef) and sub is not node:
            bound.add(sub.name)
    return frozenset(loaded - bound)


def _definitions(modules: Iterable[ModuleType]) -> dict[str, tuple[ModuleType, frozenset[str]]]:
    """Every top-level function and class of the modules by name, with its module and the names
    it uses, in the order of the modules and, inside each, of its source (a dict keeps it)."""
    found: dict[str, tuple[ModuleType, frozenset[str]]] = {}
    for module in modules:
        for node in ast.parse(inspect.getsource(module)).body:
            if not isinstance(node, ast.FunctionDef | ast.ClassDef):
                continue
            if node.name in found:
                # a generated module would keep only the later of the two copies
                other = found[node.name][0].__name__
                raise RuntimeError(f"{node.name} is defined in {other} and {module.__name__}")
            found[node.name] = (module, _free_names(node))
    return found


_COMMON = importlib.import_module(f"{__name__}.common")
_CLASS_MODULES = tuple(importlib.import_module(f"{__name__}.{name}") for name in CLASS_FILES)
_DEFINITIONS = _definitions((_COMMON, *_CLASS_MODULES))

KERNELS: dict[str, ModuleType] = {
    name: module
    for name, (module, _) in _DEFINITIONS.items()
    if module in _CLASS_MODULES and not name.startswith("_")
}
"""The public kernels, each with the class file that defines it, in the order of CLASS_FILES."""


def _closure(names: Iterable[str]) -> set[str]:
    """The named definitions and every definition they use, directly or through others."""
    wanted = list(names)
    unknown = sorted(set(wanted) - _DEFINITIONS.keys())
    if unknown:
        raise ValueError(
            f"no kernel or kernel helper named {', '.join(unknown)}; "
            f"the kernels are {', '.join(KERNELS)}"
        )
    needed: set[str] = set()
    while wanted:
        name = wanted.pop()
        if name not in needed:
            needed.add(name)
            wanted.extend(n for n in _DEFINITIONS[name][1] if n in _DEFINITIONS)
    return needed


def kernel_source(names: Iterable[str]) -> str:
    """The source text a generated module needs to call the named kernels (helpers may be named
    too): their definitions and every definition they reach, each once, in a fixed order (common
    first, then the class files in the order of CLASS_FILES, each in its source order), separated
    by two blank lines.

    The same names, in any order, give the same text. Raises ValueError for a name that is
    neither a kernel nor a helper.
    """
    needed = _closure(names)
    return "\n\n\n".join(
        inspect.getsource(getattr(module, name)).rstrip()
        for name, (module, _) in _DEFINITIONS.items()
        if name in needed
    )
