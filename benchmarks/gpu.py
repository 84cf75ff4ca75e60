"""mixc on a CUDA GPU against flash-linear-attention's Triton kernels and mamba_ssm's selective
scan. Run it through benchmarks/gpu.sh.

For each mixer (gated retention vs fla's chunk_simple_gla, GLA vs chunk_gla, Gated DeltaNet
vs chunk_gated_delta_rule, DeltaNet vs chunk_delta_rule, KDA vs chunk_kda; Mamba-1 vs
mamba_ssm's selective_scan_fn, where mamba_ssm is installed) at fla's benchmark shapes (bf16
[B, T, H, d] inputs), it times the chunked forward and forward+backward of four
implementations: mixc's PyTorch backend, the same under torch.compile, mixc's Triton backend,
and the peer (fla, or mamba_ssm). Outputs are compared with the peer's before anything is
timed. Each time is the median of
CUDA-event timings of `--repeats` calls after warm-up calls; the implementations of one case
are timed in alternation (one call of each in turn), so that all sample the same clock and
thermal phases. The table goes to benchmarks/RESULTS-gpu.md with the device, the versions, the
date and the command.

Compilation is most of a first run's time (benchmarks/RESULTS-gpu-static.md: a kernel takes
seconds to minutes to compile, the delta rule's backward the longest): before anything is timed,
one process per mixer runs its implementations once at a small shape with the same
specialisations (every size a multiple of 16, d = 128, the same chunk), in parallel, so that
triton's and torch.compile's on-disk caches hold every kernel when the timed run asks for it
(--no-warm: compile in the timed run, one after another).

Without a CUDA device it says "no CUDA device" and checks its own set-up instead (a dry run):
the imports, fla's functions and their arguments, and every mixc implementation on a tiny
shape on CPU (the Triton backend in triton's interpreter), forward and backward through the
same calls the timed run makes, each compared with the PyTorch backend; it writes no file and
exits 0.
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import os
import platform
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "specs"
OUT = ROOT / "benchmarks" / "RESULTS-gpu.md"


def _cuda_device_present() -> bool:
    """Whether the machine has an NVIDIA device, known before torch or triton is imported (the
    interpreter is chosen when triton is first imported)."""
    return Path("/dev/nvidia0").exists() or Path("/dev/nvidiactl").exists()


if not _cuda_device_present():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import _rel, time_alternating, wall_time  # noqa: E402

#: fla's benchmark shapes (B, T, H, d), bf16; and the dry run's.
SHAPES = ((1, 8192, 96, 128), (8, 2048, 16, 128))
DRY_SHAPES = ((1, 40, 2, 16),)
#: The warm-up's shape: every size a multiple of 16 and d = 128, as in SHAPES, so that triton
#: specialises the kernels' integer arguments (divisible by 16) as it does for SHAPES.
WARM_SHAPE = (1, 256, 16, 128)
#: Mamba-1 at mamba_ssm's scale: H heads of d channels (d_inner = H * d), a state of 16 per
#: channel, B and C shared by every channel.
MAMBA_STATE = 16
IMPLS = ("mixc pytorch", "mixc pytorch+compile", "mixc triton", "peer")
#: Relative RMS difference allowed between a mixc output and the peer's, both from bf16 inputs.
AGREE = 2e-2


@dataclass(frozen=True)
class Case:
    spec: str  # the mixc spec in specs/
    fla: str  # the fla function
    fla_module: str  # where it lives
    mixc_inputs: tuple[str, ...]  # the spec's inputs, in order, from the names below
    fla_inputs: tuple[str, ...]
    delta: bool  # keys L2-normalised (the delta rule needs |k| <= 1 for stability)
    channel_gate: bool = False  # g: one log-gate per key channel [B, T, H, d], not per head
    optional: bool = False  # the peer may be absent (mamba_ssm): the case is then left out


CASES = (
    Case(
        "gated_retention",
        "chunk_simple_gla",
        "fla.ops.simple_gla",
        ("q", "k", "v", "a"),
        ("q", "k", "v", "g"),
        False,
    ),
    Case(
        "gla",
        "chunk_gla",
        "fla.ops.gla",
        ("q", "k", "v", "g"),
        ("q", "k", "v", "g"),
        False,
        channel_gate=True,
    ),
    Case(
        "gated_deltanet",
        "chunk_gated_delta_rule",
        "fla.ops.gated_delta_rule",
        ("q", "k", "v", "g", "beta"),
        ("q", "k", "v", "g", "beta"),
        True,
    ),
    Case(
        "deltanet",
        "chunk_delta_rule",
        "fla.ops.delta_rule",
        ("q", "k", "v", "beta"),
        ("q", "k", "v", "beta"),
        True,
    ),
    Case(
        "kda",
        "chunk_kda",
        "fla.ops.kda",
        ("q", "k", "v", "g", "beta"),
        ("q", "k", "v", "g", "beta"),
        True,
        channel_gate=True,
    ),
    Case(
        "mamba1",
        "selective_scan_fn",
        "mamba_ssm.ops.selective_scan_interface",
        ("x", "dt", "B", "C", "A", "D"),
        ("u", "delta", "A_d", "B_d", "C_d", "D_d"),
        False,
        optional=True,
    ),
)


def _inputs(case: Case, shape, device, dtype) -> dict:
    """Seeded inputs in fla's layout [B, T, H, d] (per-token scalars [B, T, H], the log-gate g
    [B, T, H, d] for a case with a gate per channel); q scaled by 1/sqrt(d) here, so that both
    sides compute the same function (fla would scale it itself)."""
    batch, length, heads, d = shape
    gen = torch.Generator().manual_seed(0)

    def randn(*size):
        return torch.randn(*size, generator=gen)

    q, k, v = (randn(batch, length, heads, d) for _ in range(3))
    q = q * d**-0.5
    if case.delta:
        k = torch.nn.functional.normalize(k, dim=-1)
    a = randn(batch, length, heads, *((d,) if case.channel_gate else ())) + 3.0
    x = {
        "q": q,
        "k": k,
        "v": v,
        "a": a,
        "g": torch.nn.functional.logsigmoid(a),
        "beta": torch.sigmoid(randn(batch, length, heads)),
    }
    x = {n: t.to(device=device, dtype=dtype) for n, t in x.items()}
    if case.spec == "mamba1":
        x.update(_mamba_inputs(shape, randn, device, dtype))
    return x


def _mamba_inputs(shape, randn, device, dtype) -> dict:
    """Mamba-1's inputs for mixc (x, dt [B, T, H, d]; B, C [B, T, 1, N], one head shared; A
    [H, d, N] < 0 and D [H, d] in float32) and the same for mamba_ssm's selective_scan_fn (u,
    delta [B, H * d, T]; B, C [B, N, T]; A [H * d, N]; D [H * d]), laid out once, outside
    the timed calls."""
    batch, length, heads, d = shape
    x = randn(batch, length, heads, d).to(device=device, dtype=dtype)
    dt = torch.nn.functional.softplus(randn(batch, length, heads, d) - 4).to(device, dtype)
    b, c = (randn(batch, length, 1, MAMBA_STATE).to(device=device, dtype=dtype) for _ in "bc")
    a = -torch.exp(0.5 * randn(heads, d, MAMBA_STATE)).to(device)
    skip = randn(heads, d).to(device)

    def channels_first(t):  # [B, T, H, d] -> [B, H * d, T]
        return t.flatten(2).transpose(1, 2).contiguous()

    return {
        "x": x, "dt": dt, "B": b, "C": c, "A": a, "D": skip,
        "u": channels_first(x), "delta": channels_first(dt), "A_d": a.flatten(0, 1),
        "B_d": b[:, :, 0].transpose(1, 2).contiguous(),
        "C_d": c[:, :, 0].transpose(1, 2).contiguous(), "D_d": skip.flatten(),
    }  # fmt: skip


def _peer(case: Case, shape):
    """The peer's function, its output [B, T, H, d] as mixc's."""
    fn = getattr(__import__(case.fla_module, fromlist=[case.fla]), case.fla)
    if case.spec != "mamba1":
        return lambda *args: fn(*args, scale=1.0)[0]
    heads, d = shape[2:]
    return lambda *args: fn(*args).transpose(1, 2).unflatten(2, (heads, d))


def _calls(case: Case, shape, device, dtype, chunk_size: int, dry: bool) -> dict:
    """Implementation -> (fn(*leaves) -> output [B, T, H, d], leaves)."""
    import mixc

    x = _inputs(case, shape, device, dtype)
    path = SPECS / f"{case.spec}.mix"
    torch_module = mixc.load(path)
    triton_module = mixc.load(path, backend="triton")
    leaves = [x[n] for n in case.mixc_inputs]

    def chunk_of(module):
        def fn(*args):
            return module.chunk(*args, chunk_size=chunk_size)[0]

        return fn

    calls = {
        "mixc pytorch": (chunk_of(torch_module), leaves),
        "mixc triton": (chunk_of(triton_module), leaves),
    }
    if not dry:  # compiling for CPU is another benchmark (and needs a C++ toolchain)
        calls["mixc pytorch+compile"] = (torch.compile(chunk_of(torch_module)), leaves)
        calls["peer"] = (_peer(case, shape), [x[n] for n in case.fla_inputs])
    return calls


def _time(calls: dict, backward: bool, repeats: int, warmup: int, device) -> dict:
    """Median seconds per call of each implementation, timed in alternation."""
    runs = {}
    for name, (fn, leaves) in calls.items():
        own = [t.detach().clone().requires_grad_(backward) for t in leaves]

        def run(fn=fn, own=own):
            if not backward:
                with torch.no_grad():
                    return fn(*own)
            y = fn(*own)
            y.backward(torch.ones_like(y))
            return y

        runs[name] = run

    def cuda_time(call) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(True)
        start.record()
        call()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3

    measure = cuda_time if device.type == "cuda" else wall_time
    times = time_alternating(runs, {name: repeats for name in runs}, warmup, measure)
    return {name: statistics.median(t) for name, t in times.items()}


def _peer_installed(case: Case) -> bool:
    """Whether the case's peer imports (an optional one, mamba_ssm, may be absent)."""
    try:
        __import__(case.fla_module, fromlist=[case.fla])
    except ImportError:
        if not case.optional:
            raise
        return False
    return True


