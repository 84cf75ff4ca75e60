"""mixc's modules as source files: each one's dotted name and path, and the mixc modules it
imports. What imports what is read from the text, never by importing (which would run the
modules and pull in torch), for the tests of the package's structure (`test_imports`,
`test_architecture`)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.mixers import ROOT

PACKAGE = ROOT / "mixc"


def module_name(path: Path) -> str:
    """mixc/check/fuzz.py -> mixc.check.fuzz; a package's __init__.py is the package."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


#: Every module of mixc by its dotted name.
MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path) -> set[str]:
    """The mixc modules `path` imports anywhere, at the top or inside a function (`from a import
    b` imports the module a.b where there is one, else a), imports for type checkers included."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return {name for name in found if name in MODULES}
