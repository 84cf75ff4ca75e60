"""What `mixc bench` measured: a point per (form, pass, T) with its repeated times and their
spread, and the whole result with the machine it ran on, as JSON. `mixc.tools.bench` measures,
`mixc.tools.bench_report` shows."""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import statistics
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["BenchResult", "Point", "machine", "quartiles_of", "spread_of"]


def quartiles_of(times: list[float]) -> tuple[float, float]:
    """The first and third quartiles of repeated times (inclusive method; one time: itself)."""
    if len(times) < 2:
        return times[0], times[0]
    q = statistics.quantiles(times, n=4, method="inclusive")
    return q[0], q[2]


def spread_of(times: list[float]) -> float:
    """The quartile range of repeated times over their median (0 for a median of 0)."""
    q1, q3 = quartiles_of(times)
    median = statistics.median(times)
    return (q3 - q1) / median if median > 0 else 0.0


@dataclass(eq=False)  # hashed by identity: suspect_points maps points to reasons
class Point:
    """One (form, pass, T) measurement. Times in seconds, memory in bytes."""

    form: str
    backward: bool
    T: int
    times: list[float]
    peak_bytes: int | None = None
    flops: float | None = None  # per call (forward + backward counted as 3x forward)
    unreliable: str | None = None  # why the figure is suspect after it was measured again
    remeasured: bool = False

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def quartiles(self) -> tuple[float, float]:
        return quartiles_of(self.times)

    @property
    def gflops(self) -> float | None:
        return None if self.flops is None else self.flops / self.median / 1e9

    @property
    def spread(self) -> float:
        """Quartile range over the median."""
        return spread_of(self.times)

    def to_json(self) -> dict:
        q1, q3 = self.quartiles
        return {
            "form": self.form,
            "pass": "forward+backward" if self.backward else "forward",
            "T": self.T,
            "median_s": self.median,
            "q1_s": q1,
            "q3_s": q3,
            "min_s": min(self.times),
            "max_s": max(self.times),
            "times_s": self.times,
            "peak_bytes": self.peak_bytes,
            "flops": self.flops,
            "gflops": self.gflops,
            "remeasured": self.remeasured,
            "unreliable": self.unreliable,
        }


@dataclass
class BenchResult:
    spec: str
    name: str
    sizes: dict[str, int]
    chunk_size: int
    threads: int
    device: str
    repeats: int
    points: list[Point] = field(default_factory=list)
    matmul: dict[int, dict] = field(default_factory=dict)  # T -> matmul reference
    notes: list[str] = field(default_factory=list)

    def point(self, form: str, T: int, backward: bool = False) -> Point | None:
        for p in self.points:
            if p.form == form and p.T == T and p.backward == backward:
                return p
        return None

    def matmul_fraction(self, p: Point) -> float | None:
        """Achieved GFLOP/s of a chunk-form point over the matmul reference at its T."""
        ref = self.matmul.get(p.T)
        if p.form != "chunk" or p.backward or ref is None or p.gflops is None:
            return None
        return p.gflops / ref["gflops"]

    def to_json(self) -> dict:
        points = []
        for p in self.points:
            d = p.to_json()
            d["matmul_fraction"] = self.matmul_fraction(p)
            points.append(d)
        return {
            "spec": self.spec,
            "mixer": self.name,
            "sizes": self.sizes,
            "chunk_size": self.chunk_size,
            "threads": self.threads,
            "device": self.device,
            "repeats": self.repeats,
            "machine": machine(self.device),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "matmul": {str(t): v for t, v in self.matmul.items()},
            "points": points,
            "notes": self.notes,
            "method": {
                "time": "wall clock (time.perf_counter) per call after warm-up; "
                "median, quartiles, min, max",
                "memory": "peak of tensor memory held during one call beyond its inputs, "
                "from torch's allocator records (torch.profiler profile_memory) on CPU; "
                "torch.cuda.max_memory_allocated on CUDA",
                "flops": "mixc.analysis.costs per token and head x B x NH x T; "
                "forward+backward counted as 3x forward",
            },
        }


def machine(device: str = "cpu") -> dict[str, str | int]:
    """What the numbers were measured on: CPU model, cores, torch version, threads."""
    import torch

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    info: dict[str, str | int] = {
        "cpu": cpu,
        "cores": os.cpu_count() or 0,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
    }
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info