def _check_fla(case: Case) -> str:
    """That the peer's function imports and takes the arguments this benchmark passes."""
    module = __import__(case.fla_module, fromlist=[case.fla])
    fn = getattr(module, case.fla)
    params = list(inspect.signature(fn).parameters)
    if case.spec == "mamba1":  # positional: u, delta, A, B, C, D
        expected = ["u", "delta", "A", "B", "C", "D"]
        if params[:6] != expected:
            raise SystemExit(f"{case.fla_module}.{case.fla} takes ({', '.join(params[:6])})")
        return f"{case.fla}({', '.join(expected)})"
    missing = [p for p in (*case.fla_inputs, "scale") if p not in params]
    if missing:
        raise SystemExit(f"{case.fla_module}.{case.fla} takes no {', '.join(missing)}")
    return f"{case.fla}({', '.join(case.fla_inputs)}, scale=...)"


def warm(cases, chunk_size: int) -> None:
    """Every implementation of every case run once, forward and forward+backward, at
    WARM_SHAPE: one process per case, all at once, so that the timed run finds the compiled
    kernels in triton's (and torch.compile's) on-disk caches."""
    import subprocess
    import time

    start = time.perf_counter()
    command = [sys.executable, __file__, "--chunk-size", str(chunk_size), "--warm-case"]
    runs = [subprocess.Popen([*command, case.spec]) for case in cases]
    failed = [case.spec for case, run in zip(cases, runs, strict=True) if run.wait() != 0]
    note = f"; warm-up failed for {', '.join(failed)}" if failed else ""
    print(f"compiled in parallel in {time.perf_counter() - start:.0f} s{note}", flush=True)


