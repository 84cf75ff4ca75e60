"""torch.compile of a MixerLayer: the first call's time (compile included) and compiled against
eager speed, for every shipped spec.

    python benchmarks/compile.py --threads 1 --write   # every spec; rewrites its RESULTS.md section
    python benchmarks/compile.py gla rwkv7 --json compile.json     # some specs, a table on stdout
    python benchmarks/compile.py --from-json compile.json --write  # the section from saved rows

Each spec runs in a fresh worker process with its own inductor cache directory, holding
nothing of a layer, so the first call compiles the layer from nothing (no FX-graph, autograd or
kernel cache from an earlier run; see start-up below for what the directory holds).
A layer MixerLayer(spec, hidden_size=256, num_heads=4) (d = 64 per head, chunk size 64, its
defaults otherwise) takes x [B=2, T=512, 256] in fp32 on the CPU; torch.compile(layer,
fullgraph=True) with the default (inductor) backend. Measured:

- start-up: before the layer, the worker compiles a one-line function (forward and backward),
  which pays what any first torch.compile in a process pays whatever it compiles: importing
  inductor and its probe of the CPU's vector instructions. The probe builds a C++ library per
  instruction set, kept in the cache directory, so paid once per machine, and loads each in a
  child process, paid by every process. So the run first times the one-line function alone in
  a process of its own with an empty cache directory (the first process on a machine), and each
  worker's cache directory starts as a copy of what that left (the probe's builds and the
  one-line function's; nothing of a layer): its start-up is a later process's. Recorded apart,
  not counted in the layer's first call; a fresh process pays start-up + first call;
- first call: compiled forward and backward of y.square().mean(), from the call to the end of
  the backward (what a training script waits for before its first step), in wall time and in
  CPU time (the process and its children, the C++ compiler's builds: less sensitive than the
  wall time to other work on a shared machine);
- graphs: the graphs Dynamo compiled over the whole run (1: no recompile);
- steady state: forward+backward of the compiled and the eager layer, timed in alternation in
  the same process (warm-up calls first, then pairs of calls in alternating order), the median
  of the repeats of each, and the median of the pairs' ratios (eager over compiled).

Before timing, the compiled and the eager layer's output and gradients are compared with the
same layer in float64 (eager), as relative RMS errors per tensor: the compiled layer passes if
each of its errors is at most twice the eager layer's, or under 1e-5 (float32 rounding; the
inductor reorders sums, so the two float32 results differ from each other by rounding, and a
gradient that cancels to near zero differs in relative terms by much more than its neighbours).
A layer that does not pass is still timed, and its row says which result the rule refused
(a compiled result outside it is a finding to look into, never a figure to read past).
Recorded: the largest error of each.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
B, T, HIDDEN, HEADS = 2, 512, 256, 4
WARMUP, REPEATS = 2, 15


def _rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def _cpu() -> float:
    """CPU seconds of this process and its children, finished or running (inductor's pool of
    compile workers, and the C++ compiler's builds they start), from /proc where there is one."""
    own, finished = (
        resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    total = own.ru_utime + own.ru_stime + finished.ru_utime + finished.ru_stime
    stats = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        # after the name: state, ppid, ..., utime stime cutime cstime (fields 14-17 of stat)
        stats[int(entry.parent.name)] = (int(fields[1]), sum(int(f) for f in fields[11:15]))
    parents, ticks = {os.getpid()}, os.sysconf("SC_CLK_TCK")
    while True:
        found = {pid for pid, (ppid, _) in stats.items() if ppid in parents} - parents
        if not found:
            break
        parents |= found
        total += sum(stats[pid][1] for pid in found) / ticks
    return total


def _step(layer, x):
    """One forward+backward; returns the output and the gradients of x and the parameters."""
    x = x.detach().requires_grad_(True)
    for p in layer.parameters():
        p.grad = None
    y, _ = layer(x)
    y.square().mean().backward()
    return [y.detach(), x.grad, *(p.grad for p in layer.parameters() if p.grad is not None)]


def _startup() -> float:
    """The wall time of a first torch.compile of a one-line function, forward and backward."""
    import torch

    start = time.perf_counter()
    a = torch.ones(8, requires_grad=True)
    torch.compile(lambda a: a.sin().sum(), fullgraph=True)(a).backward()
    return time.perf_counter() - start


def _errors(compiled, eager, exact) -> tuple[float, float, list[str]]:
    """The largest relative errors of the compiled and the eager results against the float64
    ones, and the results the docstring's rule refuses (none where the compiled layer passes)."""
    worst, refused = (0.0, 0.0), []
    for i, (c, e, x) in enumerate(zip(compiled, eager, exact, strict=True)):
        c_error, e_error = _rel(c, x), _rel(e, x)
        if not c_error <= max(2 * e_error, 1e-5):
            refused.append(
                f"result {i} (0 the output, 1 the input's gradient, then the parameters'): "
                f"compiled {c_error:.2e} from float64, eager {e_error:.2e}"
            )
        worst = (max(worst[0], c_error), max(worst[1], e_error))
    return *worst, refused


def measure(spec: str, threads: int) -> dict:
    """The worker: one spec's first-call time and compiled and eager steady-state times."""
    import copy

    import torch

    from mixc.nn import MixerLayer

    torch.set_num_threads(threads)
    startup = _startup()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    layer = MixerLayer(ROOT / "specs" / f"{spec}.mix", hidden_size=HIDDEN, num_heads=HEADS)
    x = torch.randn(B, T, HIDDEN)
    compiled = torch.compile(layer, fullgraph=True)
    start, cpu = time.perf_counter(), _cpu()
    got = _step(compiled, x)
    first, first_cpu = time.perf_counter() - start, _cpu() - cpu
    error, eager_error, refused = _errors(
        got, _step(layer, x), _step(copy.deepcopy(layer).double(), x.double())
    )
    for _ in range(WARMUP):
        _step(compiled, x), _step(layer, x)
    times = {"compiled": [], "eager": []}
    pair = [("compiled", compiled), ("eager", layer)]
    for _ in range(REPEATS):
        for name, fn in pair:
            start = time.perf_counter()
            _step(fn, x)
            times[name].append(time.perf_counter() - start)
        pair.reverse()  # neither layer always runs second, in the cache the other left
    compiled_s, eager_s = (statistics.median(times[k]) for k in ("compiled", "eager"))
    # the ratio of each pair's times, taken in the same few hundred milliseconds: a shared
    # machine's speed drifts between the repeats, and a ratio of the two medians mixes the drift in
    paired = statistics.median(e / c for c, e in zip(times["compiled"], times["eager"]))
    return {
        "spec": spec,
        "startup_s": startup,
        "first_call_s": first,
        "first_call_cpu_s": first_cpu,
        "graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"],
        "compiled_ms": compiled_s * 1e3,
        "eager_ms": eager_s * 1e3,
        "speedup": paired,
        "speedup_of": f"median of {REPEATS} paired ratios",
        "max_rel_error": error,
        "eager_rel_error": eager_error,
        "refused": refused,
    }


def _worker(args: list[str], cache: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, __file__, "--worker", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, check=False)


def _first_startup(probe: str, threads: int) -> float:
    """The start-up of the first process on a machine: the one-line function compiled in a
    process of its own with the empty cache directory `probe`, which it fills."""
    out = _worker(["--startup", "--threads", str(threads)], probe)
    if out.returncode != 0:
        raise SystemExit(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])["startup_s"]


