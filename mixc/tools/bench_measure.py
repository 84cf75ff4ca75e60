"""How `mixc bench` measures one call: its wall time over repeats, the peak tensor memory it
holds, and the reference it is compared with, this machine's fp32 batched-matmul throughput at
the shapes the chunked form multiplies. The method is described in `mixc.tools.bench`."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable

from mixc.tools.bench_result import Point

__all__ = [
    "chunk_shapes",
    "matmul_calls",
    "matmul_summary",
    "matmul_throughput",
    "measure_peak_memory",
    "runner",
    "time_call",
]


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def runner(fn: Callable, args: list, backward: bool, device: str) -> Callable[[], None]:
    """A closure doing one forward (or forward + backward) call."""
    import torch

    if not backward:

        def forward() -> None:
            with torch.no_grad():
                fn(*args)

        return forward
    leaves = [a.detach().clone().requires_grad_(True) for a in args]
    with torch.no_grad():
        y = fn(*args)
    cot = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(device)

    def forward_backward() -> None:
        for x in leaves:
            x.grad = None
        y = fn(*leaves)
        y.backward(cot)

    return forward_backward


def time_call(
    call: Callable[[], None],
    repeats: int,
    warmup: int = 1,
    device="cpu",
    clock: Callable[[], float] = time.perf_counter,
) -> list[float]:
    """Wall times (seconds, read from `clock`) of `repeats` calls after `warmup` untimed ones."""
    for _ in range(warmup):
        call()
    _sync(device)
    times = []
    for _ in range(repeats):
        start = clock()
        call()
        _sync(device)
        times.append(clock() - start)
    return times


def measure_peak_memory(call: Callable[[], None], device: str = "cpu") -> int:
    """Peak tensor memory (bytes) held during one call beyond what existed before it."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        call()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        call()
    events = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and "CPU" in str(e.device_type())
    )
    held = peak = 0
    for _, nbytes in events:
        held += nbytes
        peak = max(peak, held)
    return peak


@contextlib.contextmanager
def _quiet_stderr():
    """Silence file descriptor 2 (the profiler's C++ start/stop log lines) for a moment."""
    import sys

    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # no real stderr (e.g. captured by pytest)
        yield
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), fd)
            yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)


def chunk_shapes(plan, sizes: dict[str, int]) -> tuple[int, int]:
    """(d_k, d_v) of the first chunked state group (the sizes the chunked form multiplies)."""
    if not plan.groups:
        return 64, 64

    def size(s: str) -> int:
        return int(s) if s.isdigit() else sizes[s]

    states = [plan.state(n) for n in plan.groups[0].states]
    lead = states[0]
    d_k = size(lead.shape[0] if lead.vector else lead.shape[1])
    d_v = sum(1 if s.vector else size(s.shape[0]) for s in states)
    return d_k, d_v


def matmul_calls(
    batch: int, chunk: int, d_k: int, d_v: int, device: str = "cpu"
) -> dict[str, tuple[float, Callable[[], object]]]:
    """The chunked form's four batched-matmul shapes, for `batch` chunks, as {name: (FLOPs,
    call)}: fp32 torch.bmm on seeded operands."""
    import torch

    gen = torch.Generator().manual_seed(2)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device)

    operands = {
        "QK^T (C x d_k x C)": (rand(batch, chunk, d_k), rand(batch, d_k, chunk)),
        "PV (C x C x d_v)": (rand(batch, chunk, chunk), rand(batch, chunk, d_v)),
        "QS (C x d_k x d_v)": (rand(batch, chunk, d_k), rand(batch, d_k, d_v)),
        "K^T V (d_k x C x d_v)": (rand(batch, d_k, chunk), rand(batch, chunk, d_v)),
    }
    return {
        name: (
            2.0 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2],
            lambda a=a, b=b: torch.bmm(a, b),
        )
        for name, (a, b) in operands.items()
    }


def matmul_summary(
    calls: dict[str, tuple[float, Callable[[], object]]],
    seconds: dict[str, float],
    batch: int,
    chunk: int,
    d_k: int,
    d_v: int,
    spread: float = 0.0,
) -> dict:
    """Throughput per shape and over all four, from each shape's time (seconds per call);
    `spread` is the widest quartile range over the median of a shape's repeats."""
    out: dict = {"batch": batch, "C": chunk, "d_k": d_k, "d_v": d_v, "spread": spread}
    out["shapes"] = {}
    for name, (flops, _) in calls.items():
        out["shapes"][name] = {"seconds": seconds[name], "gflops": flops / seconds[name] / 1e9}
    total_flops = sum(flops for flops, _ in calls.values())
    out["gflops"] = total_flops / sum(seconds.values()) / 1e9
    return out


def matmul_throughput(
    batch: int,
    chunk: int,
    d_k: int,
    d_v: int,
    repeats: int = 5,
    device: str = "cpu",
    clock: Callable[[], float] = time.perf_counter,
) -> dict:
    """fp32 batched-matmul throughput at the chunked form's shapes, for `batch` chunks."""
    calls = matmul_calls(batch, chunk, d_k, d_v, device)
    times = {
        name: Point("bmm", False, 0, time_call(call, repeats, 2, device, clock))
        for name, (_, call) in calls.items()
    }
    seconds = {name: p.median for name, p in times.items()}
    spread = max(p.spread for p in times.values())
    return matmul_summary(calls, seconds, batch, chunk, d_k, d_v, spread)
