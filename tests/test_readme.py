"""The README's examples are what mixc prints: every `console` block whose commands are
`mixc check` runs, in a folder holding the `mix` block written just before it (as the file the
command names), and must print exactly the block's output; the excerpt of generated code after
the `mixc compile` example is what that command writes."""

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


def test_readme_generated_code_excerpt_is_what_mixc_compile_writes() -> None:
    """Each line of the python block after `mixc compile specs/X.mix` (but the `...` elisions
    and the wrapped signature, shown on one line) is a line of the module mixc writes for X,
    and the lines come in the module's order."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    found = re.search(r"\$ mixc compile specs/(\w+)\.mix .*?```python\n(.*?)```", text, re.S)
    assert found, "no `mixc compile` example followed by a python block in README.md"
    import mixc

    module_lines = mixc.compile_source(ROOT / "specs" / f"{found[1]}.mix").splitlines()
    module_lines = [line.rstrip() for line in module_lines]
    position = 0
    for line in found[2].splitlines():
        if not line.strip() or line.strip() == "..." or line.startswith("def chunk("):
            continue
        assert line in module_lines[position:], f"README excerpt line not in the module: {line!r}"
        position = module_lines.index(line, position) + 1


def test_ci_runs_the_readme_test_command_verbatim():
    """What a new user is told to run is what CI runs: the block after "Run the tests:" is a
    line of .ci/run, as written."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    after = readme.split("\nRun the tests:\n", 1)[1]
    (command,) = BLOCK.findall(after)[0][1].strip().splitlines()
    assert command in (ROOT / ".ci/run").read_text(encoding="utf-8").splitlines()
