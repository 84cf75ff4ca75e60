"""Running the code blocks of the README and of docs/*.md, as tests/test_docs.py does.

A page's fenced blocks run in order, in a fresh folder that links each file and folder at the
top of the repository (commands read them; what they write stays in the folder), with `mixc`, `python` and `pip` on the PATH standing for this checkout's mixc
under this interpreter. The first word after the fence says what a block is; every block has
one of these:

- `mix`: a spec. A first line `# NAME.mix` names it: one under `specs/` must be that shipped
  file (each of its lines a line of the file, in order); any other is written into the folder,
  for the commands after it. A spec without a name must pass `mixc check`.
- `console`: `$ COMMAND` lines, each followed by what it prints (stdout and stderr), which must
  match: a line `...` stands for any lines, and `...` inside a line for any text.
- `sh`: a script that must exit 0. A line of `.ci/run` is left to CI (the README's test
  command). `pip install ARGS` installs nothing: it checks that what ARGS ask for is installed
  here and exists (each extra of mixc's pyproject, each version), which is what the command
  would give.
- `python`: run in one namespace per page. `python excerpt FILE` is not run: each of its lines
  (but blank ones and `...`) is a line of FILE (written on the page, or in the repository), in
  order.

A further word `slow` runs a block only under `-m slow` (the page's slow test runs every block).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shlex
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

KINDS = ("mix", "console", "sh", "python")
FENCE = re.compile(r"^( *)```([^\n`]*)\n(.*?)^\1```[ \t]*$", re.M | re.S)


@dataclasses.dataclass(frozen=True)
class Block:
    page: str
    line: int
    kind: str
    flags: tuple[str, ...]
    body: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    out = []
    for match in FENCE.finditer(text):
        indent, info, body = match[1], match[2].split(), match[3]
        body = "".join(line.removeprefix(indent) for line in body.splitlines(keepends=True))
        out.append(
            Block(
                str(page.relative_to(ROOT)),
                text.count("\n", 0, match.start()) + 1,
                info[0] if info else "",
                tuple(info[1:]),
                body,
            )
        )
    return out


def ci_lines() -> set[str]:
    return set((ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines())


# ----------------------------------------------------------------------------- running a page


class Page:
    """The folder, the PATH and the Python namespace that one page's blocks share."""

    def __init__(self, folder: Path):
        self.folder = folder
        bin_dir = folder / ".bin"
        bin_dir.mkdir()
        for entry in ROOT.iterdir():  # a checkout, to commands that read it
            if not entry.name.startswith("."):
                (folder / entry.name).symlink_to(entry)
        shims = {
            "mixc": f'exec "{sys.executable}" -m mixc "$@"',
            "python": f'exec "{sys.executable}" "$@"',
            "pip": f'exec "{sys.executable}" -m tests.docs pip "$@"',
        }
        for name, line in shims.items():
            (bin_dir / name).write_text(f"#!/bin/sh\n{line}\n")
            (bin_dir / name).chmod(0o755)
        self.env = {
            "PATH": f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin",
            "PYTHONPATH": str(ROOT),
            "HOME": str(folder),
            "COLUMNS": "100",
            "PYTHONUTF8": "1",
            "TMPDIR": os.environ.get("TMPDIR", "/tmp"),
        }
        self.namespace: dict = {"__name__": "__main__"}

    def shell(self, script: str, timeout: int = 900) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", "-c", script],
            cwd=self.folder,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
        )

    def run(self, block: Block) -> None:
        """Run one block; an AssertionError naming the block where it fails."""
        assert block.kind in KINDS, f"{block.where}: a block must be one of {KINDS}"
        getattr(self, f"_{block.kind}")(block)

    def _mix(self, block: Block) -> None:
        first, _, rest = block.body.partition("\n")
        name = first.removeprefix("# ").strip() if first.startswith("# ") else ""
        if name.startswith("specs/"):
            assert_excerpt(rest, ROOT / name, block)
        elif name.endswith(".mix"):
            (self.folder / name).write_text(block.body, encoding="utf-8")
        else:
            (self.folder / ".block.mix").write_text(block.body, encoding="utf-8")
            run = self.shell("mixc check -q .block.mix")
            assert run.returncode == 0, f"{block.where}: the spec fails mixc check:\n{run.stdout}"

    def _console(self, block: Block) -> None:
        for command, expected in console_steps(block):
            run = self.shell(command)
            assert matches(expected, run.stdout), (
                f"{block.where}: `{command}` printed\n{run.stdout}\nnot\n{expected}"
            )

    def _sh(self, block: Block) -> None:
        ci = ci_lines()
        script = "".join(
            line for line in block.body.splitlines(keepends=True) if line.rstrip("\n") not in ci
        )
        run = self.shell("set -euo pipefail\n" + script)
        assert run.returncode == 0, f"{block.where}: exit {run.returncode}\n{run.stdout}"

    def _python(self, block: Block) -> None:
        if "excerpt" in block.flags:
            (path,) = block.flags[block.flags.index("excerpt") + 1 :][:1] or (None,)
            assert path, f"{block.where}: `python excerpt FILE` names the file"
            found = self.folder / path
            assert_excerpt(block.body, found if found.exists() else ROOT / path, block)
            return
        code = compile(block.body, f"{block.where} (python block)", "exec")
        with contextlib.chdir(self.folder):
            exec(code, self.namespace)


