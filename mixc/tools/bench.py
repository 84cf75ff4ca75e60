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

The figures are kept in `mixc.tools.bench_result`, the measurements of one call are made by
`mixc.tools.bench_measure`, and `mixc.tools.bench_report` shows a result: as a table, a JSON
file or a plot. This module runs the sweep.
"""

from __future__ import annotations

import contextlib
import math
import time
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mixc.analysis.cost import costs
from mixc.analysis.plan import Plan, analyze
from mixc.errors import MixcError
from mixc.frontend.spec import Spec, load_spec
from mixc.tools.bench_measure import (
    chunk_shapes,
    matmul_calls,
    matmul_summary,
    matmul_throughput,
    measure_peak_memory,
    runner,
    time_call,
)
from mixc.tools.bench_result import BenchResult, Point, machine

#: The whole tool is found here, its results and measurements included.
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
        plan=ranges.plan,
    )


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
    plan = analyze(spec)
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
    sweep = _sweep(result, module, plan, forms, T, caps, backward)
    _check_memory(plan, sizes or {}, full_sizes, sweep, T, caps, chunk_size, device)
    bench = _Bench(spec, plan, module, result, *chunk_shapes(plan, full_sizes), clock)
    chunk_ts = sorted({t for form, t, _ in sweep if form == "chunk"})
    with _progress(progress, len(sweep) + len(chunk_ts) + 1) as advance:
        _measure(bench, sweep, chunk_ts, min(T, default=0), warmup, memory, advance)
        _measure_again(bench, warmup, advance)
    _mark_unreliable(result)
    return result


@dataclass
class _Bench:
    """A sweep under way: what timing a point or the matmul reference needs (the spec, its
    plan and module, the shapes the chunked form multiplies, the clock), and the result that
    gets the figures, with the sizes, chunk size, device and repeats they are taken at."""

    spec: Spec
    plan: Plan
    module: types.ModuleType
    result: BenchResult
    d_k: int
    d_v: int
    clock: Callable[[], float]

    def reference(self, t: int, repeats: int) -> dict:
        """The matmul reference at sequence length t: as many chunks as the chunked form runs."""
        r = self.result
        batch = r.sizes["B"] * r.sizes["NH"] * -(-t // r.chunk_size)
        return matmul_throughput(
            batch, r.chunk_size, self.d_k, self.d_v, repeats, r.device, self.clock
        )

    def times(
        self, form: str, t: int, bwd: bool, repeats: int, warmup: int
    ) -> tuple[list[float], Callable[[], None]]:
        """The times of one point on fresh inputs, and the call they timed."""
        r = self.result
        args = make_inputs(self.spec, r.sizes, t, device=r.device)
        call = runner(_form_call(self.module, form, r.chunk_size), args, bwd, r.device)
        return time_call(call, repeats, warmup, r.device, self.clock), call


def _measure(
    bench: _Bench,
    sweep: list[tuple[str, int, bool]],
    chunk_ts: list[int],
    shortest: int,
    warmup: int,
    memory: bool,
    advance: Callable[[str], None],
) -> None:
    """One untimed pass over every form, the matmul reference at every T in `chunk_ts`, then
    every point of the sweep: its times, peak memory (where `memory`) and FLOPs."""
    result = bench.result
    advance("warming up")
    if sweep:  # nothing to time (no form the module has): no inputs to draw
        args = make_inputs(bench.spec, result.sizes, shortest, device=result.device)
        _warm_up(bench.module, sweep, args, result)
    for t in chunk_ts:
        advance(f"matmul reference, T = {t}")
        result.matmul[t] = bench.reference(t, max(3, result.repeats))
    for form, t, bwd in sweep:
        advance(f"{form} {'fwd+bwd' if bwd else 'fwd'} T = {t}")
        measured, call = bench.times(form, t, bwd, result.repeats, warmup)
        peak = measure_peak_memory(call, result.device) if memory else None
        flops = _flops(bench.plan, result, form, t, bwd)
        result.points.append(Point(form, bwd, t, measured, peak, flops))


def _measure_again(bench: _Bench, warmup: int, advance: Callable[[str], None]) -> None:
    """Every figure that contradicts itself, measured again with REMEASURE_FACTOR times the
    repeats: a matmul reference spread beyond SPREAD_BOUND, and each suspect point (after a
    fresh warm-up)."""
    result = bench.result
    again = REMEASURE_FACTOR * max(3, result.repeats)
    for t, ref in result.matmul.items():
        if ref["spread"] > SPREAD_BOUND:
            advance(f"matmul reference again, T = {t}")
            result.matmul[t] = bench.reference(t, again)
    for p in suspect_points(result):
        advance(f"{p.form} {'fwd+bwd' if p.backward else 'fwd'} T = {p.T} again")
        p.times, _ = bench.times(p.form, p.T, p.backward, again, max(2, warmup))
        p.remeasured = True


def _mark_unreliable(result: BenchResult) -> None:
    """What is still suspect after it was measured again is marked unreliable, with why."""
    for p, reasons in suspect_points(result).items():
        p.unreliable = "; ".join(reasons)
    for t, ref in sorted(result.matmul.items()):
        if ref["spread"] > SPREAD_BOUND:
            ref["unreliable"] = f"repeats spread {100 * ref['spread']:.0f}% of the median"
            result.notes.append(f"matmul reference at T = {t}: unreliable, {ref['unreliable']}")


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


# ----------------------------------------------------------------------------- memory


#: Bytes of a number in the timed calls (fp32), and how many copies of every argument and
#: output a call holds at once (drawn in float64, converted, laid out for the kernels).
_BYTES, _COPIES = 4, 4


def _point_bytes(plan, sizes: dict[str, int], form: str, T: int, bwd: bool, chunk: int) -> int:
    """Rough peak bytes of one timed call: its arguments and output in a few copies, the states,
    and what the form adds (the chunked form a state and a C x C block per chunk, and the
    matmul reference as much; the parallel form T x T matrices); x3 with the backward pass."""
    mixer = plan.mixer

    def width(shape) -> int:
        return math.prod(int(d) if d.isdigit() else sizes[d] for d in shape)

    heads = sizes["B"] * sizes["NH"]
    out = width(plan.spec.shapes[mixer.outputs[0].target])
    io = heads * T * (sum(width(d.shape) for d in mixer.inputs) + out)
    state = heads * sum(width(d.shape) for d in mixer.states)
    extra = 2 * state
    if form == "chunk":
        d_k, d_v = chunk_shapes(plan, sizes)
        extra += 2 * heads * -(-T // chunk) * (state // heads + chunk * (chunk + d_k + d_v))
    elif form == "parallel":
        extra += 3 * heads * T * T * max(1, len(plan.groups))
    return _BYTES * (_COPIES * io + extra) * (3 if bwd else 1)


def _check_memory(
    plan,
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
        return max((_point_bytes(plan, sizes, f, t, b, chunk) for f, t, b in points), default=0)

    need, limit = peak(sizes, sweep), device_memory(device)
    if need <= limit:
        return
    defaults = default_sizes(plan.spec)
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
    form, t, bwd = max(sweep, key=lambda p: _point_bytes(plan, sizes, *p, chunk))
    what = f"{form}{' with its backward pass' if bwd else ''} at T = {t}"
    check_bytes(option, value, need, what, limit)


# ----------------------------------------------------------------------------- points


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
    plan,
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
                f"{form}: not available for {result.name} ({plan.reason or 'no such form'})"
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
            call = runner(_form_call(module, form, result.chunk_size), args, bwd, result.device)
            time_call(call, 0, warmup=2, device=result.device)


def _flops(plan, result: BenchResult, form: str, T: int, backward: bool) -> float | None:
    """FLOPs of one call (forward + backward counted as 3x the forward), or None."""
    per_token = _flops_per_token(plan, form, result.sizes, result.chunk_size, T)
    if per_token is None:
        return None
    return per_token * result.sizes["B"] * result.sizes["NH"] * T * (3 if backward else 1)


def _flops_per_token(plan, form: str, sizes: dict[str, int], chunk: int, T: int) -> float | None:
    """Per token and head, from the analysis' cost model (None when it has no count)."""
    c = costs(plan)
    cost = {"chunk": c.chunked, "recurrent": c.recurrent, "parallel": c.quadratic}[form]
    if cost is None:
        return None
    values = {k: v for k, v in sizes.items() if k not in ("B", "NH")}
    values[c.chunk] = chunk
    values[c.seq] = T
    return cost.flops.value(values)


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
