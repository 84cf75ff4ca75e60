"""torch.compile of a MixerLayer: the first call's time (compile included) and compiled against
eager speed, for every shipped spec.

    python benchmarks/compile.py --threads 1 --write   # every spec; rewrites its RESULTS.md section
    python benchmarks/compile.py gla rwkv7 --json compile.json     # some specs, a table on stdout
    python benchmarks/compile.py --from-json compile.json --write  # the section from saved rows

Each spec runs in a fresh worker process with its own empty inductor cache directory, so the
first call compiles from nothing (no FX-graph, autograd or kernel cache from an earlier run).
A layer MixerLayer(spec, hidden_size=256, num_heads=4) (d = 64 per head, chunk size 64, its
defaults otherwise) takes x [B=2, T=512, 256] in fp32 on the CPU; torch.compile(layer,
fullgraph=True) with the default (inductor) backend. Measured:

- first call: compiled forward and backward of y.square().mean(), from the call to the end of
  the backward (what a training script waits for before its first step);
- steady state: forward+backward of the compiled and the eager layer, timed in alternation in
  the same process (warm-up calls first), the median of the repeats of each, and their ratio.

Before timing, the compiled layer's output and gradients are compared with the eager layer's
(relative RMS error); the worker stops if they differ by more than 1e-4.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
B, T, HIDDEN, HEADS = 2, 512, 256, 4
WARMUP, REPEATS = 2, 7


def _rel(a, b) -> float:

    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _step(layer, x):
    """One forward+backward; returns the output and the gradients of x and the parameters."""
    x = x.detach().requires_grad_(True)
    for p in layer.parameters():
        p.grad = None
    y, _ = layer(x)
    y.square().mean().backward()
    return y.detach(), [x.grad, *(p.grad for p in layer.parameters() if p.grad is not None)]


def measure(spec: str, threads: int) -> dict:
    """The worker: one spec's first-call time and compiled and eager steady-state times."""
    import torch

    from mixc.nn import MixerLayer

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    layer = MixerLayer(ROOT / "specs" / f"{spec}.mix", hidden_size=HIDDEN, num_heads=HEADS)
    x = torch.randn(B, T, HIDDEN)
    compiled = torch.compile(layer, fullgraph=True)
    start = time.perf_counter()
    y_c, g_c = _step(compiled, x)
    first = time.perf_counter() - start
    y_e, g_e = _step(layer, x)
    error = max([_rel(y_c, y_e)] + [_rel(a, b) for a, b in zip(g_c, g_e, strict=True)])
    if not error <= 1e-4:
        raise SystemExit(f"{spec}: compiled and eager differ by {error:.2e}")
    for _ in range(WARMUP):
        _step(compiled, x), _step(layer, x)
    times = {"compiled": [], "eager": []}
    for _ in range(REPEATS):
        for name, fn in (("compiled", compiled), ("eager", layer)):
            start = time.perf_counter()
            _step(fn, x)
            times[name].append(time.perf_counter() - start)
    compiled_s, eager_s = (statistics.median(times[k]) for k in ("compiled", "eager"))
    return {
        "spec": spec,
        "first_call_s": first,
        "compiled_ms": compiled_s * 1e3,
        "eager_ms": eager_s * 1e3,
        "speedup": eager_s / compiled_s,
        "max_rel_error": error,
    }


def _run_worker(spec: str, threads: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="mixc-inductor-") as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "PYTHONPATH": str(ROOT)}
        out = subprocess.run(
            [sys.executable, __file__, "--worker", spec, "--threads", str(threads)],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    if out.returncode != 0:
        return {"spec": spec, "error": (out.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


START, END = "<!-- compile: written by benchmarks/compile.py -->", "<!-- compile: end -->"


def _table(rows: list[dict], threads: int) -> str:
    import torch

    lines = [
        f"- Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs visible, "
        f"{threads} torch threads, torch {torch.__version__}, Python {platform.python_version()}; "
        f"load average at the end {os.getloadavg()[0]:.1f} (a shared machine)",
        f"- Layer: MixerLayer(spec, hidden_size={HIDDEN}, num_heads={HEADS}), x [{B}, {T}, "
        f"{HIDDEN}] fp32, torch.compile(fullgraph=True), inductor; median of {REPEATS} "
        "forward+backward calls each, compiled and eager in alternation",
        "",
        "| spec | first call (compile + fwd + bwd) | compiled fwd+bwd | eager fwd+bwd | "
        "eager / compiled |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['spec']} | failed: {r['error']} | | | |")
            continue
        lines.append(
            f"| {r['spec']} | {r['first_call_s']:.1f} s | {r['compiled_ms']:.1f} ms | "
            f"{r['eager_ms']:.1f} ms | {r['speedup']:.2f}x |"
        )
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
            "backward from an empty inductor cache, and the compiled against the eager layer "
            "(see the script's docstring).",
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
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(measure(args.specs[0], args.threads)))
        return
    if args.from_json:
        text = Path(args.from_json).read_text(encoding="utf-8").strip()
        rows = (
            json.loads(text) if text.startswith("[") else [json.loads(x) for x in text.splitlines()]
        )
    else:
        rows = []
        for spec in args.specs or sorted(p.stem for p in (ROOT / "specs").glob("*.mix")):
            rows.append(_run_worker(spec, args.threads))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    table = _table(rows, args.threads)
    print(table)
    if args.write:
        write(table)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
