"""Rotations (issue 31): linear attention with RoPE against plain linear attention, chunk forward,
how accurate the angles stay far from position 0, Mamba-3 SISO (specs/mamba3.mix: summed
data-dependent angles, R = N / 4 pairs turned) against Mamba-2 at T=4096 and against its own
recurrent form at T=8192 (chunk size 64 for both; N = P = 64), and how accurate Mamba-3's summed
angles stay at T = 10^6 (float32 inputs).

    python benchmarks/rotations.py --threads 2
    python benchmarks/rotations.py --threads 2 --mamba3  # the Mamba-3 rows only

Sizes: B=1, NH=4, d_k=d_v=64, T=4096, float32, CPU, chunk size 64 for both, forward under
torch.no_grad() (the target's), then with autograd and forward + backward. The two modules are timed in alternation in one process (warm-up, then
`--calls` calls of each in turn, `--rounds` times); the figures are the median over all calls,
and the target's ratio the median of the two modules' times in the same turn (paired).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1]))  # this checkout's mixc
import mixc

SPECS = Path(__file__).parents[1] / "specs"
B, NH, D, T = 1, 4, 64, 4096


#: The clock of time_calls: wall time, or the thread's CPU time (--cpu-time, with --threads 1:
#: on a loaded machine it leaves out the time other processes take the core).
CLOCK = [time.perf_counter]


def time_calls(fns: dict, calls: int, rounds: int) -> dict[str, list[float]]:
    """Milliseconds per call of each function, called in turn."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():  # warm-up
        fn(), fn()
    for _ in range(rounds * calls):
        for name, fn in fns.items():
            start = CLOCK[0]()
            fn()
            times[name].append(1e3 * (CLOCK[0]() - start))
    return times


