"""`mixc bench`: time the compiled forms of a spec over a sweep of sequence lengths.

For every form (`chunk`, `recurrent`, `parallel`) and sequence length T it reports the median
wall time over repeats (after warm-up) with the spread (quartiles, min and max), the peak
memory of one call, and the achieved GFLOP/s next to the machine's own fp32 matmul throughput
at the shapes the chunked form multiplies, measured in the same run.

How things are measured:

- Time: `time.perf_counter` around one call (forward: under `torch.no_grad()`; forward +
  backward: the output's backward with a fixed random cotangent, gradients of every input).
  CUDA work is synchronised before the clock is read.
- Peak memory, CPU: torch's own allocator records, via `torch.profiler` with
  `profile_memory=True`: every allocation and free of tensor memory during one call, in time
  order; the peak is the largest running sum, i.e. the most tensor memory the call held at
  once beyond what existed before it (its inputs), outputs included. It counts tensors only
  (not the Python heap, not memory the C library keeps after a free), so it is exact for
  what the algorithm allocates and independent of the allocator's caching. (tracemalloc does
  not see torch's allocations.) CUDA: `torch.cuda.max_memory_allocated` after a reset.
- FLOPs: the analysis' cost model (`mixc.analysis.costs`, per token and head, a multiply-add
  is 2 FLOPs), times B * NH * T. Forward + backward is counted as 3x the forward FLOPs (the
  usual convention: the backward does two matmuls for each one of the forward).
- Matmul throughput: batched fp32 `torch.bmm` at the shapes of the chunked form, for
  B * NH * T / C chunks: Q K^T (C x d_k x C), P V (C x C x d_v), Q S (C x d_k x d_v) and K^T V
  (d_k x C x d_v); the reference is their total FLOPs over their total median time. The
  chunked form's "% of matmul" is its GFLOP/s over that reference: how close it runs to what
  this machine's BLAS achieves on the same multiplications.

Every figure checks itself (`suspect_points`): a spread between repeats beyond
`SPREAD_BOUND`, a chunked form faster than the matmul reference allows (over 100% of it), or a
time that falls as T grows (by more than `MONOTONE_SLACK`) is measured again with
`REMEASURE_FACTOR` times the repeats after a fresh warm-up; what is still suspect is marked
unreliable, with the reason, in the table and the JSON. A matmul reference with too wide a
spread is measured again the same way.

`mixc.tools.bench_report` shows a result: as a table, a JSON file or a plot.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mixc.analysis.cost import costs
from mixc.analysis.plan import analyze
from mixc.errors import MixcError
from mixc.frontend.spec import load_spec

__all__ = [
    "BenchResult",
    "Point",
    "default_sizes",
    "machine",
    "make_inputs",
    "matmul_calls",
    "matmul_summary",
    "matmul_throughput",
    "measure_peak_memory",
    "run",
    "suspect_points",
    "time_call",
]

#: Sweeps of sequence lengths: the default (well under a minute on 2 CPU cores), --quick and
#: --full.
DEFAULT_T = (1024, 4096)
QUICK_T = (512,)
FULL_T = (512, 1024, 2048, 4096, 8192, 16384)
#: A point whose quartile range exceeds this fraction of its median is suspect.
SPREAD_BOUND = 0.25
#: A point more than this fraction faster than the same form at a shorter T is suspect.
MONOTONE_SLACK = 0.10
#: A suspect point is measured again with this many times the repeats.
REMEASURE_FACTOR = 3
#: The recurrent form runs one step per token in Python: by default it stops here.
RECURRENT_MAX_T = 4096
#: The parallel form holds T x T matrices (O(T^2) memory): by default it stops here.
PARALLEL_MAX_T = 2048
FORMS = ("chunk", "recurrent", "parallel")


# ----------------------------------------------------------------------------- results


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


# ----------------------------------------------------------------------------- machine


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


# ----------------------------------------------------------------------------- inputs


def default_sizes(spec, given: dict[str, int] | None = None) -> dict[str, int]:
    """B = 1, NH = 4 and every size the spec declares = 64, overridden by `given`."""
    mixer = spec.mixer
    dims = {
        d
        for decl in (*mixer.inputs, *mixer.params, *mixer.states)
        for d in decl.shape
        if not d.isdigit()
    }
    sizes = {"B": 1, "NH": 4} | {d: 64 for d in sorted(dims)}
    for name, value in (given or {}).items():
        if name not in sizes:
            known = ", ".join(sizes)
            raise MixcError(f"--sizes: unknown size {name} (sizes of {mixer.name}: {known})")
        sizes[name] = value
    return sizes


def make_inputs(spec, sizes: dict[str, int], T: int, *, device="cpu", seed: int = 0) -> list:
    """Random fp32 arguments for the compiled module, B and NH from `sizes`: the fuzzer's input
    ranges (`mixc.check.sampling.sample_inputs`), each argument in its plain mode except the
    inputs and parameters of a decay, drawn so that every decay is near 1
    (`decays_near_one`). Decays near 1 are typical of trained models and keep every
    intermediate a normal float (subnormal floats would time the FPU's slow path, not the
    algorithm).
    """
    from mixc.check.ranges import decays_near_one, input_ranges
    from mixc.check.sampling import sample_inputs

    ranges = input_ranges(spec)
    return sample_inputs(
        spec,
        sizes,
        T,
        batch=sizes["B"],
        heads=sizes["NH"],
        device=device,
        seed=seed,
        modes=decays_near_one(ranges),
        facts=ranges.facts,
    )


# ----------------------------------------------------------------------------- measuring


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def _runner(fn: Callable, args: list, backward: bool, device: str) -> Callable[[], None]:
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


def chunk_shapes(facts, sizes: dict[str, int]) -> tuple[int, int]:
    """(d_k, d_v) of the first chunked state group (the sizes the chunked form multiplies)."""
    if not facts.groups:
        return 64, 64

    def size(s: str) -> int:
        return int(s) if s.isdigit() else sizes[s]

    group = [facts.state(n) for n in facts.groups[0].states]
    lead = group[0]
    d_k = size(lead.shape[0] if lead.vector else lead.shape[1])
    d_v = sum(1 if s.vector else size(s.shape[0]) for s in group)
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


def _flops_per_token(facts, form: str, sizes: dict[str, int], chunk: int, T: int) -> float | None:
    """Per token and head, from the analysis' cost model (None when it has no count)."""
    c = costs(facts)
    cost = {"chunk": c.chunked, "recurrent": c.recurrent, "parallel": c.quadratic}[form]
    if cost is None:
        return None
    values = {k: v for k, v in sizes.items() if k not in ("B", "NH")}
    values[c.chunk] = chunk
    values[c.seq] = T
    return cost.flops.value(values)


