"""What the README's set-up command installs is enough: `mixc explain`, `mixc graph` (svg and
png) and `mixc fuzz` run, and print no warning, in a process that can import only mixc's base
dependencies and what they depend on (every other installed distribution is hidden, as it would
be missing from a fresh `pip install -e .`). The extras a command can still need are named in
its `--help`, and every `pip install` of an extra, in the docs, the help and the errors, names
one that exists, quoted for every shell."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from mixc.cli_arguments import build_parser
from tests.mixers import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _base_closure() -> set[str]:
    """The distributions `pip install -e .` brings: the base dependencies, and theirs (without
    extras), by their canonical names."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in PYPROJECT["dependencies"]]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen or (req.marker and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        todo += [Requirement(r) for r in metadata.requires(req.name) or ()]
    return seen


def _hidden_modules() -> list[str]:
    """Top-level modules of installed distributions outside the base closure (pytest, triton,
    transformers, ruff, ...)."""
    base = _base_closure()
    return sorted(
        top
        for top, dists in metadata.packages_distributions().items()
        if top != "mixc" and not any(canonicalize_name(d) in base for d in dists)
    )


#: Run in a fresh interpreter: hide the modules named in argv[1], then run each command in
#: argv[2] through mixc's main, failing on a non-zero exit.
BASE_ONLY = """
import contextlib, importlib.abc, io, json, sys

hidden = set(json.loads(sys.argv[1]))

class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in hidden:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Hide())
from mixc.cli import main

for argv in json.loads(sys.argv[2]):
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(argv) == 0, argv
"""


def _run_base_only(commands: list[list[str]], cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", BASE_ONLY, json.dumps(_hidden_modules()), json.dumps(commands)],
        cwd=cwd,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_base_dependencies_hide_what_the_test_extra_adds():
    hidden = _hidden_modules()
    assert "pytest" in hidden and "hypothesis" not in hidden and "numpy" not in hidden


def test_explain_graph_and_fuzz_run_from_the_base_install_without_a_warning(tmp_path):
    spec = str(ROOT / "specs" / "deltanet.mix")
    run = _run_base_only(
        [
            ["explain", spec],
            ["graph", spec, "-o", "g.svg"],
            ["graph", spec, "-o", "g.png"],
            ["fuzz", spec, "--examples", "3"],
        ],
        tmp_path,
    )
    assert run.returncode == 0, run.stderr
    assert run.stderr == "wrote g.svg\nwrote g.png\n"  # torch imported: no NumPy warning
    assert (tmp_path / "g.svg").read_text().startswith("<?xml")


def test_explain_in_a_fresh_process_prints_no_warning():
    run = subprocess.run(
        [sys.executable, "-m", "mixc", "explain", "specs/deltanet.mix"],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and run.stdout
    assert run.stderr == ""


def _help(command: str) -> str:
    sub = build_parser()._subparsers._group_actions[0].choices[command]
    return " ".join(sub.format_help().split())


def test_each_command_that_can_need_an_extra_names_it_in_its_help():
    """`--backend triton` makes modules that import triton: compile writes one, fuzz runs one."""
    for command in ("compile", "fuzz"):
        assert "pip install 'mixc[triton]'" in _help(command), command


#: `mixc[extra]` or `.[extra]`, as a pip argument
EXTRA = re.compile(r"(['\"]?)(mixc|\.)\[([\w,-]+)\](['\"]?)")


def _texts():
    yield from (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
    yield from sorted((ROOT / "mixc").rglob("*.py"))
    yield ROOT / ".ci" / "run"


def test_every_extra_named_exists_and_is_quoted():
    """A bracket unquoted is a glob in zsh (`no matches found`): each is in single quotes."""
    extras = set(PYPROJECT["optional-dependencies"])
    found = 0
    for path in _texts():
        for match in EXTRA.finditer(path.read_text(encoding="utf-8")):
            where = f"{path.relative_to(ROOT)}: {match[0]}"
            assert set(match[3].split(",")) <= extras, f"no such extra: {where}"
            assert match[1] == match[4] == "'", f"quote it as '{match[2]}[{match[3]}]': {where}"
            found += 1
    assert found