def speed(calls: int, rounds: int, against: str | None = None) -> None:
    """The chunk forward without autograd (the target's), then with autograd (inputs that take
    a gradient) and forward + backward: each pair of modules timed in alternation."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, T, NH, D, generator=g) for _ in range(3))
    plain = mixc.load(SPECS / "linear_attention.mix")
    rope = mixc.load(SPECS / "linear_attention_rope.mix")
    tracked = [x.clone().requires_grad_() for x in (q, k, v)]
    other = {}
    if against:  # another compiled module of the spec (another branch's), timed in the same turns
        found = importlib.util.spec_from_file_location("against", against)
        module = importlib.util.module_from_spec(found)
        found.loader.exec_module(module)
        other = {f"linear_attention_rope ({against})": module}

    def backward(m):
        y, _ = m.chunk(*tracked, chunk_size=64)
        y.sum().backward()

    with torch.no_grad():
        times = time_calls(
            {
                "linear_attention": lambda: plain.chunk(q, k, v, chunk_size=64),
                "linear_attention_rope": lambda: rope.chunk(q, k, v, chunk_size=64),
                **{n: lambda m=m: m.chunk(q, k, v, chunk_size=64) for n, m in other.items()},
            },
            calls,
            rounds,
        )
    ratio = report(times, "chunk fwd")
    holds = "yes" if ratio <= 1.2 else "**no**"
    print(f"| paired ratio (target <= 1.2x) | {ratio:.2f}x | {holds} |")
    for what, fn in (
        ("chunk fwd, autograd", lambda m: m.chunk(*tracked, chunk_size=64)),
        ("chunk fwd+bwd", backward),
    ):
        fns = {
            "linear_attention": lambda fn=fn: fn(plain),
            "linear_attention_rope": lambda fn=fn: fn(rope),
            **{n: lambda fn=fn, m=m: fn(m) for n, m in other.items()},
        }
        ratio = report(time_calls(fns, calls, rounds), what)
        print(f"| paired ratio, {what} | {ratio:.2f}x |")


def paired(times: dict[str, list[float]], over: str, under: str) -> float:
    """The median over the turns of `over`'s call time divided by `under`'s in the same turn: a
    machine whose speed drifts (a shared VM: medians 2x apart from one run to the next) moves
    both calls of a turn alike, so this ratio drifts less than the ratio of the medians."""
    return statistics.median(a / b for a, b in zip(times[over], times[under], strict=True))


def report(times: dict[str, list[float]], what: str) -> float:
    """Prints each module's median (quartiles) and the ratio of their medians, and returns the
    median of rope's time over plain's in the same turn (paired)."""
    med = {name: statistics.median(t) for name, t in times.items()}
    for name, t in times.items():
        quart = statistics.quantiles(t, n=4)
        print(f"| {name} {what} | {med[name]:.2f} ms ({quart[0]:.2f}-{quart[2]:.2f}) |")
    for name in med:
        if name.startswith("linear_attention_rope ("):  # --against
            print(f"| ratio of {name}, {what} | {med[name] / med['linear_attention']:.2f}x |")
    ratio = med["linear_attention_rope"] / med["linear_attention"]
    print(f"| ratio of the medians, {what} | {ratio:.2f}x |")
    return paired(times, "linear_attention_rope", "linear_attention")


def mamba3_inputs(T: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    def r(*shape):
        return torch.randn(*shape, generator=g)

    sp = torch.nn.functional.softplus
    return dict(
        x=r(B, T, NH, D), z=r(B, T, NH, D), dt=sp(r(B, T, NH) - 3), A=sp(r(B, T, NH)),
        B=r(B, T, NH, D), C=r(B, T, NH, D), l=r(B, T, NH), w=r(B, T, NH, D // 4),
        D=r(NH), B_bias=torch.ones(NH, D), C_bias=torch.ones(NH, D),
    )  # fmt: skip


def mamba3(calls: int, rounds: int) -> None:
    g = torch.Generator().manual_seed(0)
    m2, m3 = (
        mixc.load(SPECS / "mamba2.mix"),
        mixc.load(SPECS / "mamba3.mix"),
    )
    a = mamba3_inputs(T, g)
    x2 = (a["x"], a["dt"], a["B"], a["C"], -a["A"][0, 0], a["D"])
    a3 = list(a.values())
    long = list(mamba3_inputs(2 * T, g).values())
    with torch.no_grad():
        times = time_calls(
            {
                "mamba2": lambda: m2.chunk(*x2, chunk_size=64),
                "mamba3": lambda: m3.chunk(*a3, chunk_size=64),
            },
            calls,
            rounds,
        )
        med = {name: statistics.median(t) for name, t in times.items()}
        ratio = paired(times, "mamba3", "mamba2")
        print(f"| mamba2 chunk fwd, T={T} | {med['mamba2']:.2f} ms |")
        print(f"| mamba3 chunk fwd, T={T} | {med['mamba3']:.2f} ms |")
        print(f"| ratio of the medians | {med['mamba3'] / med['mamba2']:.2f}x |")
        holds = "yes" if ratio <= 1.5 else "**no**"
        print(f"| paired ratio (target <= 1.5x) | {ratio:.2f}x | {holds} |")
        times = time_calls(
            {
                "chunk": lambda: m3.chunk(*long, chunk_size=64),
                "recurrent": lambda: m3.recurrent(*long),
            },
            1,
            1,
        )
        med = {name: statistics.median(t) for name, t in times.items()}
        ratio = med["recurrent"] / med["chunk"]
        print(f"| mamba3 chunk fwd, T={2 * T} | {med['chunk']:.2f} ms |")
        print(f"| mamba3 recurrent fwd, T={2 * T} | {med['recurrent']:.2f} ms |")
        print(f"| speed-up (target >= 10x) | {ratio:.1f}x | {'yes' if ratio >= 10 else '**no**'} |")


def accuracy() -> None:
    """Angles t * 10000^(-2i/64) at t = 10^6 .. 10^6 + 4095: the error of each way of computing
    cos in float32, and the module's output error from position 10^6 against float64."""
    positions = 1e6 + torch.arange(T, dtype=torch.float64)
    freq64 = 10000 ** (-torch.arange(D // 2, dtype=torch.float64) * 2 / D)
    exact = torch.cos(positions[:, None] * freq64)
    freq32 = freq64.float()
    ways = {
        "float32 product, float32 cos": torch.cos(positions.float()[:, None] * freq32),
        "float64 product of float32 frequencies, mod 2 pi, float32 cos": torch.cos(
            torch.remainder(positions[:, None] * freq32.double(), 2 * math.pi).float()
        ),
        "float64 product, mod 2 pi, float32 cos": torch.cos(
            torch.remainder(positions[:, None] * freq64, 2 * math.pi).float()
        ),
        "float64 product, float64 cos, rounded to float32 (mixc, T < 256)": torch.cos(
            positions[:, None] * freq64
        ).float(),
        "tables of 64-token runs and offsets (float64 angles), product in float32 (mixc)": (
            _table_turn(positions, freq64).real
        ),
    }
    for name, got in ways.items():
        print(f"| {name} | {(got.double() - exact).abs().max().item():.1e} |")
    rope = mixc.load(SPECS / "linear_attention_rope.mix")
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 512, NH, D, generator=g) for _ in range(3))
    errors = []
    for dtype in (torch.float32, torch.float64):
        state = (torch.zeros(1, NH, D, D, dtype=dtype), torch.full((1, NH), 1e6, dtype=dtype))
        with torch.no_grad():
            y, _ = rope.chunk(q.to(dtype), k.to(dtype), v.to(dtype), initial_state=state)
        errors.append(y.double())
    err = ((errors[0] - errors[1]).norm() / errors[1].norm()).item()
    print(
        f"| linear_attention_rope chunk from position 10^6, T=512, float32 vs float64 | {err:.1e} |"
    )


