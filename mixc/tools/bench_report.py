"""`mixc bench`'s output: a result as a table, a JSON file or a plot of time and memory versus T.

`mixc.tools.bench` measures; this module only shows what it measured.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from mixc.errors import MixcError
from mixc.tools.bench import FORMS
from mixc.tools.bench_result import BenchResult, machine

__all__ = ["matplotlib_figure", "plot", "render", "write_json"]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g}" if seconds < 1 else f"{seconds * 1e3:.0f}"


def _mb(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 2**20:.1f}"


def render(result: BenchResult, console=None) -> None:
    """Print the result as a table (rich), with the matmul reference and notes."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=None if _is_terminal() else 120)
    sizes = ", ".join(f"{k}={v}" for k, v in result.sizes.items())
    info = machine(result.device)
    title = (
        f"{result.name}: {sizes}, C={result.chunk_size}, fp32, {result.device}, "
        f"{result.threads} threads"
    )
    table = Table(
        title=title, box=box.SIMPLE_HEAVY, caption=f"{info['cpu']}, torch {info['torch']}"
    )
    for col in (
        "form",
        "pass",
        "T",
        "median ms",
        "q1-q3 ms",
        "peak MB",
        "GFLOP/s",
        "% matmul",
    ):
        table.add_column(col, justify="left" if col in ("form", "pass") else "right")
    for p in result.points:
        q1, q3 = p.quartiles
        frac = result.matmul_fraction(p)
        table.add_row(
            p.form,
            "fwd+bwd" if p.backward else "fwd",
            str(p.T),
            _ms(p.median) + (" !" if p.unreliable else ""),
            f"{_ms(q1)}-{_ms(q3)}",
            _mb(p.peak_bytes),
            "-" if p.gflops is None else f"{p.gflops:.1f}",
            "-" if frac is None else f"{100 * frac:.0f}%",
        )
    console.print(table)
    if result.matmul:
        parts = []
        for t, ref in sorted(result.matmul.items()):
            parts.append(f"T={t}: {ref['gflops']:.1f}")
        console.print(
            f"fp32 matmul reference (bmm at the chunked shapes, C={result.chunk_size}), GFLOP/s: "
            + ", ".join(parts)
        )
    for p in result.points:
        if p.unreliable:
            pass_ = "fwd+bwd" if p.backward else "fwd"
            console.print(
                f"! {p.form} {pass_} T={p.T}: unreliable after measuring it again: {p.unreliable}"
            )
    for note in result.notes:
        console.print(f"note: {note}")


def _is_terminal() -> bool:
    import sys

    return sys.stdout.isatty()


def write_json(result: BenchResult, path: str | os.PathLike) -> None:
    """Write the result as JSON (`BenchResult.to_json`) to `path`, replacing it atomically."""
    from mixc.driver import write_atomically

    write_atomically(path, json.dumps(result.to_json(), indent=2) + "\n")


def matplotlib_figure():
    """matplotlib's Figure class (without a display), or a MixcError saying how to install it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib.figure import Figure
    except ImportError:
        raise MixcError(
            "--plot needs matplotlib, a dependency of mixc missing here: pip install matplotlib"
        ) from None
    return Figure


def plot(results: Sequence[BenchResult], path: str | os.PathLike, title: str | None = None) -> None:
    """Time and peak memory versus T on log axes, one line per (mixer, form, pass)."""
    Figure = matplotlib_figure()
    fig = Figure(figsize=(13, 4.6), layout="constrained")
    ax_time, ax_mem = fig.subplots(1, 2)
    styles = {"chunk": "-", "recurrent": ":", "parallel": "-."}
    for i, result in enumerate(results):
        colour = f"C{i % 10}"
        for form in FORMS:
            for bwd in (False, True):
                pts = sorted(
                    (p for p in result.points if p.form == form and p.backward == bwd),
                    key=lambda p: p.T,
                )
                if not pts:
                    continue
                label = f"{result.name} {form}{' fwd+bwd' if bwd else ''}"
                marker = "s" if bwd else "o"
                ts = [p.T for p in pts]
                ax_time.plot(
                    ts,
                    [p.median * 1e3 for p in pts],
                    styles[form],
                    marker=marker,
                    ms=3,
                    color=colour,
                    label=label,
                    alpha=0.6 if bwd else 1.0,
                )
                if not bwd and all(p.peak_bytes for p in pts):
                    ax_mem.plot(
                        ts,
                        [p.peak_bytes / 2**20 for p in pts],
                        styles[form],
                        marker=marker,
                        ms=3,
                        color=colour,
                        label=label,
                    )
    for ax, ylabel in (
        (ax_time, "median time per call (ms)"),
        (ax_mem, "peak tensor memory, forward (MiB)"),
    ):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    handles, labels = ax_time.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", fontsize=7)
    if results:
        r = results[0]
        sizes = ", ".join(f"{k}={v}" for k, v in r.sizes.items())
        fig.suptitle(
            title
            or f"mixc bench: {sizes}, C={r.chunk_size}, fp32, {r.device}, {r.threads} threads",
            fontsize=9,
        )
    fig.savefig(os.fspath(path), dpi=130)
