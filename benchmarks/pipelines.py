"""Issue 30's measurement of a pipeline of states: Gated Slot Attention (specs/gsa.mix, 16
slots) chunk forward against its recurrent form at T = 8192, and the chunk forward's peak
tensor memory over T (linear in T: a constant number of bytes per token).

    PYTHONPATH=. python benchmarks/pipelines.py      # CPU, 2 threads, fp32, B=1, NH=4, d=64

The chunk and recurrent forms are timed in one process in alternation (a warm-up call of each
at T = 256, then `--repeats` timed calls of each, one of each in turn), forward under no_grad;
the figure is the ratio of medians. Memory is `mixc bench`'s measure (the profiler's peak of
tensor memory held during one call)."""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

import mixc
from mixc.tools.bench_measure import measure_peak_memory

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from peers import time_alternating  # noqa: E402


def inputs(T: int, B=1, NH=4, d=64, slots=16):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, T, NH, n, generator=g) for n in (d, d, d)] + [
        torch.randn(B, T, NH, slots, generator=g)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    module = mixc.load(ROOT / "specs/gsa.mix")
    x = inputs(args.T)
    calls = {"chunk": lambda: module.chunk(*x), "recurrent": lambda: module.recurrent(*x)}
    with torch.no_grad():
        module.chunk(*inputs(256)), module.recurrent(*inputs(256))
        times = time_alternating(calls, dict.fromkeys(calls, args.repeats), warmup=0)
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"gsa (M=16) forward, T={args.T}, B=1, NH=4, d=64, fp32, {args.threads} threads")
    for name, t in times.items():
        print(
            f"  {name}: median {med[name] * 1e3:.1f} ms (of {', '.join(f'{s * 1e3:.0f}' for s in t)})"
        )
    print(f"  chunk is {med['recurrent'] / med['chunk']:.1f}x faster than recurrent")
    print("gsa chunk forward peak tensor memory:")
    for T in (1024, 2048, 4096, 8192):
        y = inputs(T)
        with torch.no_grad():
            peak = measure_peak_memory(lambda y=y: module.chunk(*y))
        print(f"  T={T}: {peak / 2**20:.1f} MiB ({peak / T / 1024:.1f} KiB per token)")


if __name__ == "__main__":
    main()