def _run_worker(spec: str, threads: int, probe: str, first_startup: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="mixc-inductor-") as cache:
        shutil.copytree(probe, cache, dirs_exist_ok=True)
        out = _worker([spec, "--threads", str(threads)], cache)
    if out.returncode != 0:
        return {"spec": spec, "error": (out.stderr.strip().splitlines() or ["?"])[-1]}
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "first_startup_s": first_startup}


START, END = "<!-- compile: written by benchmarks/compile.py -->", "<!-- compile: end -->"


def _table(rows: list[dict], threads: int) -> str:
    import torch

    lines = [
        f"- Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs visible, "
        f"{threads} torch threads, torch {torch.__version__}, Python {platform.python_version()}; "
        f"load average at the end {os.getloadavg()[0]:.1f} (a shared machine)",
        f"- Layer: MixerLayer(spec, hidden_size={HIDDEN}, num_heads={HEADS}), x [{B}, {T}, "
        f"{HIDDEN}] fp32, torch.compile(fullgraph=True), inductor; median of {REPEATS} "
        "forward+backward calls each, compiled and eager in alternation; eager / compiled is "
        f"the median of the {REPEATS} pairs' ratios",
        "",
        "| spec | first call (compile + fwd + bwd) | its CPU time | a later fresh process "
        "(start-up + first call) | graphs | compiled fwd+bwd | eager fwd+bwd | eager / compiled "
        "| error vs float64: compiled (eager) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['spec']} | failed: {r['error']} | | | | | | | |")
            continue
        lines.append(
            f"| {r['spec']} | {r['first_call_s']:.1f} s | {r['first_call_cpu_s']:.1f} s | "
            f"{r['startup_s'] + r['first_call_s']:.1f} s | "
            f"{r['graphs']} | {r['compiled_ms']:.1f} ms | {r['eager_ms']:.1f} ms | "
            f"{r['speedup']:.2f}x{'' if 'speedup_of' in r else ' *'} | "
            f"{r['max_rel_error']:.1e} ({r['eager_rel_error']:.1e})"
            + "".join(f"; **refused by the rule**: {why}" for why in r.get("refused", ()))
            + " |"
        )
    if any("speedup_of" not in r for r in rows if "error" not in r):
        lines += [
            "",
            "\\* rows saved by the script before it paired the calls: the ratio of the medians "
            "of 7 calls each, compiled first in every pair.",
        ]
    startups = sorted(r["startup_s"] for r in rows if "startup_s" in r)
    firsts = sorted(r["first_startup_s"] for r in rows if "first_startup_s" in r)
    if startups:
        lines += [
            "",
            "Start-up before each layer (a one-line function's first compile: inductor's imports "
            "and its probe of the CPU's vector instructions), not in the first call: in a later "
            f"process {startups[0]:.1f}-{startups[-1]:.1f} s (median "
            f"{statistics.median(startups):.1f} s)"
            + (f"; in the first process on the machine {firsts[0]:.1f} s." if firsts else "."),
        ]
    return "\n".join(lines)