def _table_turn(positions: torch.Tensor, freq: torch.Tensor) -> torch.Tensor:
    """The turn the generated code's _turning_at builds for consecutive positions (written out
    here): the turns of each 64-token run's first position and of the offsets within a run,
    each cos and sin of float64 angles rounded to float32, multiplied in complex64."""
    runs = positions[::64, None, None] * freq  # [T / 64, 1, n]
    offsets = torch.arange(64, dtype=torch.float64)[:, None] * freq  # [64, n]
    heads, within = (
        torch.polar(torch.ones_like(a), a).to(torch.complex64) for a in (runs, offsets)
    )
    return (heads * within).reshape(-1, freq.shape[0])[: positions.shape[0]]


def mamba3_angles(T: int = 10**6) -> None:
    """Mamba-3's summed angles Th_t = Th_{t-1} + pi dt_t tanh(w_t) at T = 10^6 from float32
    inputs (dt = softplus(N(-3, 1)) as in mamba3_inputs, w = N(1, 1): angles that drift, as
    a trained rotation may): the largest error over t of a float32 sum token by token (what
    the forms did before the angles were kept in float64) and of the module's final Th (the
    chunked form, float64), against a float64 sum of the same increments."""
    g = torch.Generator().manual_seed(2)

    def r(*shape):
        return torch.randn(*shape, generator=g)

    a = dict(
        x=r(1, T, 1, 1), z=r(1, T, 1, 1), dt=torch.nn.functional.softplus(r(1, T, 1) - 3),
        A=torch.ones(1, T, 1), B=r(1, T, 1, 4), C=r(1, T, 1, 4), l=r(1, T, 1),
        w=1 + r(1, T, 1, 1), D=torch.ones(1), B_bias=torch.ones(1, 4), C_bias=torch.ones(1, 4),
    )  # fmt: skip
    step32 = math.pi * a["dt"][..., None] * torch.tanh(a["w"])
    exact = (math.pi * a["dt"].double()[..., None] * torch.tanh(a["w"].double())).cumsum(1)
    summed32 = step32.cumsum(1).double()  # sequential on CPU: a float32 state, token by token
    with torch.no_grad():
        _, (theta, *_) = mixc.load(SPECS / "mamba3.mix").chunk(*a.values(), output_final_state=True)
    rows = {
        "float32 sum, token by token (before)": (summed32 - exact).abs().max(),
        "float32 sum: cos of the last angle": (summed32[0, -1].cos() - exact[0, -1].cos())
        .abs()
        .max(),
        "mixc, float64 state (final Th of the chunked form)": (theta.double() - exact[0, -1])
        .abs()
        .max(),
    }
    print(
        f"| the angle after T = {T} tokens, |Th_T| = {exact[0, -1].abs().max().item():.3g} rad | max abs error |"
    )
    print("| --- | --- |")
    for name, err in rows.items():
        print(f"| {name} | {err.item():.1e} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cpu-time", action="store_true", help="the thread's CPU time")
    parser.add_argument("--against", help="another compiled linear_attention_rope module to time")
    parser.add_argument("--speed-only", action="store_true", help="only the RoPE speed table")
    parser.add_argument(
        "--mamba3", action="store_true", help="only Mamba-3 against Mamba-2 and its recurrent form"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, B={B} NH={NH} d={D} T={T} fp32")
    CLOCK[0] = time.thread_time if args.cpu_time else time.perf_counter
    if args.mamba3:
        print("| Mamba-3 SISO | median |\n| --- | --- |")
        mamba3(args.calls, args.rounds)
        return
    print("| chunk forward | median (quartiles) |\n| --- | --- |")
    speed(args.calls, args.rounds, args.against)
    if args.speed_only:
        return
    print("\n| cos of the angle at positions 10^6 .. 10^6 + 4095 | max abs error |\n| --- | --- |")
    accuracy()
    print("\n| Mamba-3 SISO | median |\n| --- | --- |")
    mamba3(args.calls, args.rounds)
    print()
    mamba3_angles()


if __name__ == "__main__":
    main()
