"""The README's examples are what mixc prints: every `console` block whose commands are
`mixc check` runs, in a folder holding the `mix` block written just before it (as the file the
command names), and must print exactly the block's output."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest

from tests.mixers import ROOT

BLOCK = re.compile(r"```(\w*)\n(.*?)```", re.S)


def _examples() -> list[tuple[str | None, str]]:
    """(the mix block before it or None, the console block) for each `mixc check` example."""
    out, spec = [], None
    for kind, body in BLOCK.findall((ROOT / "README.md").read_text(encoding="utf-8")):
        if kind == "mix":
            spec = body
        elif kind == "console" and body.startswith("$ mixc check "):
            out.append((spec, body))
    return out


EXAMPLES = _examples()


def test_the_readme_has_check_examples():
    assert EXAMPLES, "no `mixc check` console block in README.md"


@pytest.mark.parametrize(("spec", "block"), EXAMPLES)
def test_readme_check_example(spec: str | None, block: str, tmp_path) -> None:
    command, _, expected = block.partition("\n")
    argv = shlex.split(command.removeprefix("$ "))
    if spec is not None:
        (tmp_path / argv[-1]).write_text(spec, encoding="utf-8")
    run = subprocess.run(
        [sys.executable, "-m", "mixc", *argv[1:]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert run.stdout + run.stderr == expected