def write(table: str) -> None:
    """Rewrite this benchmark's section of RESULTS.md (before the notes written by hand)."""
    path = ROOT / "benchmarks" / "RESULTS.md"
    section = "\n".join(
        [
            START,
            "## torch.compile of a layer (issue 34)",
            "",
            f"`python benchmarks/compile.py --threads 1 --write`, {datetime.date.today()}: "
            "the first call of `torch.compile(MixerLayer(...), fullgraph=True)`, forward and "
            "backward from an inductor cache holding nothing of the layer, and the compiled "
            "against the eager layer (see the script's docstring).",
            "",
            table,
            END,
            "",
        ]
    )
    text = path.read_text(encoding="utf-8")
    if START in text:
        text = text[: text.index(START)] + section + text[text.index(END) + len(END) + 1 :]
    else:
        notes = text.index("<!-- notes:")
        text = text[:notes] + section + "\n" + text[notes:]
    path.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("specs", nargs="*", help="shipped spec names (default: every one)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--from-json", help="rows saved by --json (or one JSON object a line)")
    parser.add_argument("--write", action="store_true", help="rewrite its section of RESULTS.md")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--startup", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        if args.startup:
            import torch

            torch.set_num_threads(args.threads)
            print(json.dumps({"startup_s": _startup()}))
        else:
            print(json.dumps(measure(args.specs[0], args.threads)))
        return
    if args.from_json:
        text = Path(args.from_json).read_text(encoding="utf-8").strip()
        rows = (
            json.loads(text) if text.startswith("[") else [json.loads(x) for x in text.splitlines()]
        )
    else:
        rows = []
        with tempfile.TemporaryDirectory(prefix="mixc-inductor-probe-") as probe:
            first = _first_startup(probe, args.threads)
            for spec in args.specs or sorted(p.stem for p in (ROOT / "specs").glob("*.mix")):
                rows.append(_run_worker(spec, args.threads, probe, first))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    table = _table(rows, args.threads)
    print(table)
    if args.write:
        write(table)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
