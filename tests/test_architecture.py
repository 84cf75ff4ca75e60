"""The package's shape: size limits on modules, classes and functions, and which packages may
import which (the pipeline's layers). Both keep mixc readable as it grows: a newcomer finds a
piece by its module's name and reads it whole, and a stage never reaches into a later one.

A breach that is being mended now is listed in PENDING_SIZES or PENDING_IMPORTS with the work
that mends it. Those lists only shrink: an entry that no longer breaches fails its test until it
is removed, and a new breach is never added to them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from tests.mixers import ROOT
from tests.sources import MODULES, imports

# ----------------------------------------------------------------------------- sizes

#: The most lines (docstring included; ast's end_lineno - lineno + 1) of each kind of piece.
LIMITS = {"module": 600, "class": 300, "function": 60}

#: Pieces over their limit that are being split now: "path" for a module, "path:Qual.name" for a
#: class or function, each with the work that splits it. Empty: every piece is within its limit.
PENDING_SIZES: dict[str, str] = {}


def _pieces(tree: ast.Module) -> Iterator[tuple[str, str, int]]:
    """(kind, qualified name, lines) of every class and function, nested ones included."""

    def visit(node: ast.AST, prefix: str) -> Iterator[tuple[str, str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                name = prefix + child.name
                kind = "class" if isinstance(child, ast.ClassDef) else "function"
                yield kind, name, child.end_lineno - child.lineno + 1
                yield from visit(child, name + ".")
            else:
                yield from visit(child, prefix)

    yield from visit(tree, "")


def _oversized() -> dict[str, str]:
    """Every piece of mixc over its limit, by its PENDING_SIZES key: what it is and how long."""
    found = {}
    for path in MODULES.values():
        where = path.relative_to(ROOT).as_posix()
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > LIMITS["module"]:
            found[where] = f"module {where} has {lines} lines (limit {LIMITS['module']})"
        for kind, name, lines in _pieces(ast.parse(text)):
            if lines > LIMITS[kind]:
                found[f"{where}:{name}"] = (
                    f"{kind} {name} in {where} has {lines} lines (limit {LIMITS[kind]})"
                )
    return found


def test_modules_classes_and_functions_are_within_their_size_limits():
    over = [what for key, what in sorted(_oversized().items()) if key not in PENDING_SIZES]
    assert not over, "split by meaning:\n" + "\n".join(over)


def test_every_pending_size_breach_still_breaches():
    mended = sorted(set(PENDING_SIZES) - set(_oversized()))
    assert not mended, "within its limit now; remove it from PENDING_SIZES:\n" + "\n".join(mended)


# ----------------------------------------------------------------------------- layers

#: The pipeline's layers, first to last: a module imports modules of its own layer or earlier
#: ones, never later ones. A name stands for that module or package and all inside it; the
#: longest name that holds a module decides its layer.
LAYERS: tuple[tuple[str, ...], ...] = (
    # what every stage reads: errors, files, memory checks, and the IR with its built-ins
    (
        "mixc.errors",
        "mixc.files",
        "mixc.version",
        "mixc.resources",
        "mixc.frontend.ir",
        "mixc.frontend.builtins",
    ),
    ("mixc.frontend",),  # parse and verify: spec text to a checked Spec
    ("mixc.algebra",),  # expansion, canonical forms, intervals
    ("mixc.transitions",),  # the transition classes
    ("mixc.analysis",),  # the plan
    ("mixc.lowering",),  # a plan to what a backend prints
    ("mixc.backends",),  # code generators
    ("mixc", "mixc.driver"),  # the compiler's entry points
    # what uses the compiler, which may use one another: checks, tools and the layers
    (
        "mixc.oracle",
        "mixc.check",
        "mixc.tools",
        "mixc.nn",
        "mixc.layer_roles",
        "mixc.layer_checks",
        "mixc.layer_cache",
        "mixc.layer_padding",
        "mixc.layer_init",
        "mixc.attention",
        "mixc.model",
        "mixc.hf",
        "mixc.distributed",
    ),
    ("mixc.cli", "mixc.cli_arguments", "mixc.__main__"),  # the command line, over everything
)

#: Imports the order of LAYERS allows that the design forbids: (importer, imported, why).
FORBIDDEN = (
    (
        "mixc.backends",
        ("mixc.algebra", "mixc.analysis"),
        "a backend renders the program the lowering gives it: it reads no plan and rewrites no "
        "expression",
    ),
    (
        "mixc.oracle",
        (
            "mixc.algebra",
            "mixc.transitions",
            "mixc.analysis",
            "mixc.lowering",
            "mixc.backends",
            "mixc.driver",
        ),
        "the oracle interprets the spec by itself, sharing nothing with what it checks",
    ),
)

#: Forbidden imports being removed now, by (importer, imported) names, each with the work that
#: removes it.
PENDING_IMPORTS: dict[tuple[str, str], str] = {}


def _within(module: str, name: str) -> bool:
    """Whether `module` is `name` or inside it ("mixc" holds only the package's __init__)."""
    return module == name or (name != "mixc" and module.startswith(name + "."))


def _layer(module: str) -> tuple[int, str]:
    """The index of `module`'s layer and the name in LAYERS that put it there."""
    found = [(len(n), i, n) for i, layer in enumerate(LAYERS) for n in layer if _within(module, n)]
    assert found, f"{module} is in no layer: add it to LAYERS in {__name__}"
    _, index, name = max(found)
    return index, name


def _breaches() -> dict[tuple[str, str], str]:
    """Every import of one module by another that the layers forbid, with why."""
    found = {}
    for module, path in MODULES.items():
        where = path.relative_to(ROOT).as_posix()
        mine, my_name = _layer(module)
        for dep in sorted(imports(path)):
            theirs, their_name = _layer(dep)
            if theirs > mine:
                found[module, dep] = (
                    f"{where} imports {dep}: {their_name} is a later layer than {my_name}"
                )
            for importer, imported, why in FORBIDDEN:
                if _within(module, importer) and any(_within(dep, n) for n in imported):
                    found[module, dep] = f"{where} imports {dep}: {why}"
    return found


def _pending(importer: str, imported: str) -> tuple[str, str] | None:
    """The PENDING_IMPORTS entry that covers this import, if any."""
    for entry in PENDING_IMPORTS:
        if _within(importer, entry[0]) and _within(imported, entry[1]):
            return entry
    return None


def test_every_module_imports_only_its_own_layer_or_earlier_ones():
    breaches = [why for edge, why in sorted(_breaches().items()) if _pending(*edge) is None]
    assert not breaches, "\n".join(breaches)


def test_every_pending_import_is_still_made():
    made = {_pending(*edge) for edge in _breaches()}
    gone = [f"{a} -> {b}" for a, b in sorted(set(PENDING_IMPORTS) - made)]
    assert not gone, "no longer imported; remove it from PENDING_IMPORTS:\n" + "\n".join(gone)
