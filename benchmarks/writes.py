"""Several writes a token (issue 30): a rank-2 scalar-decay write against the rank-1 write, and
its two lowerings, joined along the key and value axes or as sub-tokens, on CPU.

    python benchmarks/writes.py [--threads 2] [--rounds 7] [--write]

Sizes: B=1, NH=4, d_k=d_v=64, fp32. Rank 1 is specs/mamba2.mix; rank 2 is
specs/mamba3_trapezoid.mix (the same SSM with Mamba-3's trapezoidal write: the previous token's
write and this token's) and a rank-2 write of two independent pairs (`rank2`, below). Each is
compiled as mixc compiles it (the scalar-decay class joins several writes:
TransitionClass.joined_kernel) and, for the comparison that chose that, with the joined kernel
switched off, so that the writes run as sub-tokens. Every call is timed in one process in
alternation with the others (benchmarks/peers.py's time_alternating, after 2 warm-up calls
each), forward under torch.no_grad(), forward+backward back-propagating a fixed cotangent to
every input; medians of every timed call. Each form at its own default chunk size. With --write
the results replace the section between the markers in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from datetime import UTC, datetime
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's mixc
from peers import KEEP_MEMORY, time_alternating

import mixc
from mixc.errors import Source
from mixc.transitions import REGISTRY

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
BEGIN, END = "<!-- writes: begin -->", "<!-- writes: end -->"
B, NH, D = 1, 4, 64
T_SPEED, T_RECURRENT = 4096, 8192
RANK2 = """mixer rank2 "two independent writes a token under one scalar decay"
in    x[P], dt, B[N], C[N], x2[P], B2[N]
param A, D
state H[P, N]
H_t = exp(dt_t A) H_{t-1} + dt_t x_t B_t^T + dt_t x2_t B2_t^T
y_t = H_t C_t + D x_t
"""


def module(name: str, joined: bool = True):
    """The compiled module of a shipped spec (or of RANK2), its writes joined or (joined False:
    every class's joined kernel off) as sub-tokens."""
    text = RANK2 if name == "rank2" else (ROOT / "specs" / f"{name}.mix").read_text()
    kept = {c: c.joined_kernel for c in REGISTRY}
    try:
        if not joined:
            for c in REGISTRY:
                c.joined_kernel = None
        source = mixc.compile_source(Source(text, f"{name}.mix"))
    finally:
        for c, kernel in kept.items():
            c.joined_kernel = kernel
    namespace: dict = {}
    exec(compile(source, f"<{name}{'' if joined else ' as sub-tokens'}>", "exec"), namespace)
    return namespace


def inputs(name: str, T: int, grad: bool) -> tuple[list[torch.Tensor], dict]:
    """Mamba-2's inputs (dt in (0.001, 0.1), A in (-1, 0), keys and queries of norm about 1),
    plus the trapezoid's l or the second pair."""
    gen = torch.Generator().manual_seed(0)

    def randn(*shape, scale=1.0):
        return (scale * torch.randn(B, T, NH, *shape, generator=gen)).requires_grad_(grad)

    x, dt = randn(D), (0.001 + 0.099 * torch.rand(B, T, NH, generator=gen)).requires_grad_(grad)
    keys, queries = randn(D, scale=D**-0.5), randn(D, scale=D**-0.5)
    params = {"A": -torch.rand(NH, generator=gen), "D": torch.ones(NH)}
    extra = {
        "mamba2": [],
        "mamba3_trapezoid": [randn()],
        "rank2": [randn(D), randn(D, scale=D**-0.5)],
    }
    return [x, dt, keys, queries, *extra[name]], params


def call(mod: dict, form: str, name: str, T: int, backward: bool):
    args, params = inputs(name, T, backward)
    fn = mod[form]

    def run():
        if not backward:
            with torch.no_grad():
                fn(*args, **params)
            return
        y = fn(*args, **params)
        y = y[0] if isinstance(y, tuple) else y
        grads = [a for a in args if a.requires_grad]
        torch.autograd.grad(y, grads, torch.ones_like(y))

    return run


def measure(rounds: int) -> dict:
    mods = {
        "rank 1 (mamba2)": module("mamba2"),
        "trapezoid, joined": module("mamba3_trapezoid"),
        "trapezoid, sub-tokens": module("mamba3_trapezoid", joined=False),
        "rank 2, joined": module("rank2"),
        "rank 2, sub-tokens": module("rank2", joined=False),
    }
    spec_of = {label: label.split(",")[0] for label in mods}
    names = {"rank 1 (mamba2)": "mamba2", "trapezoid": "mamba3_trapezoid", "rank 2": "rank2"}
    out = {"load_start": os.getloadavg()}
    for backward in (False, True):
        calls = {
            label: call(mod, "chunk", names[spec_of[label]], T_SPEED, backward)
            for label, mod in mods.items()
        }
        times = time_alternating(calls, dict.fromkeys(calls, rounds))
        out["fwd+bwd" if backward else "fwd"] = {k: statistics.median(v) for k, v in times.items()}
        print(f"measured the chunk forms ({'fwd+bwd' if backward else 'fwd'})", file=sys.stderr)
    calls = {
        f"{form}, {label}": call(mods[label], form, names[spec_of[label]], T_RECURRENT, False)
        for label in ("trapezoid, joined", "rank 2, joined")
        for form in ("chunk", "recurrent")
    }
    times = time_alternating(calls, dict.fromkeys(calls, max(3, rounds // 2)), warmup=1)
    out["recurrent"] = {k: statistics.median(v) for k, v in times.items()}
    out["load_end"] = os.getloadavg()
    return out


def report(data: dict, threads: int, rounds: int) -> str:
    ms = 1e3
    lines = [
        BEGIN,
        "## Several writes a token (issue 30)",
        "",
        "Regenerate with `python benchmarks/writes.py --write`. Measured "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {threads} torch threads, fp32, B={B}, NH={NH}, "
        f"d_k=d_v={D}, each form at its default chunk size, {rounds} timed calls of each in "
        "alternation in one process (medians). Load average (1/5/15 min) "
        f"{'/'.join(f'{x:.1f}' for x in data['load_start'])} at the start, "
        f"{'/'.join(f'{x:.1f}' for x in data['load_end'])} at the end: a shared machine, so "
        "only ratios of calls timed in alternation are targets.",
        "",
        f"| chunk form, T={T_SPEED} | forward ms | vs rank 1 | forward+backward ms | vs rank 1 |",
        "| --- | --- | --- | --- | --- |",
    ]
    base_f, base_b = data["fwd"]["rank 1 (mamba2)"], data["fwd+bwd"]["rank 1 (mamba2)"]
    for label, f in data["fwd"].items():
        b = data["fwd+bwd"][label]
        lines.append(
            f"| {label} | {f * ms:.1f} | {f / base_f:.2f}x | {b * ms:.1f} | {b / base_b:.2f}x |"
        )
    rec = data["recurrent"]
    lines += ["", "| target | measured | holds |", "| --- | --- | --- |"]
    for spec in ("trapezoid", "rank 2"):
        ratio = data["fwd"][f"{spec}, joined"] / base_f
        lines.append(
            f"| {spec} (rank 2, joined) chunk forward <= 1.6x rank 1's (T={T_SPEED}) | "
            f"{ratio:.2f}x | {'yes' if ratio <= 1.6 else '**no**'} |"
        )
        speed = rec[f"recurrent, {spec}, joined"] / rec[f"chunk, {spec}, joined"]
        lines.append(
            f"| {spec} chunk forward >= 10x its recurrent form (T={T_RECURRENT}) | "
            f"{speed:.0f}x | {'yes' if speed >= 10 else '**no**'} |"
        )
    joined = data["fwd"]["rank 2, joined"] / data["fwd"]["rank 2, sub-tokens"]
    lines += [
        "",
        "The scalar-decay class joins several writes (its joined kernel, chunk_scalar_decay_rank) "
        f"because that measured faster: joined / sub-tokens = {joined:.2f}x for the rank-2 "
        "forward above. The other classes run them as sub-tokens (no joined kernel).",
        END,
    ]
    return "\n".join(lines)


def write(section: str) -> None:
    text = RESULTS.read_text()
    if BEGIN in text:
        head, rest = text.split(BEGIN, 1)
        text = head + section + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    RESULTS.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--write", action="store_true", help="rewrite its section of RESULTS.md")
    args = parser.parse_args()
    if any(os.environ.get(k) != v for k, v in KEEP_MEMORY.items()):
        # glibc's malloc keeping freed memory, as every benchmark here (peers.py's KEEP_MEMORY)
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **KEEP_MEMORY})
    torch.set_num_threads(args.threads)
    section = report(measure(args.rounds), args.threads, args.rounds)
    print(section)
    if args.write:
        write(section)


if __name__ == "__main__":
    main()
