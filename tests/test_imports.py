"""What imports what: no module of mixc imports itself through others, and the commands that
only read a spec or write code (check, explain, graph, compile) run without importing torch."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

from tests.mixers import ROOT

PACKAGE = ROOT / "mixc"


def _module_name(path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(path) -> set[str]:
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


def test_no_module_imports_itself_through_others():
    graph = {name: _imports(path) - {name} for name, path in MODULES.items()}
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, "import cycle: " + " -> ".join((*path, module))
        if module in done:
            return
        for dep in sorted(graph.get(module, ())):
            visit(dep, (*path, module))
        done.add(module)

    for module in sorted(graph):
        visit(module, ())


def test_transition_classes_sit_below_the_analysis():
    """The classes are what the analysis consults, so they import only the language, the
    algebra and the errors (and each other): never the analysis, the backends or the tools."""
    below = ("mixc.transitions", "mixc.frontend", "mixc.algebra", "mixc.errors")
    for name, path in MODULES.items():
        if name.startswith("mixc.transitions"):
            above = sorted(m for m in _imports(path) if not m.startswith(below))
            assert not above, f"{name} imports {', '.join(above)}"


def test_commands_that_need_no_torch_do_not_import_it(tmp_path):
    spec = str(ROOT / "specs" / "deltanet.mix")
    commands = [
        ["check", "-q", spec],
        ["explain", spec],
        ["graph", spec, "-o", "g.svg"],
        ["compile", spec, "-o", "m.py"],
    ]
    code = (
        "import contextlib, io, sys\n"
        "from mixc.cli import main\n"
        f"for argv in {commands!r}:\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        assert main(argv) == 0, argv\n"
        "    if 'torch' in sys.modules:\n"
        "        print(argv[0])\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == "", f"torch imported by mixc {run.stdout.split()[0]}"
