"""Issue 30's measurement of the new diagonal-plus-low-rank specs: Comba (specs/comba.mix) and
GDN-2 (specs/gdn2.mix), each chunk forward against its recurrent form at T = 8192.

    PYTHONPATH=. python benchmarks/comba_gdn2.py     # CPU, 2 threads, fp32, B=1, NH=4, d=64

Inputs are the fuzzer's draws with every decay near one (`sample_inputs` with
`decays_near_one`), as a trained model runs over a long sequence. All four calls are timed in
one process in alternation (a warm-up call of each at T = 256, then `--repeats` rounds of one
call of each), forward under no_grad; each figure is the ratio of the medians. Prints the load
average before and after: on a shared machine the ratio, not the times, is what to compare."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch

import mixc
from mixc.check import decays_near_one, input_ranges, sample_inputs

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from peers import time_alternating  # noqa: E402

SPECS = ("comba", "gdn2")


def inputs(path: Path, T: int, d: int = 64, heads: int = 4) -> list[torch.Tensor]:
    modes = decays_near_one(input_ranges(path))
    sizes = {"K": d, "V": d}
    return sample_inputs(path, sizes, T, batch=1, heads=heads, modes=modes, seed=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"load average before: {os.getloadavg()}", flush=True)
    calls = {}
    with torch.no_grad():
        for name in SPECS:
            path = ROOT / "specs" / f"{name}.mix"
            module, x = mixc.load(path), inputs(path, args.T)
            warm = inputs(path, 256)
            module.chunk(*warm), module.recurrent(*warm)
            calls[f"{name} chunk"] = lambda m=module, x=x: m.chunk(*x)
            calls[f"{name} recurrent"] = lambda m=module, x=x: m.recurrent(*x)
        times = time_alternating(calls, dict.fromkeys(calls, args.repeats), warmup=0)
    print(f"load average after: {os.getloadavg()}")
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"forward, T={args.T}, B=1, NH=4, d=64, fp32, {args.threads} threads, medians:")
    for name in SPECS:
        chunk, recurrent = med[f"{name} chunk"], med[f"{name} recurrent"]
        print(
            f"{name}: chunk {chunk * 1e3:.1f} ms, recurrent {recurrent * 1e3:.1f} ms, "
            f"{recurrent / chunk:.1f}x"
        )


if __name__ == "__main__":
    main()
