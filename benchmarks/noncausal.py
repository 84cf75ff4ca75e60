"""Non-causal mixers (issue 32): Hydra's chunked forward against Mamba-2's, and against its own
recurrent form, and its peak memory over T.

Writes the section between the NONCAUSAL markers of benchmarks/RESULTS.md. One command:

    python benchmarks/noncausal.py            # a few minutes on 2 cores

CPU, 2 torch threads, fp32, B=1, NH=4, d=64 (every size of the specs 64), forward under
torch.no_grad(). Hydra runs two scalar-decay passes (one backward in time, both reading the state
before the token's update, in the kernel itself) where Mamba-2 runs one, so its chunked forward
is about twice Mamba-2's. The two sides of each ratio
are timed in alternation in one process (peers.time_alternating), medians over the timed calls;
peak tensor memory from the profiler (mixc.tools.bench_measure.measure_peak_memory).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import os
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from peers import machine_text, time_alternating  # noqa: E402

import mixc  # noqa: E402
from mixc.tools.bench import default_sizes, make_inputs  # noqa: E402
from mixc.tools.bench_measure import measure_peak_memory  # noqa: E402

B, NH = 1, 4
PEER_T, RECURRENT_T = 4096, 8192
MEMORY_T = (1024, 2048, 4096, 8192)
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
BEGIN, END = "<!-- NONCAUSAL BEGIN -->", "<!-- NONCAUSAL END -->"
COMMAND = "python benchmarks/noncausal.py"


def _forward(name: str, form: str, T: int):
    """A call of one form of a shipped spec, forward only, on the benchmark's inputs."""
    module = mixc.load(ROOT / "specs" / f"{name}.mix")
    spec = mixc.load_spec(ROOT / "specs" / f"{name}.mix")
    inputs = make_inputs(spec, default_sizes(spec, {"B": B, "NH": NH}), T)
    fn = getattr(module, form)

    def call():
        with torch.no_grad():
            fn(*inputs)

    return call


def _median_ms(times: list[float]) -> float:
    return 1e3 * statistics.median(times)


def measure(repeats: int) -> dict:
    """The two ratios (medians in ms) and the peak memory of Hydra's chunk at each T."""
    peer = time_alternating(
        {
            "hydra": _forward("hydra", "chunk", PEER_T),
            "mamba2": _forward("mamba2", "chunk", PEER_T),
        },
        {"hydra": repeats, "mamba2": repeats},
    )
    own = time_alternating(
        {
            "chunk": _forward("hydra", "chunk", RECURRENT_T),
            "recurrent": _forward("hydra", "recurrent", RECURRENT_T),
        },
        {"chunk": repeats, "recurrent": 3},
        warmup=1,
    )
    memory = {T: measure_peak_memory(_forward("hydra", "chunk", T)) for T in MEMORY_T}
    return {
        "peer": {k: _median_ms(v) for k, v in peer.items()},
        "own": {k: _median_ms(v) for k, v in own.items()},
        "memory": memory,
    }


def report(data: dict, threads: int, load: tuple[float, ...]) -> str:
    peer, own, memory = data["peer"], data["own"], data["memory"]
    vs_mamba = peer["hydra"] / peer["mamba2"]
    vs_recurrent = own["recurrent"] / own["chunk"]
    # Linear, not proportional: a fixed cost (the module's weights, the first chunk's buffers)
    # plus a cost per token. The slope between successive lengths is the cost per token; a
    # quadratic term would double it at each doubling of T.
    sizes = sorted(memory)
    slope = {b: (memory[b] - memory[a]) / (b - a) for a, b in itertools.pairwise(sizes)}
    spread = max(slope.values()) / min(slope.values())
    mark = {True: "yes", False: "**no**"}
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        BEGIN,
        "## Non-causal mixers: Hydra (issue 32)",
        "",
        f"Regenerate with `{COMMAND}`. {date}; {machine_text(threads)}; load average at start "
        f"{load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}. B=1, NH=4, d=64, fp32, forward, medians.",
        "",
        "| target | measured | holds |",
        "| --- | --- | --- |",
        f"| hydra chunk forward <= 2.2x mamba2 chunk forward (T={PEER_T}) | {vs_mamba:.2f}x "
        f"({peer['hydra']:.1f} vs {peer['mamba2']:.1f} ms) | {mark[vs_mamba <= 2.2]} |",
        f"| hydra chunk >= 10x faster than its recurrent form (T={RECURRENT_T}, fwd) | "
        f"{vs_recurrent:.0f}x ({own['chunk']:.1f} vs {own['recurrent']:.0f} ms) | "
        f"{mark[vs_recurrent >= 10]} |",
        f"| hydra chunk forward memory linear in T (the added bytes per added token, between "
        f"successive T = {', '.join(map(str, MEMORY_T))}, within 1.5x of each other) | "
        f"{spread:.2f}x | {mark[spread <= 1.5]} |",
        "",
        "| T | hydra chunk forward peak memory | added per token since the T before |",
        "| --- | --- | --- |",
        *(
            f"| {T} | {m / 2**20:.1f} MiB | "
            + (f"{slope[T] / 1024:.1f} KiB |" if T in slope else "- |")
            for T, m in memory.items()
        ),
        "",
        "Hydra's chunked form runs Mamba-2's scalar-decay kernel twice: forward in time for H "
        "and backward in time for G (chunks from the last, the upper triangle), each read "
        "before the token's update (H_{t-1}, G_{t+1}: the strict triangle), with no input or "
        "output reversed or moved a token.",
        END,
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--no-write", action="store_true", help="print, leave RESULTS.md be")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load = os.getloadavg()
    data = measure(args.repeats)
    section = report(data, args.threads, load)
    print(section)
    if args.no_write:
        return
    text = RESULTS.read_text(encoding="utf-8")
    if BEGIN in text:
        text = text[: text.index(BEGIN)] + section + text[text.index(END) + len(END) + 1 :]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    RESULTS.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
