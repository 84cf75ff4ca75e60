"""What imports what: the front end has no import cycle, and the commands that only read a spec
(check, explain, graph) run without importing torch."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

from tests.mixers import ROOT

FRONTEND = ROOT / "mixc" / "frontend"


def _frontend_imports(path) -> set[str]:
    """The frontend modules `path` imports anywhere, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return {name.removeprefix("mixc.frontend.") for name in found if "mixc.frontend." in name}


def test_the_frontend_has_no_import_cycle():
    graph = {p.stem: _frontend_imports(p) for p in FRONTEND.glob("*.py")}
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


def test_reading_commands_do_not_import_torch(tmp_path):
    spec = str(ROOT / "specs" / "deltanet.mix")
    commands = [["check", "-q", spec], ["explain", spec], ["graph", spec, "-o", "g.svg"]]
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