# ----------------------------------------------------------------------------- the sweep


def run(
    spec_path: str,
    *,
    sizes: dict[str, int] | None = None,
    T: Sequence[int] = DEFAULT_T,
    chunk_size: int | None = None,
    forms: Sequence[str] = FORMS,
    backward: bool = False,
    repeats: int = 5,
    warmup: int = 1,
    threads: int | None = 2,
    device: str = "cpu",
    recurrent_max_T: int = RECURRENT_MAX_T,
    parallel_max_T: int = PARALLEL_MAX_T,
    memory: bool = True,
    progress: bool = True,
    clock: Callable[[], float] = time.perf_counter,
) -> BenchResult:
    """Time the compiled module of `spec_path` over the sweep; see the module docstring."""
    import torch

    from mixc.driver import load

    if threads is not None:
        torch.set_num_threads(threads)
    _check_options(forms, chunk_size, repeats)
    spec = load_spec(spec_path)
    facts = analyze(spec)
    module = load(spec_path)
    chunk_size = chunk_size or module.CHUNK_SIZE
    full_sizes = default_sizes(spec, sizes)
    result = BenchResult(
        spec=str(spec_path),
        name=spec.mixer.name,
        sizes=full_sizes,
        chunk_size=chunk_size,
        threads=torch.get_num_threads(),
        device=device,
        repeats=repeats,
    )
    caps = {"recurrent": recurrent_max_T, "parallel": parallel_max_T}
    sweep = _sweep(result, module, facts, forms, T, caps, backward)
    _check_memory(facts, sizes or {}, full_sizes, sweep, T, caps, chunk_size, device)
    chunk_ts = sorted({t for form, t, _ in sweep if form == "chunk"})
    d_k, d_v = chunk_shapes(facts, full_sizes)

    def reference(t: int, repeats: int) -> dict:
        batch = full_sizes["B"] * full_sizes["NH"] * -(-t // chunk_size)
        return matmul_throughput(batch, chunk_size, d_k, d_v, repeats, device, clock)

    def times(form: str, t: int, bwd: bool, repeats: int, warmup: int) -> tuple[list, Callable]:
        args = make_inputs(spec, full_sizes, t, device=device)
        call = _runner(_form_call(module, form, chunk_size), args, bwd, device)
        return time_call(call, repeats, warmup, device, clock), call

    with _progress(progress, len(sweep) + len(chunk_ts) + 1) as advance:
        advance("warming up")
        if sweep:  # nothing to time (no form the module has): no inputs to draw
            _warm_up(module, sweep, make_inputs(spec, full_sizes, min(T), device=device), result)
        for t in chunk_ts:
            advance(f"matmul reference, T = {t}")
            result.matmul[t] = reference(t, max(3, repeats))
        for form, t, bwd in sweep:
            advance(f"{form} {'fwd+bwd' if bwd else 'fwd'} T = {t}")
            measured, call = times(form, t, bwd, repeats, warmup)
            peak = measure_peak_memory(call, device) if memory else None
            flops = _flops(facts, result, form, t, bwd)
            result.points.append(Point(form, bwd, t, measured, peak, flops))
        again = REMEASURE_FACTOR * max(3, repeats)
        for t, ref in result.matmul.items():
            if ref["spread"] > SPREAD_BOUND:
                advance(f"matmul reference again, T = {t}")
                result.matmul[t] = reference(t, again)
        for p in suspect_points(result):
            advance(f"{p.form} {'fwd+bwd' if p.backward else 'fwd'} T = {p.T} again")
            p.times, _ = times(p.form, p.T, p.backward, again, max(2, warmup))
            p.remeasured = True
    for p, reasons in suspect_points(result).items():
        p.unreliable = "; ".join(reasons)
    for t, ref in sorted(result.matmul.items()):
        if ref["spread"] > SPREAD_BOUND:
            ref["unreliable"] = f"repeats spread {100 * ref['spread']:.0f}% of the median"
            result.notes.append(f"matmul reference at T = {t}: unreliable, {ref['unreliable']}")
    return result


def suspect_points(result: BenchResult) -> dict[Point, list[str]]:
    """The points whose figures contradict themselves, each with the reasons: a spread between
    repeats beyond SPREAD_BOUND, a chunked form above 100% of the matmul reference (the peak
    measured for its multiplications), or a time that falls as T grows (both points of the
    pair: which one is wrong is not known)."""
    out: dict[Point, list[str]] = {}

    def flag(p: Point, reason: str) -> None:
        out.setdefault(p, []).append(reason)

    for p in result.points:
        if len(p.times) >= 3 and p.spread > SPREAD_BOUND:
            flag(
                p, f"repeats spread {100 * p.spread:.0f}% of the median (bound {SPREAD_BOUND:.0%})"
            )
        fraction = result.matmul_fraction(p)
        if fraction is not None and fraction > 1:
            flag(p, f"{100 * fraction:.0f}% of the matmul reference, above the measured peak")
        shorter = [
            q for q in result.points if (q.form, q.backward) == (p.form, p.backward) and q.T < p.T
        ]
        if shorter:
            q = max(shorter, key=lambda q: q.T)
            if p.median < (1 - MONOTONE_SLACK) * q.median:
                ms = f"{1e3 * p.median:.3g} ms at T = {p.T} against {1e3 * q.median:.3g} ms"
                flag(p, f"faster than at a shorter T ({ms})")
                flag(q, f"slower than at a longer T ({ms})")
    return out


#: Bytes of a number in the timed calls (fp32), and how many copies of every argument and
#: output a call holds at once (drawn in float64, converted, laid out for the kernels).
_BYTES, _COPIES = 4, 4


def _point_bytes(facts, sizes: dict[str, int], form: str, T: int, bwd: bool, chunk: int) -> int:
    """Rough peak bytes of one timed call: its arguments and output in a few copies, the states,
    and what the form adds (the chunked form a state and a C x C block per chunk, and the
    matmul reference as much; the parallel form T x T matrices); x3 with the backward pass."""
    mixer = facts.mixer

    def width(shape) -> int:
        return math.prod(int(d) if d.isdigit() else sizes[d] for d in shape)

    heads = sizes["B"] * sizes["NH"]
    out = width(facts.spec.shapes[mixer.outputs[0].target])
    io = heads * T * (sum(width(d.shape) for d in mixer.inputs) + out)
    state = heads * sum(width(d.shape) for d in mixer.states)
    extra = 2 * state
    if form == "chunk":
        d_k, d_v = chunk_shapes(facts, sizes)
        extra += 2 * heads * -(-T // chunk) * (state // heads + chunk * (chunk + d_k + d_v))
    elif form == "parallel":
        extra += 3 * heads * T * T * max(1, len(facts.groups))
    return _BYTES * (_COPIES * io + extra) * (3 if bwd else 1)


def _check_memory(
    facts,
    given: dict[str, int],
    sizes: dict[str, int],
    sweep: list[tuple[str, int, bool]],
    T: Sequence[int],
    caps: dict[str, int],
    chunk: int,
    device: str,
) -> None:
    """The sweep's largest call fits in the device's memory: checked before anything is
    allocated, naming the option (--T, --sizes, --parallel-max-T, --recurrent-max-T) that,
    set back to its default, shrinks it most."""
    from mixc.resources import check_bytes, device_memory

    def peak(sizes, points) -> int:
        return max((_point_bytes(facts, sizes, f, t, b, chunk) for f, t, b in points), default=0)

    need, limit = peak(sizes, sweep), device_memory(device)
    if need <= limit:
        return
    defaults = default_sizes(facts.spec)
    capped = {"recurrent": RECURRENT_MAX_T, "parallel": PARALLEL_MAX_T}
    shorter = [(f, min(t, max(DEFAULT_T)), b) for f, t, b in sweep]
    candidates = {("--T", ",".join(map(str, T))): (sizes, shorter)}
    for name, value in given.items():
        if value > defaults[name]:
            candidates[("--sizes", f"{name}={value}")] = (sizes | {name: defaults[name]}, sweep)
    for form, cap in caps.items():
        if cap > capped[form]:
            kept = [p for p in sweep if p[0] != form or p[1] <= capped[form]]
            candidates[(f"--{form}-max-T", cap)] = (sizes, kept)
    option, value = min(candidates, key=lambda c: peak(*candidates[c]))
    form, t, bwd = max(sweep, key=lambda p: _point_bytes(facts, sizes, *p, chunk))
    what = f"{form}{' with its backward pass' if bwd else ''} at T = {t}"
    check_bytes(option, value, need, what, limit)


def _check_options(forms: Sequence[str], chunk_size: int, repeats: int) -> None:
    """Usage errors in the sweep's options, before anything is loaded."""
    for form in forms:
        if form not in FORMS:
            raise MixcError(f"--forms: unknown form {form!r}; choose from {', '.join(FORMS)}")
    if chunk_size is not None and (chunk_size < 1 or chunk_size & (chunk_size - 1)):
        raise MixcError(f"--chunk-size: expected a power of two, got {chunk_size}")
    if repeats < 1:
        raise MixcError(f"--repeats: expected at least 1, got {repeats}")


def _sweep(
    result: BenchResult,
    module,
    facts,
    forms: Sequence[str],
    T: Sequence[int],
    caps: dict[str, int],
    backward: bool,
) -> list[tuple[str, int, bool]]:
    """The (form, T, backward) points to measure: forms the module has, up to each form's cap
    on T; what is left out goes to the result's notes."""
    available = set(module.FORMS)
    sweep = []
    for form in forms:
        if form not in available:
            result.notes.append(
                f"{form}: not available for {result.name} ({facts.reason or 'no such form'})"
            )
            continue
        cap = caps.get(form)
        skipped = [t for t in T if cap is not None and t > cap]
        if skipped:
            why = "one Python step per token" if form == "recurrent" else "T x T matrices"
            result.notes.append(
                f"{form}: runs up to T = {cap} ({why}); skipped T = {', '.join(map(str, skipped))}"
            )
        for t in T:
            if t not in skipped:
                sweep.extend([(form, t, False)] + ([(form, t, True)] if backward else []))
    return sweep


def _warm_up(module, sweep: list[tuple[str, int, bool]], args: list, result: BenchResult) -> None:
    """One untimed pass over every form and pass first: thread pools, BLAS kernels, lazy
    imports."""
    for form in {form for form, _, _ in sweep}:
        for bwd in {b for f, _, b in sweep if f == form}:
            call = _runner(_form_call(module, form, result.chunk_size), args, bwd, result.device)
            time_call(call, 0, warmup=2, device=result.device)


def _flops(facts, result: BenchResult, form: str, T: int, backward: bool) -> float | None:
    """FLOPs of one call (forward + backward counted as 3x the forward), or None."""
    per_token = _flops_per_token(facts, form, result.sizes, result.chunk_size, T)
    if per_token is None:
        return None
    return per_token * result.sizes["B"] * result.sizes["NH"] * T * (3 if backward else 1)


def _form_call(module, form: str, chunk_size: int) -> Callable:
    """The module's form as fn(*args) -> output."""
    fn = getattr(module, form)
    if form == "chunk":
        return lambda *a: fn(*a, chunk_size=chunk_size)[0]
    return lambda *a: fn(*a)[0]


@contextlib.contextmanager
def _progress(enabled: bool, total: int):
    if not enabled:
        yield lambda _text: None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("{task.description:<32}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, transient=True) as bar:
        task = bar.add_task("bench", total=total)
        first = [True]

        def advance(text: str) -> None:
            if not first[0]:
                bar.advance(task)
            first[0] = False
            bar.update(task, description=text)

        yield advance
        bar.advance(task)


# ----------------------------------------------------------------------------- command line


def parse_ints(text: str) -> list[int]:
    """ "512,1024" -> [512, 1024] (positive integers)."""
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item.isdigit() or int(item) < 1:
            raise ValueError(f"{item!r} is not a positive integer")
        out.append(int(item))
    return out