def warm_case(case: Case, chunk_size: int) -> None:
    """One case's implementations run once at WARM_SHAPE, forward and forward+backward (a
    failure is reported by the timed run)."""
    calls = _calls(case, WARM_SHAPE, torch.device("cuda"), torch.bfloat16, chunk_size, False)
    for name, (fn, leaves) in calls.items():
        try:
            with torch.no_grad():
                fn(*leaves)
            own = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in leaves]
            fn(*own).float().sum().backward()
            torch.cuda.synchronize()
        except Exception as exc:
            print(f"  warm-up {case.spec} {name}: {type(exc).__name__}", file=sys.stderr)


def run_case(case: Case, shape, device, dtype, args, dry: bool) -> dict:
    """{impl: {"fwd": s, "fwd_bwd": s, "rel": vs the reference}} or {"error": text} per impl."""
    calls = _calls(case, shape, device, dtype, args.chunk_size, dry)
    reference = "mixc pytorch" if dry else "peer"
    with torch.no_grad():
        ref = calls[reference][0](*calls[reference][1]).float()
    row, good = {}, {}
    for name, (fn, leaves) in calls.items():
        try:
            with torch.no_grad():
                err = _rel(fn(*leaves).float(), ref)
        except Exception as exc:  # an implementation that fails at this shape (OOM, compile)
            row[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"}
            continue
        if err > AGREE:  # reported, not timed: a fast wrong answer is no result
            print(f"  {name} differs from {reference} by {err:.1e}", file=sys.stderr)
            row[name] = {"rel": err, "error": f"output differs from {reference}: not timed"}
            continue
        row[name], good[name] = {"rel": err}, (fn, leaves)
    for backward, key in ((False, "fwd"), (True, "fwd_bwd")):
        try:
            times = _time(good, backward, args.repeats, args.warmup, device)
        except Exception as exc:  # one implementation's backward failing: time the others alone
            print(f"  {key}: {type(exc).__name__}: {exc}; timing one at a time", file=sys.stderr)
            times = {}
            for name, call in good.items():
                try:
                    times.update(_time({name: call}, backward, args.repeats, args.warmup, device))
                except Exception as own:
                    row[name][key + "_error"] = f"{type(own).__name__}"
        for name, t in times.items():
            row[name][key] = t
    return row


def _ms(row: dict, key: str) -> str:
    if "error" in row:
        return row["error"]
    return f"{row[key] * 1e3:.2f}" if key in row else row.get(key + "_error", "-")


def table(results: list, dry: bool) -> str:
    lines = [
        "| mixer | shape (B, T, H, d) | implementation | fwd ms | fwd+bwd ms | rel. diff |",
        "| --- | --- | --- | ---: | ---: | ---: |",
    ]
    for case, shape, row in results:
        for name in IMPLS:
            if name not in row:
                continue
            r = row[name]
            rel = f"{r['rel']:.1e}" if "rel" in r else "-"
            lines.append(
                f"| {case.spec} ({case.fla}) | {shape} | {name} | {_ms(r, 'fwd')} | "
                f"{_ms(r, 'fwd_bwd')} | {rel} |"
            )
    versions = {"torch": torch.__version__}
    for package in ("triton", "fla", "mamba_ssm"):
        try:
            versions[package] = __import__(package).__version__
        except ImportError:
            versions[package] = "absent"
    device = torch.cuda.get_device_name() if not dry else f"CPU ({platform.machine()})"
    head = [
        "# mixc on a GPU against flash-linear-attention's Triton kernels and mamba_ssm",
        "",
        f"Measured {datetime.date.today()} on {device}, with "
        + ", ".join(f"{k} {v}" for k, v in versions.items())
        + f"; command `{' '.join(['benchmarks/gpu.sh', *sys.argv[1:]])}`.",
        "",
        (
            "DRY RUN: one call of each on a tiny shape on CPU, the Triton backend in triton's "
            "interpreter; a check of the set-up, not a measurement."
            if dry
            else "Median of CUDA-event timings per call; the implementations of a row group "
            "timed in alternation."
        )
        + " bf16 inputs; mixc's PyTorch backend computes in fp32, its Triton backend and fla "
        "multiply bf16 operands with fp32 accumulation (gates, decays and states in fp32). "
        "peer: the function named beside the mixer (fla's; mamba_ssm's selective scan for "
        "Mamba-1). rel. diff: relative RMS difference of the output from "
        + ("mixc's PyTorch backend (dry run)." if dry else "the peer's.")
        + " Targets (issue 19): the Triton backend's fwd+bwd within 1.5x of fla's and at least 5x "
        "faster than the PyTorch backend's.",
        "",
    ]
    return "\n".join(head + lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--chunk-size", type=int, default=64)
    p.add_argument("--only", choices=[c.spec for c in CASES], action="append")
    p.add_argument("--dry", action="store_true", help="the CPU set-up check, even with CUDA")
    p.add_argument("--no-warm", action="store_true", help="no parallel compile before timing")
    p.add_argument("--warm-case", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.warm_case:
        warm_case(next(c for c in CASES if c.spec == args.warm_case), args.chunk_size)
        return 0
    dry = args.dry or not torch.cuda.is_available()
    if dry:
        print("no CUDA device: checking the set-up only (a dry run on CPU)")
    import triton

    import mixc

    print(f"torch {torch.__version__}, triton {triton.__version__}, mixc {mixc.__version__}")
    cases = [c for c in CASES if args.only is None or c.spec in args.only]
    for case in cases:
        if _peer_installed(case):
            print(f"peer: {_check_fla(case)}")
        else:
            print(
                f"{case.fla_module} is not installed: {case.spec} "
                + ("checks mixc only" if dry else "is left out")
            )
    if not dry:
        cases = [c for c in cases if _peer_installed(c)]
        if not args.no_warm:
            warm(cases, args.chunk_size)
    device = torch.device("cpu" if dry else "cuda")
    results = []
    for case in cases:
        for shape in DRY_SHAPES if dry else SHAPES:
            print(f"{case.spec} {shape} ...", file=sys.stderr, flush=True)
            if dry:
                args.repeats, args.warmup = 1, 0
            results.append((case, shape, run_case(case, shape, device, torch.bfloat16, args, dry)))
    text = table(results, dry)
    if dry:
        print(text)
        failed = [f"{c.spec} {n}" for c, _, row in results for n, r in row.items() if "error" in r]
        if failed:
            print(f"set-up check FAILED: {', '.join(failed)}")
            return 1
        print("set-up checked; no CUDA device, so nothing was measured (exit 0)")
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(text)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
