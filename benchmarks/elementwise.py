"""Mamba-1's full elementwise gate: mixc's chunked form against its own recurrent form on CPU.

    python benchmarks/elementwise.py [--threads 1] [--rounds 5] [--clock cpu]

Sizes: B=1, NH=4 heads of P=64 channels, N=16, fp32 (specs/mamba1.mix). The chunk and
recurrent forms are timed in the same process in alternation (so both sample the same phases of
a shared machine), medians over every timed call; forward under torch.no_grad(), forward+backward
back-propagating a fixed random cotangent to every input; wall-clock time, or with `--clock cpu`
the process's CPU time (on one thread of a shared machine that leaves out the time other
processes hold the core; with more threads it would count their waiting too). Peak memory is
the tensor memory held during one forward+backward at several T
(mixc.tools.bench.measure_peak_memory). The results replace the section between the markers in
benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import time_alternating

import mixc
from mixc.tools.bench import measure_peak_memory

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "specs" / "mamba1.mix"
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
BEGIN, END = "<!-- elementwise: begin -->", "<!-- elementwise: end -->"
B, NH, P, N = 1, 4, 64, 16
T_SPEED = 4096
T_MEMORY = (2048, 4096, 8192)
CHUNKS = (4, 8, 16, 32, 64)
NOTE = (
    "Where the time goes: with a gate per entry nothing reduces to a matrix product, so the "
    "chunked form makes every token's state (P x N per head) and passes over all of them seven "
    "times (the gate's product, its exp, the write, the scan with the running product of the "
    "decays, the entering state's term, the readout), in place in buffers a span long (2^17 "
    "state entries), each pass bound by memory; the recurrence does the same "
    "elementwise work in T small steps, bound by their count. What the chunked form saves is "
    "Python steps: T / C chunk steps and C position steps per span instead of T."
)


def inputs(T: int, grad: bool) -> list[torch.Tensor]:
    """x, dt, B, C (per token) and A, D (per head), as Mamba-1 has them: dt in (0.001, 0.1),
    A = -(1, ..., N) along every row."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(B, T, NH, P, generator=gen)
    dt = 0.001 + 0.099 * torch.rand(B, T, NH, P, generator=gen)
    keys = torch.randn(B, T, NH, N, generator=gen)
    queries = torch.randn(B, T, NH, N, generator=gen)
    A = -torch.arange(1.0, N + 1).expand(NH, P, N).clone()
    D = torch.ones(NH, P)
    return [t.requires_grad_(grad) for t in (x, dt, keys, queries, A, D)]


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def alternate(calls: dict, rounds: int, warmup: int = 1, clock=time.perf_counter) -> dict:
    """Median seconds of each call, the calls timed one after another in every round."""

    def measure(call) -> float:
        start = clock()
        call()
        return clock() - start

    times = time_alternating(calls, {name: rounds for name in calls}, warmup, measure)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = CLOCKS[args.clock]
    module = mixc.load(SPEC)
    load_start = os.getloadavg()

    with torch.no_grad():
        xs = inputs(T_SPEED, grad=False)
        best = alternate(
            {C: lambda C=C: module.chunk(*xs, chunk_size=C) for C in CHUNKS},
            args.rounds,
            clock=clock,
        )
        chunk = min(best, key=best.get)
        forward = alternate(
            {
                "chunk": lambda: module.chunk(*xs, chunk_size=chunk),
                "recurrent": lambda: module.recurrent(*xs),
            },
            args.rounds,
            clock=clock,
        )

    def backward(form):
        def run():
            xs = inputs(T_SPEED, grad=True)
            y, _ = form(*xs)
            y.backward(cotangent)

        return run

    cotangent = torch.randn(B, T_SPEED, NH, P, generator=torch.Generator().manual_seed(1))
    both = alternate(
        {
            "chunk": backward(lambda *a: module.chunk(*a, chunk_size=chunk)),
            "recurrent": backward(module.recurrent),
        },
        max(2, args.rounds // 2),
        clock=clock,
    )

    peaks = {}
    for T in T_MEMORY:
        xs = inputs(T, grad=True)
        cot = torch.randn(B, T, NH, P, generator=torch.Generator().manual_seed(1))

        def call(xs=xs, cot=cot):
            y, _ = module.chunk(*xs, chunk_size=chunk)
            y.backward(cot)

        peaks[T] = measure_peak_memory(call)

    state_mib = B * NH * P * N * 4 * T_MEMORY[-1] / 2**20
    rows = [
        ("chunk forward >= 5x faster than recurrent (T=4096)", forward, 5.0),
        ("chunk forward+backward >= 3x faster than recurrent (T=4096)", both, 3.0),
    ]
    lines = [
        BEGIN,
        "## Mamba-1 (full elementwise gate): chunk against recurrent",
        "",
        "Regenerate with `python benchmarks/elementwise.py` (part of `benchmarks/run.sh`).",
        "",
        f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, mixc {mixc.__version__}, "
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}",
        f"- {args.threads} torch thread(s), load average {load_start[0]:.1f} at start, "
        f"{os.getloadavg()[0]:.1f} at end, {args.clock} time (on a shared machine the absolute "
        "times are noisy; the ratios, both forms timed in alternation in one process, are what "
        "to read)",
        f"- Sizes: B={B}, NH={NH}, P={P}, N={N}, fp32, specs/mamba1.mix; chunk size {chunk}, the "
        "fastest of "
        + ", ".join(f"C={C} {1e3 * s:.0f} ms" for C, s in best.items())
        + " for the chunk forward",
        "",
        "| target | chunk | recurrent | ratio | holds |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, measured, goal in rows:
        ratio = measured["recurrent"] / measured["chunk"]
        lines.append(
            f"| {name} | {1e3 * measured['chunk']:.0f} ms | {1e3 * measured['recurrent']:.0f} ms "
            f"| {ratio:.1f}x | {'yes' if ratio >= goal else '**no**'} |"
        )
    growth = peaks[T_MEMORY[-1]] / peaks[T_MEMORY[0]]
    linear = growth <= 1.25 * T_MEMORY[-1] / T_MEMORY[0]
    lines += [
        f"| chunk forward+backward peak memory linear in T (T={T_MEMORY[-1]} <= 1.25 x "
        f"{T_MEMORY[-1] // T_MEMORY[0]} x T={T_MEMORY[0]}) | "
        + " -> ".join(f"{peaks[T] / 2**20:.0f} MiB" for T in T_MEMORY)
        + f" (T = {', '.join(map(str, T_MEMORY))}) | | {growth:.2f}x | "
        f"{'yes' if linear else '**no**'} |",
        "",
        f"Every token's state at T={T_MEMORY[-1]} would be {state_mib:.0f} MiB; the backward "
        "keeps one state per span and makes a span's states again when it reaches it.",
        "",
        NOTE,
        END,
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        old = RESULTS.read_text(encoding="utf-8")
        if BEGIN in old:
            head, rest = old.split(BEGIN, 1)
            new = head + text + rest.split(END, 1)[1]
        else:
            new = old.rstrip("\n") + "\n\n" + text + "\n"
        RESULTS.write_text(new, encoding="utf-8")


if __name__ == "__main__":
    main()