def console_steps(block: Block) -> list[tuple[str, str]]:
    """(command, what it prints) for each `$ ` line of a console block."""
    steps: list[tuple[str, list[str]]] = []
    for line in block.body.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            assert steps, f"{block.where}: a console block starts with a `$ ` command"
            steps[-1][1].append(line)
    return [(command, "".join(f"{line}\n" for line in out)) for command, out in steps]


def matches(expected: str, actual: str) -> bool:
    """`actual` is `expected`, where a line `...` stands for any lines, `...` in a line for any
    text."""
    pattern = "".join(
        r"(?:.*\n)*?" if line == "..." else ".*?".join(map(re.escape, line.split("..."))) + r"\n"
        for line in expected.splitlines()
    )
    return re.fullmatch(pattern, actual) is not None


def assert_excerpt(excerpt: str, path: Path, block: Block) -> None:
    """Every line of `excerpt` but blank ones and `...` is a line of `path`, in order."""
    assert path.is_file(), f"{block.where}: no file {path} for the excerpt"
    lines = [line.rstrip() for line in path.read_text(encoding="utf-8").splitlines()]
    at = 0
    for line in excerpt.splitlines():
        if not line.strip() or line.strip() == "...":
            continue
        assert line.rstrip() in lines[at:], (
            f"{block.where}: not a line of {path} (in order): {line!r}"
        )
        at = lines.index(line.rstrip(), at) + 1


# ----------------------------------------------------------------------------- pip, offline


def _requirements_of_mixc(extras: list[str]) -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    unknown = set(extras) - set(project["optional-dependencies"])
    if unknown:
        raise SystemExit(f"mixc has no extra {', '.join(sorted(unknown))}")
    return [
        *project["dependencies"],
        *(r for e in extras for r in project["optional-dependencies"][e]),
    ]


def pip(argv: list[str]) -> int:
    """`pip install ARGS`, installing nothing: exit 0 if everything ARGS ask for is installed
    (mixc, `.` and `-e .` are this checkout, with its extras), else 1, saying what is not."""
    from packaging.requirements import Requirement

    if argv[:1] != ["install"]:
        print(f"pip {shlex.join(argv)}: only `pip install` is run by the docs' tests")
        return 1
    wanted: list[str] = []
    for arg in argv[1:]:
        if arg in ("-e", "--editable", "-U", "--upgrade", "--no-deps"):
            continue
        if arg.startswith("-"):
            print(f"pip install: option {arg} is not understood here")
            return 1
        name, _, extras = arg.partition("[")
        extras_list = [e for e in extras.rstrip("]").split(",") if e]
        wanted += _requirements_of_mixc(extras_list) if name in (".", "mixc") else [arg]
    missing = []
    for text in wanted:
        req = Requirement(text)
        if req.marker and not req.marker.evaluate():
            continue
        try:
            version = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            missing.append(f"{text} (not installed)")
            continue
        if not req.specifier.contains(version, prereleases=True):
            missing.append(f"{text} (installed: {version})")
    for line in missing:
        print(f"pip install would need {line}")
    return 1 if missing else 0


if __name__ == "__main__" and sys.argv[1:2] == ["pip"]:
    sys.exit(pip(sys.argv[2:]))
