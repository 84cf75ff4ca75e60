"""`mixc fuzz SPEC`: fuzz a spec's module from the command line, with a progress bar.

On success it prints a one-line summary; on a failure, the shrunk example, the command that
replays it, and a reproducer script (`mixc.check.reproducer`).
"""

from __future__ import annotations

import sys

from mixc.check.fuzz import fuzz
from mixc.check.ranges import input_ranges
from mixc.check.reproducer import reproducer
from mixc.errors import MixcError
from mixc.frontend.spec import load_spec

__all__ = ["progress_bar", "run_command"]


def progress_bar(label: str, total: int):
    """A rich progress bar on stderr when stderr is a terminal (quiet when piped or without rich);
    returns (callback, context manager)."""
    import contextlib

    if not sys.stderr.isatty():
        return None, contextlib.nullcontext()
    try:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )
    except ImportError:
        return None, contextlib.nullcontext()
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    task = bar.add_task(label, total=total)

    def update(done: int, total: int, phase: str) -> None:
        bar.update(task, completed=min(done, total), description=f"{label} ({phase})")

    return update, bar


def _triton_on(device: str) -> None:
    """Make ready to fuzz a module of the Triton backend on `device`: triton must be installed,
    and on CPU its kernels run in triton's interpreter, which must be chosen before the module
    is made, before triton itself is imported (its own functions are made for one or the
    other): TRITON_INTERPRET=1, unless the environment says otherwise."""
    import importlib.util
    import os

    if importlib.util.find_spec("triton") is None:
        raise MixcError("--backend triton needs triton: pip install 'mixc[triton]'")
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")


def run_command(
    spec_path: str,
    module_path: str | None = None,
    *,
    examples: int = 25,
    seed: int = 0,
    dtype: str = "float32",
    device: str = "cpu",
    backend: str = "pytorch",
    out=None,
) -> int:
    """`mixc fuzz`: 0 when every form agrees with the oracle (prints a one-line summary), 1 on a
    disagreement (prints the shrunk example and a reproducer). Spec errors raise MixcError."""
    out = out or sys.stdout
    try:
        import hypothesis  # noqa: F401
    except ImportError:
        raise MixcError(
            "mixc fuzz needs hypothesis, a dependency of mixc missing here: pip install hypothesis"
        ) from None
    if backend == "triton" and module_path is None:
        _triton_on(device)
    spec = load_spec(spec_path)
    target = f"{spec_path}" + (f" --module {module_path}" if module_path else "")
    if backend != "pytorch" and not module_path:
        target += f" --backend {backend}"
    update, bar = progress_bar(f"fuzzing {spec.mixer.name}", examples)
    with bar:
        report = fuzz(
            spec,
            module_path,
            examples=examples,
            seed=seed,
            dtype=dtype,
            device=device,
            backend=backend,
            progress=update,
        )
    for note in report.notes:
        print(f"note: {note}", file=sys.stderr)
    if report.ok:
        print(f"mixc fuzz {target}: {report.summary().split(': ', 1)[1]}", file=out)
        return 0
    f = report.failure
    replay = f"mixc fuzz {target} --examples {examples} --seed {seed} --dtype {dtype}"
    script = reproducer(input_ranges(spec), f, spec_path, module_path, backend)
    print(
        f"FAILED mixc fuzz {target}: {f.summary()}\n"
        f"  after {report.examples} passing examples; shrunk in {report.shrink_steps} steps to:\n"
        f"  {f.example.describe()}\n"
        f"  replay: {replay}\n\n"
        f"reproducer (save as repro.py, run python repro.py):\n\n{script}",
        file=out,
        end="",
    )
    return 1
