"""What imports what: no module of mixc imports itself through others, and the commands that
only read a spec or write code (check, explain, graph, compile) run without importing torch."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.mixers import ROOT
from tests.sources import MODULES, imports


def test_no_module_imports_itself_through_others():
    graph = {name: imports(path) - {name} for name, path in MODULES.items()}
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
