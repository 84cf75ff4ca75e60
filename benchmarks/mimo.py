"""Mamba-3 MIMO at rank 2 (specs/mamba3_mimo.mix: 4 writes a token joined under a scalar decay,
2 readouts, B and C turned by summed angles, R = N / 4 pairs): its chunk forward against
Mamba-2's and Mamba-3 SISO's at T=4096, against its own recurrent form at T=8192, and where its
chunk forward's time goes (--profile: the operators taking most CPU time).

    python benchmarks/mimo.py --threads 1 --clock cpu

Sizes: B=1, NH=4, d_k=d_v=64 (N = P = 64), float32, CPU, chunk size 64, forward under
torch.no_grad(). The modules are timed in alternation in one process (warm-up, then `--calls`
calls of each in turn, `--rounds` times); the figure is the median over all calls. `--clock
cpu` measures the process's CPU time instead of the wall clock: on a loaded machine, with one
thread, it is what the call itself costs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1]))  # this checkout's mixc
sys.path.insert(0, str(Path(__file__).parent))  # rotations.py
from rotations import NH, B, D, T, mamba3_inputs

import mixc

SPECS = Path(__file__).parents[1] / "specs"
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def mimo_inputs(T: int, g: torch.Generator) -> list[torch.Tensor]:
    """Mamba-3 MIMO's inputs at rank 2, in Mamba-3's ranges and at its initial projections."""
    a = mamba3_inputs(T, g)
    extra = {
        "B2": torch.randn(B, T, NH, D, generator=g),
        "C2": torch.randn(B, T, NH, D, generator=g),
    }
    ones = torch.ones(NH, D)
    ordered = [a["x"], a["z"], a["dt"], a["A"], a["B"], extra["B2"], a["C"], extra["C2"]]
    ordered += [a["l"], a["w"], a["D"], *(ones for _ in range(4))]
    return [*ordered, ones / 2, ones / 2, ones, ones, ones / 2, ones / 2]  # mimo_x, _z, _o


def time_calls(fns: dict, calls: int, rounds: int, clock) -> dict[str, list[float]]:
    """Milliseconds per call of each function, called in turn, by `clock`."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():  # warm-up
        fn(), fn()
    for _ in range(rounds * calls):
        for name, fn in fns.items():
            start = clock()
            fn()
            times[name].append(1e3 * (clock() - start))
    return times


def against_peers(calls: int, rounds: int, clock) -> None:
    g = torch.Generator().manual_seed(0)
    m2, m3, mimo = (mixc.load(SPECS / f"{n}.mix") for n in ("mamba2", "mamba3", "mamba3_mimo"))
    a = mamba3_inputs(T, g)
    x2 = (a["x"], a["dt"], a["B"], a["C"], -a["A"][0, 0], a["D"])
    a3, am = list(a.values()), mimo_inputs(T, g)
    with torch.no_grad():
        fns = {
            "mamba2": lambda: m2.chunk(*x2, chunk_size=64),
            "mamba3": lambda: m3.chunk(*a3, chunk_size=64),
            "mamba3_mimo": lambda: mimo.chunk(*am, chunk_size=64),
        }
        times = time_calls(fns, calls, rounds, clock)
    med = {name: statistics.median(t) for name, t in times.items()}
    for name, m in med.items():
        print(f"| {name} chunk fwd, T={T} | {m:.2f} ms |")
    print(f"| mamba3_mimo / mamba2 | {med['mamba3_mimo'] / med['mamba2']:.2f}x |")
    print(f"| mamba3_mimo / mamba3 (SISO) | {med['mamba3_mimo'] / med['mamba3']:.2f}x |")


def against_recurrent(clock) -> None:
    g = torch.Generator().manual_seed(1)
    mimo = mixc.load(SPECS / "mamba3_mimo.mix")
    long = mimo_inputs(2 * T, g)
    with torch.no_grad():
        fns = {
            "chunk": lambda: mimo.chunk(*long, chunk_size=64),
            "recurrent": lambda: mimo.recurrent(*long),
        }
        times = time_calls(fns, 1, 1, clock)
    med = {name: statistics.median(t) for name, t in times.items()}
    ratio = med["recurrent"] / med["chunk"]
    print(f"| mamba3_mimo chunk fwd, T={2 * T} | {med['chunk']:.2f} ms |")
    print(f"| mamba3_mimo recurrent fwd, T={2 * T} | {med['recurrent']:.2f} ms |")
    print(f"| speed-up (target >= 10x) | {ratio:.1f}x | {'yes' if ratio >= 10 else '**no**'} |")


def profile(rows: int) -> None:
    """The operators taking most CPU time in Mamba-3 MIMO's chunk forward at T=4096."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as run

    mimo = mixc.load(SPECS / "mamba3_mimo.mix")
    am = mimo_inputs(T, torch.Generator().manual_seed(0))
    with torch.no_grad():
        mimo.chunk(*am, chunk_size=64)
        with run(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                mimo.chunk(*am, chunk_size=64)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    parser.add_argument("--profile", type=int, default=0, help="rows of the profile (0: none)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = CLOCKS[args.clock]
    print(f"torch {torch.__version__}, {args.threads} threads, B={B} NH={NH} d={D} fp32")
    print(f"| {args.clock} clock | median |\n| --- | --- |")
    against_peers(args.calls, args.rounds, clock)
    against_recurrent(clock)
    if args.profile:
        profile(args.profile)


if __name__ == "__main__":
    main()
