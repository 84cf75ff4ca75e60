"""Issue 30's measurement of a pipeline of states: Gated Slot Attention (specs/gsa.mix, 16
slots) chunk forward against its recurrent form at T = 8192, and the chunk forward's peak
tensor memory over T (linear in T: a constant number of bytes per token).

    PYTHONPATH=. python benchmarks/pipelines.py      # CPU, 2 threads, fp32, B=1, NH=4, d=64

The chunk and recurrent forms are timed in one process in alternation (a warm-up call of each
at T = 256, then `--repeats` timed calls of each, one of each in turn), forward under no_grad;
the figure is the ratio of medians. Memory is `mixc bench`'s measure (the profiler's peak of
tensor memory held during one call)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import mixc
from mixc.tools.bench_measure import measure_peak_memory

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from peers import chunk_vs_recurrent  # noqa: E402


def inputs(T: int, B=1, NH=4, d=64, slots=16):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, T, NH, n, generator=g) for n in (d, d, d)] + [
        torch.randn(B, T, NH, slots, generator=g)
    ]


def main() -> None:
    module = mixc.load(ROOT / "specs/gsa.mix")
    chunk_vs_recurrent(module, inputs, "gsa (M=16)")
    print("gsa chunk forward peak tensor memory:")
    for T in (1024, 2048, 4096, 8192):
        y = inputs(T)
        with torch.no_grad():
            peak = measure_peak_memory(lambda y=y: module.chunk(*y))
        print(f"  T={T}: {peak / 2**20:.1f} MiB ({peak / T / 1024:.1f} KiB per token)")


if __name__ == "__main__":
    main()
