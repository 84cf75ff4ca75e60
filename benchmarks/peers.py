"""mixc against the field's pure-PyTorch references, and mixc's own performance targets.

Writes benchmarks/RESULTS.md (tables, the machine, the command, the date, whether each target
holds) and benchmarks/bench.png. Run it through benchmarks/run.sh.

The peers are flash-linear-attention's reference functions (`fla/ops/<mixer>/naive.py` of the
`fla-core` package), loaded by file path so that `fla.ops` (which needs triton) is never
imported. Install them only in the benchmark's environment: `pip install --no-deps fla-core
einops`. mixc itself never imports them.

Protocol: every measurement runs in a fresh worker process (this file with --worker); each
worker imports the same modules (torch, mixc, einops, the fla references) and builds the same
seeded inputs. The two sides of a comparison (mixc and an fla reference; mixc's chunk and
recurrent forms; the chunk form and the bmm reference) are timed in the same worker in
alternation, one call of each in turn after warm-up calls of each, so that both sample the
same phases of a machine whose speed drifts; the whole set of workers is repeated for several
rounds, and the median over every timed call is reported with the quartiles; a figure that fails
`mixc bench`'s self-checks is measured again and, if still suspect, marked unreliable. Outputs
are compared (relative error) before any timing, and
the run stops if they disagree. Every worker runs with glibc's malloc keeping freed memory
(KEEP_MEMORY below), so that page faults decide neither side's speed; a separate section
times one implementation per process with glibc's defaults.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "specs"
B, NH, D = 1, 4, 64
PEER_T = 4096
RECURRENT_T = 8192
MEMORY_T = (8192, 32768)
SWEEP_T = (512, 1024, 2048, 4096, 8192, 16384)
AGREE_TOL = 1e-4  # relative error between the two fp32 outputs (both are ~1e-6 from fp64)

#: Chunk sizes tried for the mixc side: each spec uses the one whose chunk forward is fastest
#: at T = PEER_T in this run (measured first, interleaved), for every measurement that follows.
CHUNK_CANDIDATES = (32, 64)
#: The chosen chunk size per spec, set by the parent and passed to every worker.
CHOSEN: dict[str, int] = {}


@dataclass(frozen=True)
class Pair:
    spec: str  # mixc spec in specs/
    module: str  # fla/ops/<module>/naive.py
    function: str
    head_major: bool  # the reference takes [B, H, T, d] (else [B, T, H, d])
    fla_chunk: int  # the reference's own chunk size (its default)


PAIRS = (
    Pair("linear_attention", "linear_attn", "naive_chunk_linear_attn", False, 64),
    Pair("gated_retention", "simple_gla", "naive_chunk_simple_gla", False, 64),
    Pair("deltanet", "delta_rule", "delta_rule_chunkwise", True, 32),
    Pair("gated_deltanet", "gated_delta_rule", "naive_chunk_gated_delta_rule", False, 64),
)

IMPLS = ("mixc", "fla")

TARGETS = {
    "fwd": 0.5,
    "fwd_bwd": 0.7,
    "recurrent_speedup": 20.0,
    "matmul_fraction": 0.35,
    "memory_ratio": 4.5,
    "compile_s": 0.3,
}


# ----------------------------------------------------------------------------- worker side


def load_fla(module: str, file: str = "naive", root: Path | None = None):
    """fla/ops/<module>/<file>.py by file path (fla.ops itself needs triton), from the fla
    package folder `root`, or the installed one."""
    if root is None:
        spec = importlib.util.find_spec("fla")
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit(
                "flash-linear-attention is not installed in this environment: "
                "pip install --no-deps fla-core einops (see benchmarks/README.md)"
            )
        root = Path(next(iter(spec.submodule_search_locations)))
    path = root / "ops" / module / f"{file}.py"
    loaded = importlib.util.spec_from_file_location(f"fla_{file}_{module}", path)
    mod = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(mod)
    return mod


def _chunk_for(spec_name: str) -> int:
    return CHOSEN[spec_name]


def _peer_inputs(pair: Pair, T: int, dtype):
    """Seeded inputs in the layout [B, T, H, d] (keys unit-norm for the delta rule)."""
    import torch
    from torch.nn import functional

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, T, NH, D, generator=gen, dtype=torch.float64) for _ in range(3))
    if "delta" in pair.module:
        k = functional.normalize(k, dim=-1)
    a = torch.randn(B, T, NH, generator=gen, dtype=torch.float64) + 3.0
    beta = torch.sigmoid(torch.randn(B, T, NH, generator=gen, dtype=torch.float64))
    g = functional.logsigmoid(a)
    return {n: x.to(dtype) for n, x in dict(q=q, k=k, v=v, a=a, g=g, beta=beta).items()}


def _calls(pair: Pair, T: int, dtype, chunk: int):
    """(mixc_fn, mixc_leaves, fla_fn, fla_leaves): fn(*leaves) -> output [B, T, H, V].

    fla scales q by 1/sqrt(d_k) itself; the mixc module computes exactly its spec, so the
    same scaled q is passed to it (inside the timed call, like fla's own multiply).
    """
    import mixc

    x = _peer_inputs(pair, T, dtype)
    module = mixc.load(SPECS / f"{pair.spec}.mix")
    scale = D**-0.5
    ref = load_fla(pair.module)
    fla = getattr(ref, pair.function)
    mixc_inputs = {
        "linear_attention": ("q", "k", "v"),
        "gated_retention": ("q", "k", "v", "a"),
        "deltanet": ("q", "k", "v", "beta"),
        "gated_deltanet": ("q", "k", "v", "g", "beta"),
    }[pair.spec]
    fla_inputs = {
        "linear_attn": ("q", "k", "v"),
        "simple_gla": ("q", "k", "v", "g"),
        "delta_rule": ("q", "k", "v", "beta"),
        "gated_delta_rule": ("q", "k", "v", "g", "beta"),
    }[pair.module]

    def mixc_fn(q, *rest):
        return module.chunk(q * scale, *rest, chunk_size=chunk)[0]

    if pair.head_major:

        def fla_fn(*args):
            return fla(*args)[0].transpose(1, 2)

        fla_leaves = [x[n].transpose(1, 2).contiguous() for n in fla_inputs]
    else:

        def fla_fn(*args):
            out = fla(*args)
            return out[0] if isinstance(out, tuple) else out

        fla_leaves = [x[n] for n in fla_inputs]
    return mixc_fn, [x[n] for n in mixc_inputs], fla_fn, fla_leaves


def _rel(a, b) -> float:
    """The relative error of a against b, in float64 (b of norm 0: against 1e-30)."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def task_agree(args: dict) -> dict:
    """Outputs of mixc (fp32) and the peer (fp32) against mixc in fp64, and each other."""
    import torch

    out = {}
    for pair in PAIRS:
        chunk = _chunk_for(pair.spec)
        m32, x32, f32, y32 = _calls(pair, args["T"], torch.float32, chunk)
        m64, x64, _, _ = _calls(pair, args["T"], torch.float64, chunk)
        with torch.no_grad():
            a, b, ref = m32(*x32), f32(*y32), m64(*x64)
        out[pair.spec] = {
            "mixc_vs_fla": _rel(a, b),
            "mixc_fp32_vs_fp64": _rel(a, ref),
            "fla_fp32_vs_fp64": _rel(b, ref),
            "chunk": chunk,
        }
    return out


def wall_time(call) -> float:
    """Seconds one call takes by the wall clock (time.perf_counter)."""
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def time_alternating(calls: dict, repeats: dict, warmup: int = 2, measure=wall_time) -> dict:
    """Times (seconds) of several calls measured in alternation: after `warmup` untimed calls
    of each, rounds of repeats[name] timed calls of each in turn, so that every call samples
    the same phases of a machine whose speed drifts (a ratio of two of them is then not
    decided by when each was measured). measure(call) times one call (the wall clock; a CPU
    clock or CUDA events elsewhere)."""
    for call in calls.values():
        for _ in range(warmup):
            call()
    times = {name: [] for name in calls}
    rounds = max(repeats.values())
    for r in range(rounds):
        for name, call in calls.items():
            # spread a call's repeats evenly over the rounds
            for _ in range(repeats[name] * (r + 1) // rounds - repeats[name] * r // rounds):
                times[name].append(measure(call))
    return times


def chunk_vs_recurrent(module, inputs, title: str, argv=None) -> None:
    """A spec's chunk forward against its recurrent form at --T (default 8192), in this process
    with --threads, under no_grad: a warm-up call of each at T = 256, then --repeats timed calls
    of each in alternation; prints the medians and their ratio. `inputs(T)`: the forms' inputs."""
    import torch

    parser = argparse.ArgumentParser(description=title)
    parser.add_argument("--T", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    x = inputs(args.T)
    calls = {"chunk": lambda: module.chunk(*x), "recurrent": lambda: module.recurrent(*x)}
    with torch.no_grad():
        module.chunk(*inputs(256)), module.recurrent(*inputs(256))
        times = time_alternating(calls, dict.fromkeys(calls, args.repeats), warmup=0)
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"{title} forward, T={args.T}, B=1, NH=4, d=64, fp32, {args.threads} threads")
    for name, t in times.items():
        shown = ", ".join(f"{s * 1e3:.0f}" for s in t)
        print(f"  {name}: median {med[name] * 1e3:.1f} ms (of {shown})")
    print(f"  chunk is {med['recurrent'] / med['chunk']:.1f}x faster than recurrent")


def task_time(args: dict) -> dict:
    """Times (seconds) of the implementations args["impls"] ("mixc", "fla") of one pair,
    forward or forward + backward; two are timed in alternation (see time_alternating)."""
    import torch

    pair = next(p for p in PAIRS if p.spec == args["spec"])
    chunk = _chunk_for(pair.spec)
    mixc_fn, mixc_leaves, fla_fn, fla_leaves = _calls(pair, args["T"], torch.float32, chunk)
    impls = {"mixc": (mixc_fn, mixc_leaves), "fla": (fla_fn, fla_leaves)}
    calls = {}
    for impl in args["impls"]:
        fn, leaves = impls[impl]
        if args["backward"]:
            leaves = [x.clone().requires_grad_(True) for x in leaves]
            with torch.no_grad():
                shape = fn(*leaves).shape
            cot = torch.randn(shape, generator=torch.Generator().manual_seed(1))

            def call(fn=fn, leaves=leaves, cot=cot):
                for x in leaves:
                    x.grad = None
                fn(*leaves).backward(cot)

        else:

            def call(fn=fn, leaves=leaves):
                with torch.no_grad():
                    fn(*leaves)

        calls[impl] = call
    times = time_alternating(calls, {impl: args["repeats"] for impl in calls}, args["warmup"])
    return {"times": times, "chunk": chunk}


def _spec_args(name: str, T: int):
    import mixc
    from mixc.tools.bench import default_sizes, make_inputs

    spec = mixc.load_spec(SPECS / f"{name}.mix")
    sizes = default_sizes(spec, {"B": B, "NH": NH})
    return spec, sizes, make_inputs(spec, sizes, T)


def task_recurrent(args: dict) -> dict:
    """mixc chunk vs mixc recurrent, forward, at one T."""
    import torch

    import mixc

    name, T = args["spec"], args["T"]
    module = mixc.load(SPECS / f"{name}.mix")
    _, _, inputs = _spec_args(name, T)
    chunk = _chunk_for(name)

    def run(fn):
        def call():
            with torch.no_grad():
                fn(*inputs)

        return call

    calls = {
        "chunk": run(lambda *a: module.chunk(*a, chunk_size=chunk)),
        "recurrent": run(module.recurrent),
    }
    repeats = {"chunk": args["repeats"], "recurrent": args["recurrent_repeats"]}
    times = time_alternating(calls, repeats, warmup=1)
    return {**times, "C": chunk}


def task_efficiency(args: dict) -> dict:
    """Chunk forward GFLOP/s (cost model) next to fp32 bmm throughput at its shapes, timed in
    alternation (one chunk call, then one bmm of each shape, in turn)."""
    import torch

    import mixc
    from mixc.analysis.cost import costs
    from mixc.tools.bench import chunk_shapes, matmul_calls, matmul_summary

    name, T = args["spec"], args["T"]
    module = mixc.load(SPECS / f"{name}.mix")
    spec, sizes, inputs = _spec_args(name, T)
    facts = mixc.analyze(spec)
    chunk = _chunk_for(name)

    def call():
        with torch.no_grad():
            module.chunk(*inputs, chunk_size=chunk)

    c = costs(facts)
    values = {k: v for k, v in sizes.items() if k not in ("B", "NH")} | {c.chunk: chunk, c.seq: T}
    flops = c.chunked.flops.value(values) * B * NH * T
    d_k, d_v = chunk_shapes(facts, sizes)
    batch = B * NH * -(-T // chunk)
    shapes = matmul_calls(batch, chunk, d_k, d_v)
    calls = {"chunk": call} | {name: bmm for name, (_, bmm) in shapes.items()}
    times = time_alternating(calls, {n: args["repeats"] for n in calls})
    seconds = {name: statistics.median(times[name]) for name in shapes}
    ref = matmul_summary(shapes, seconds, batch, chunk, d_k, d_v)
    return {"times": times["chunk"], "flops": flops, "matmul": ref, "C": chunk}


def task_memory(args: dict) -> dict:
    """Peak tensor memory of one chunk forward, at each T."""
    import torch

    import mixc
    from mixc.tools.bench import measure_peak_memory

    name = args["spec"]
    module = mixc.load(SPECS / f"{name}.mix")
    chunk = _chunk_for(name)
    out = {}
    for T in args["T"]:
        _, _, inputs = _spec_args(name, T)

        def call(inputs=inputs):
            with torch.no_grad():
                module.chunk(*inputs, chunk_size=chunk)

        call()
        out[str(T)] = measure_peak_memory(call)
        del inputs
    return {"peak": out, "C": chunk}


def task_compile(args: dict) -> dict:
    """`mixc compile` in-process: parse to written file, after `import torch` (not counted)."""
    import torch  # noqa: F401 - imported first on purpose: not part of the compiler's time

    start = time.perf_counter()
    from mixc.driver import compile_source, write_atomically

    imported = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "out.py"
        t0 = time.perf_counter()
        write_atomically(target, compile_source(str(SPECS / f"{args['spec']}.mix")))
        cold = time.perf_counter() - t0
        warm = []
        for _ in range(5):
            t0 = time.perf_counter()
            write_atomically(target, compile_source(str(SPECS / f"{args['spec']}.mix")))
            warm.append(time.perf_counter() - t0)
    return {"import_s": imported - start, "cold_s": cold, "warm_s": statistics.median(warm)}


def task_tune(args: dict) -> dict:
    """Chunk forward times (seconds) of one spec at each candidate chunk size, interleaved."""
    import torch

    import mixc
    from mixc.tools.bench import time_call

    name, T = args["spec"], args["T"]
    module = mixc.load(SPECS / f"{name}.mix")
    _, _, inputs = _spec_args(name, T)
    times: dict[str, list[float]] = {str(c): [] for c in CHUNK_CANDIDATES}
    for _ in range(args["rounds"]):
        for c in CHUNK_CANDIDATES:

            def call(c=c):
                with torch.no_grad():
                    module.chunk(*inputs, chunk_size=c)

            times[str(c)] += time_call(call, args["repeats"], warmup=2)
    return times


def task_sweep(args: dict) -> dict:
    """mixc bench's sweep (chunk fwd and fwd+bwd, recurrent fwd) for the plot."""
    from mixc.tools import bench

    chunk = _chunk_for(args["spec"])
    result = bench.run(
        str(SPECS / f"{args['spec']}.mix"),
        sizes={"B": B, "NH": NH},
        T=args["T"],
        chunk_size=chunk,
        forms=("chunk", "recurrent"),
        backward=True,
        repeats=args["repeats"],
        threads=None,
        recurrent_max_T=args["recurrent_max_T"],
        progress=False,
    )
    return result.to_json()


TASKS = {
    "tune": task_tune,
    "agree": task_agree,
    "time": task_time,
    "recurrent": task_recurrent,
    "efficiency": task_efficiency,
    "memory": task_memory,
    "compile": task_compile,
    "sweep": task_sweep,
}


def worker(payload: str) -> None:
    args = json.loads(payload)
    CHOSEN.update(args.get("chunks", {}))
    if args.get("threads"):
        import torch

        torch.set_num_threads(args["threads"])
    result = TASKS[args["task"]](args)
    print("RESULT " + json.dumps(result))


# ----------------------------------------------------------------------------- parent side


LOADS: list[float] = []  # share of the CPUs busy (with other work) before each worker
MAX_BUSY: float | None = None


def cpu_busy(interval: float = 2.0) -> float:
    """Share of all CPUs busy over `interval` seconds (from /proc/stat; this process idles)."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        return sum(fields), fields[3] + fields[4]  # total, idle + iowait

    try:
        total0, idle0 = sample()
        time.sleep(interval)
        total1, idle1 = sample()
    except OSError:
        return float("nan")
    return 1.0 - (idle1 - idle0) / max(total1 - total0, 1)


def wait_for_quiet(limit: float | None, patience_s: float = 900.0) -> float:
    """Wait (at most patience_s) until other work uses less than `limit` of the CPUs."""
    busy = cpu_busy()
    start = time.monotonic()
    while limit is not None and busy > limit and time.monotonic() - start < patience_s:
        busy = cpu_busy()
    return busy


#: glibc malloc settings that keep freed memory in the process instead of returning large
#: blocks to the OS (which costs a page fault per 4 KiB page when they are used again). Every
#: worker runs with them (mixc, fla and the recurrent form alike) unless `malloc="default"`:
#: with glibc's defaults whether a process pays the faults is decided by its allocation
#: history, so the same call runs 1.0x or 1.7x from one fresh process to the next.
KEEP_MEMORY = {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "17179869184"}


def run_worker(task: str, threads: int, malloc: str = "keep", **args) -> dict:
    LOADS.append(wait_for_quiet(MAX_BUSY))
    payload = json.dumps({"task": task, "threads": threads, "chunks": CHOSEN, **args})
    env = {k: v for k, v in os.environ.items() if k not in KEEP_MEMORY}
    env.update(OMP_NUM_THREADS=str(threads), PYTHONPATH=str(ROOT))
    if malloc == "keep":
        env.update(KEEP_MEMORY)
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", payload],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"worker {task} {args} failed (exit {proc.returncode})")
    return json.loads(lines[-1][len("RESULT ") :])


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _stats(times: list[float]) -> dict:
    q = statistics.quantiles(times, n=4, method="inclusive") if len(times) > 1 else [times[0]] * 3
    return {"median": statistics.median(times), "q1": q[0], "q3": q[2], "n": len(times)}


def chunkable_specs() -> list[str]:
    import mixc

    names = []
    for path in sorted(SPECS.glob("*.mix")):
        if mixc.analyze(mixc.load_spec(path)).chunkable:
            names.append(path.stem)
    return names


def measure(args) -> dict:
    threads = args.threads
    data: dict = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "load_start": os.getloadavg(),
        "machine": machine_text(threads),
        "args": {
            "threads": threads,
            "repeats": args.repeats,
            "rounds": args.rounds,
            "sweep_T": args.sweep_T,
        },
    }
    data["tune"] = {}
    for name in chunkable_specs():
        log(f"{name}: chunk size ({', '.join(map(str, CHUNK_CANDIDATES))}) at T = {PEER_T}")
        r = run_worker("tune", threads, spec=name, T=PEER_T, repeats=5, rounds=3)
        data["tune"][name] = {c: _stats(t) for c, t in r.items()}
        CHOSEN[name] = int(min(r, key=lambda c: statistics.median(r[c])))
    data["chunk"] = dict(CHOSEN)
    log("checking that mixc and the fla references agree ...")
    data["agree"] = run_worker("agree", threads, T=PEER_T)
    for name, r in data["agree"].items():
        if not r["mixc_vs_fla"] <= AGREE_TOL:
            raise SystemExit(
                f"{name}: mixc and fla disagree: relative error {r['mixc_vs_fla']:.2e}"
            )
    times = {(p.spec, impl, bwd): [] for p in PAIRS for bwd in (False, True) for impl in IMPLS}
    for rnd in range(args.rounds):
        for pair in PAIRS:
            for bwd in (False, True):
                log(f"round {rnd + 1}/{args.rounds}: {pair.spec} {'fwd+bwd' if bwd else 'fwd'}")
                repeats = args.repeats if not bwd else max(3, args.repeats // 2)
                r = run_worker(
                    "time",
                    threads,
                    spec=pair.spec,
                    impls=IMPLS,
                    backward=bwd,
                    T=PEER_T,
                    repeats=repeats,
                    warmup=2,
                )
                for impl in IMPLS:
                    times[(pair.spec, impl, bwd)].extend(r["times"][impl])
    data["peers"] = {
        f"{spec}|{impl}|{int(bwd)}": {"times": t, **_stats(t)}
        for (spec, impl, bwd), t in times.items()
    }
    specs = chunkable_specs()
    data["recurrent"] = {}
    data["efficiency"] = {}
    data["memory"] = {}
    rounds = max(1, args.rounds - 1)
    for rnd in range(rounds):
        for name in specs:
            log(f"round {rnd + 1}/{rounds}: {name}: chunk vs recurrent at T = {RECURRENT_T}")
            r = run_worker(
                "recurrent",
                threads,
                spec=name,
                T=RECURRENT_T,
                repeats=args.repeats,
                recurrent_repeats=2,
            )
            if rnd:
                for key in ("chunk", "recurrent"):
                    data["recurrent"][name][key] += r[key]
            else:
                data["recurrent"][name] = r
            log(
                f"round {rnd + 1}/{rounds}: {name}: chunk forward vs matmul throughput at T = {PEER_T}"
            )
            r = run_worker("efficiency", threads, spec=name, T=PEER_T, repeats=args.repeats)
            if rnd:
                e = data["efficiency"][name]
                e["times"] += r["times"]
                for shape, v in r["matmul"]["shapes"].items():
                    e["matmul"]["shapes"][shape]["seconds_all"].append(v["seconds"])
            else:
                for v in r["matmul"]["shapes"].values():
                    v["seconds_all"] = [v["seconds"]]
                data["efficiency"][name] = r
    for e in data["efficiency"].values():
        # the bmm reference over all rounds: median time per shape
        flops = time_sum = 0.0
        for v in e["matmul"]["shapes"].values():
            v["seconds"] = statistics.median(v["seconds_all"])
            shape_flops = v["gflops"] * v["seconds_all"][0]  # GFLOP of the shape (fixed)
            v["gflops"] = shape_flops / v["seconds"]
            flops += shape_flops
            time_sum += v["seconds"]
        e["matmul"]["gflops"] = flops / time_sum
    for name in specs:
        log(f"{name}: peak memory at T = {', '.join(map(str, MEMORY_T))}")
        data["memory"][name] = run_worker("memory", threads, spec=name, T=list(MEMORY_T))
    data["compile"] = {}
    for path in sorted(SPECS.glob("*.mix")):
        log(f"{path.stem}: compile time")
        data["compile"][path.stem] = run_worker("compile", threads, spec=path.stem)
    data["allocator"] = {}
    for label in ("default", "keep"):
        log(f"allocator sensitivity ({label})")
        rows = {}
        for pair in PAIRS:
            for impl in ("mixc", "fla"):
                r = run_worker(
                    "time",
                    threads,
                    malloc=label,
                    spec=pair.spec,
                    impls=[impl],
                    backward=False,
                    T=PEER_T,
                    repeats=args.repeats,
                    warmup=2,
                )
                rows[f"{pair.spec}|{impl}"] = statistics.median(r["times"][impl])
        r = run_worker(
            "recurrent",
            threads,
            malloc=label,
            spec="linear_attention",
            T=RECURRENT_T,
            repeats=args.repeats,
            recurrent_repeats=2,
        )
        rows["linear_attention|chunk8192"] = statistics.median(r["chunk"])
        rows["linear_attention|recurrent8192"] = statistics.median(r["recurrent"])
        data["allocator"][label] = rows
    data["sweep"] = {}
    for pair in PAIRS:
        log(f"{pair.spec}: sweep over T for the plot")
        data["sweep"][pair.spec] = run_worker(
            "sweep", threads, spec=pair.spec, T=list(args.sweep_T), repeats=3, recurrent_max_T=2048
        )
    remeasure(data, args)
    data["load_end"] = os.getloadavg()
    data["loads"] = LOADS
    return data


def self_check(data: dict) -> dict[str, str]:
    """`mixc bench`'s rules on the recorded figures, by figure: repeats that spread beyond
    SPREAD_BOUND of their median, or a chunked form above 100% of the matmul reference."""
    from mixc.tools.bench import SPREAD_BOUND, spread_of

    out: dict[str, str] = {}

    def spread(key: str, times: list[float]) -> None:
        wide = spread_of(times)
        if len(times) >= 3 and wide > SPREAD_BOUND:
            out[key] = f"repeats spread {100 * wide:.0f}% of the median (bound {SPREAD_BOUND:.0%})"

    for key, e in data["peers"].items():
        spread(f"peers|{key}", e["times"])
    for name, r in data["recurrent"].items():
        for form in ("chunk", "recurrent"):
            spread(f"recurrent|{name}|{form}", r[form])
    for name, r in data["efficiency"].items():
        spread(f"efficiency|{name}", r["times"])
        frac = r["flops"] / statistics.median(r["times"]) / 1e9 / r["matmul"]["gflops"]
        if frac > 1:
            reason = f"{100 * frac:.0f}% of the matmul reference, above the measured peak"
            out[f"efficiency|{name}"] = "; ".join(
                filter(None, [out.get(f"efficiency|{name}"), reason])
            )
    return out


def remeasure(data: dict, args) -> None:
    """Measure every suspect figure again, in a fresh worker with REMEASURE_FACTOR times the
    repeats, and record in data["unreliable"] what is still suspect (with the reason)."""
    from mixc.tools.bench import REMEASURE_FACTOR

    again = REMEASURE_FACTOR * args.repeats
    done = set()
    for key in self_check(data):
        kind, name, *rest = key.split("|")
        # one worker per figure: a peer pair per pass, a spec's chunk and recurrent together
        figure = (kind, name, tuple(rest[-1:]) if kind == "peers" else ())
        if figure in done:
            continue
        done.add(figure)
        log(f"{key}: suspect, measuring it again")
        if kind == "peers":
            bwd = bool(int(rest[-1]))
            r = run_worker(
                "time",
                args.threads,
                spec=name,
                impls=IMPLS,
                backward=bwd,
                T=PEER_T,
                repeats=again,
                warmup=2,
            )
            for impl in IMPLS:
                t = r["times"][impl]
                data["peers"][f"{name}|{impl}|{int(bwd)}"] = {"times": t, **_stats(t)}
        elif kind == "recurrent":
            data["recurrent"][name] = run_worker(
                "recurrent",
                args.threads,
                spec=name,
                T=RECURRENT_T,
                repeats=again,
                recurrent_repeats=REMEASURE_FACTOR * 2,
            )
        else:
            r = run_worker("efficiency", args.threads, spec=name, T=PEER_T, repeats=again)
            data["efficiency"][name] = r
    data["remeasured"] = sorted("|".join([k, n, *x]) for k, n, x in done)
    data["unreliable"] = self_check(data)


# ----------------------------------------------------------------------------- report


def reasons(data: dict, missed: set[str]) -> list[str]:
    """Why each missed family of targets is missed, with this run's numbers."""
    eff = {}
    for name, r in data["efficiency"].items():
        t = statistics.median(r["times"])
        eff[name] = (r["flops"] / t / 1e9) / r["matmul"]["gflops"]
    lo, hi = 100 * min(eff.values()), 100 * max(eff.values())
    out = []
    if "peer" in missed:
        out.append(
            "mixc against fla: at B*NH = 4 one call is small (0.4 to 0.75 GFLOP). Counting its "
            f"matmul work at this machine's bmm rate, the chunked form spends only {lo:.0f} to "
            f"{hi:.0f}% of its time on it; the rest is eager PyTorch's cost per operation "
            "(dispatch, and a fork/join of the two threads for each of the 300 to 1000 operations "
            "of a call) and memory passes (copies into and out of the chunk layout, decay "
            "masks, q and k scaled by their decays). The delta rule's state passing is two small "
            "matmuls per "
            "chunk ([B*NH, C, d] x [d, d]), sequential and too small to use both cores well. "
            "fla's references for the gated and delta mixers loop over chunks in Python with a "
            "few small operations per chunk whose operands stay in cache, and the one for linear "
            "attention batches all chunks as mixc does; their large temporaries cost them page "
            "faults only with glibc's default malloc (this run removes those for both sides; the "
            "section on the allocator has both). Measured and not kept: torch.compile of the "
            "generated module (inductor) gave linear attention's chunk forward 1.02x its eager "
            "time and DeltaNet's 1.2x, after 10 and 78 s of compiling."
        )
    if "recurrent" in missed:
        need = []
        for name, r in data["recurrent"].items():
            rec = statistics.median(r["recurrent"])
            e = data["efficiency"][name]
            flops = 2 * e["flops"]  # T = 8192 is twice the T = 4096 work
            need.append(flops / (rec / TARGETS["recurrent_speedup"]) / 1e9 / e["matmul"]["gflops"])
        step = [
            statistics.median(r["recurrent"]) / RECURRENT_T * 1e6
            for r in data["recurrent"].values()
        ]
        out.append(
            "chunk against recurrent: the recurrent form is one fused expression per token "
            f"({min(step):.0f} to {max(step):.0f} us per step here), so 20x at T={RECURRENT_T} "
            f"asks the chunked form to run at {100 * min(need):.0f} to {100 * max(need):.0f}% of "
            f"this machine's bmm throughput; it runs at {lo:.0f} to {hi:.0f}% (at T={PEER_T})."
        )
        if "allocator" in data:
            d, k = data["allocator"]["default"], data["allocator"]["keep"]
            c, r = "linear_attention|chunk8192", "linear_attention|recurrent8192"
            out[-1] += (
                f" With glibc's default malloc (page faults on fresh memory in some processes), "
                f"linear_attention's chunk at T={RECURRENT_T} took {_ms(d[c])} ms instead of "
                f"{_ms(k[c])} ms, {d[r] / d[c]:.0f}x faster than recurrent instead of "
                f"{k[r] / k[c]:.0f}x (section on the allocator)."
            )
    if "matmul" in missed:
        out.append(
            "share of the matmul throughput: the cost model counts the chunked form's matmul "
            "work; with gates much of the time goes to elementwise work (decay masks, q and k "
            "scaled by their decays, the per-chunk state steps) and to the cost per operation, "
            "which the count leaves out. GLA's per-channel decays are the most elementwise."
        )
    if "memory" in missed:
        out.append("peak memory: grows faster than T (see the memory table).")
    if "compile" in missed:
        out.append("compile time: see the compile table.")
    return out


def _figure(x: float, bound: float, digits: int) -> str:
    """x to `digits` decimals, or more where fewer would round it onto the bound it is held
    against (19.97 against 20 is "19.97", not "20")."""
    while digits < 4 and x != bound and f"{x:.{digits}f}" == f"{bound:.{digits}f}":
        digits += 1
    return f"{x:.{digits}f}"


def _ms(s: float) -> str:
    return f"{s * 1e3:.1f}" if s < 10 else f"{s * 1e3:.0f}"


def _mark(ok: bool) -> str:
    return "yes" if ok else "**no**"


def machine_text(threads: int) -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        flags = next(
            (
                line
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("flags")
            ),
            "",
        )
    except OSError:
        flags = ""
    simd = ", ".join(f for f in ("avx2", "avx512f", "fma") if f" {f}" in flags) or "?"
    return (
        f"{cpu} ({os.cpu_count()} cores visible, SIMD: {simd}), {threads} torch threads, "
        f"torch {torch.__version__}, Python {platform.python_version()}, {platform.system()} "
        f"{platform.release()}"
    )


def report(data: dict) -> str:
    from mixc import __version__

    args = argparse.Namespace(**data["args"])
    threads = args.threads
    lines: list[str] = []
    add = lines.append
    peers = data["peers"]
    targets: list[tuple[str, str, str, bool]] = []  # (family, what, measured, holds)
    unreliable = data["unreliable"] if "unreliable" in data else self_check(data)

    def marks(**keys: str) -> str:
        """' (unreliable: ...)' after a figure whose parts (label=key) failed the self-check."""
        reasons = [f"{label}: {unreliable[k]}" for label, k in keys.items() if k in unreliable]
        return f" (unreliable: {'; '.join(reasons)})" if reasons else ""

    def med(spec, impl, bwd):
        return peers[f"{spec}|{impl}|{int(bwd)}"]

    for pair in PAIRS:
        for bwd, key in ((False, "fwd"), (True, "fwd_bwd")):
            ratio = med(pair.spec, "mixc", bwd)["median"] / med(pair.spec, "fla", bwd)["median"]
            what = "forward" if not bwd else "forward+backward"
            targets.append(
                (
                    "peer",
                    f"{pair.spec} chunk {what} <= {TARGETS[key]}x `{pair.function}` (T={PEER_T})",
                    f"{_figure(ratio, TARGETS[key], 2)}x"
                    + marks(**{impl: f"peers|{pair.spec}|{impl}|{int(bwd)}" for impl in IMPLS}),
                    ratio <= TARGETS[key],
                )
            )
    for name, r in data["recurrent"].items():
        speed = statistics.median(r["recurrent"]) / statistics.median(r["chunk"])
        targets.append(
            (
                "recurrent",
                f"{name} chunk >= {TARGETS['recurrent_speedup']:.0f}x faster than recurrent "
                f"(T={RECURRENT_T}, fwd)",
                f"{_figure(speed, TARGETS['recurrent_speedup'], 0)}x"
                + marks(chunk=f"recurrent|{name}|chunk", recurrent=f"recurrent|{name}|recurrent"),
                speed >= TARGETS["recurrent_speedup"],
            )
        )
    for name, r in data["efficiency"].items():
        gflops = r["flops"] / statistics.median(r["times"]) / 1e9
        frac = gflops / r["matmul"]["gflops"]
        targets.append(
            (
                "matmul",
                f"{name} chunk fwd >= 35% of fp32 matmul throughput (T={PEER_T})",
                f"{100 * frac:.0f}% ({gflops:.0f} of {r['matmul']['gflops']:.0f} GFLOP/s)"
                + marks(chunk=f"efficiency|{name}"),
                frac >= TARGETS["matmul_fraction"],
            )
        )
    for name, r in data["memory"].items():
        lo, hi = (r["peak"][str(t)] for t in MEMORY_T)
        ratio = hi / lo
        targets.append(
            (
                "memory",
                f"{name} chunk fwd peak memory T={MEMORY_T[1]} <= 4.5x T={MEMORY_T[0]}",
                f"{ratio:.2f}x ({lo / 2**20:.0f} -> {hi / 2**20:.0f} MiB)",
                ratio <= TARGETS["memory_ratio"],
            )
        )
    worst = max(data["compile"].items(), key=lambda kv: kv[1]["cold_s"])
    targets.append(
        (
            "compile",
            "`mixc compile` of every shipped spec < 0.3 s of compiler time",
            f"slowest {worst[0]}: {worst[1]['cold_s']:.3f} s",
            all(r["cold_s"] < TARGETS["compile_s"] for r in data["compile"].values()),
        )
    )

    held = sum(ok for *_, ok in targets)
    add("# mixc benchmark results")
    add("")
    add("Regenerate with one command (about 10 minutes on 2 quiet cores):")
    add("")
    add("```sh")
    add(
        f"benchmarks/run.sh    # = python benchmarks/peers.py --threads {threads} --rounds {args.rounds}"
    )
    add("```")
    add("")
    add(f"- Date: {data.get('date', '?')} (measured), mixc {__version__}")
    machine = data.get("machine") or (
        f"{machine_text(threads)} (not recorded with the results: the machine writing the report)"
    )
    add(f"- Machine: {machine}")
    la0, la1 = data["load_start"], data["load_end"]
    add(
        f"- Load average (1/5/15 min) at start {la0[0]:.1f}/{la0[1]:.1f}/{la0[2]:.1f}, at end "
        f"{la1[0]:.1f}/{la1[1]:.1f}/{la1[2]:.1f}; CPUs busy with other work just before each "
        f"worker: median {100 * statistics.median(data['loads']):.0f}%, max "
        f"{100 * max(data['loads']):.0f}% (a shared machine: other jobs add noise)"
    )
    add(
        f"- Sizes: B={B}, NH={NH}, d_k=d_v={D}, fp32, CPU. mixc chunk size per spec: the faster "
        f"of {' and '.join(map(str, CHUNK_CANDIDATES))} for its chunk forward at T={PEER_T}, "
        "measured at the start of this run (3 interleaved rounds of 5 calls; medians in ms: "
        + "; ".join(
            f"{name} "
            + ", ".join(f"C={c} {1e3 * st['median']:.1f}" for c, st in data["tune"][name].items())
            + f" -> {data['chunk'][name]}"
            for name in data["tune"]
        )
        + "), used for every measurement of that spec below. The fla references use their own "
        "defaults: 64, 32 for `delta_rule_chunkwise`."
    )
    add(
        f"- Protocol: every measurement in a fresh worker process with the same imports and "
        f"seeded inputs; mixc and fla (and mixc's chunk and recurrent forms, and the chunk form "
        f"and the bmm reference) are timed in the "
        f"same worker in alternation, so that both sample the same phases of the machine: 2 "
        f"warm-up calls of each, then {args.repeats} timed calls of each forward "
        f"({max(3, args.repeats // 2)} forward+backward), one of each in turn; {args.rounds} "
        "rounds of workers; median over all timed calls, quartiles in brackets. Forward runs under `torch.no_grad()`; "
        "forward+backward back-propagates a fixed random cotangent to every input. Every "
        "worker, mixc, fla and recurrent alike, runs with glibc's malloc keeping freed memory "
        "(as jemalloc or tcmalloc do; see the section on the allocator for why and for the "
        "default-malloc numbers)."
    )
    again = ", ".join(f"`{k}`" for k in data.get("remeasured", [])) or "none"
    suspect = ", ".join(f"`{k}`" for k in unreliable) or "none"
    if "remeasured" in data:
        status = f"measured again in this run: {again}; still unreliable: {suspect}"
    else:
        status = f"these results predate the re-measuring; suspect, not measured again: {suspect}"
    add(
        "- Self-checks (the rules of `mixc bench`): a figure whose repeats spread beyond 25% of "
        "their median, or a chunked form above 100% of the matmul reference, is measured again "
        "in a fresh worker with 3x the repeats, and what is still suspect is marked unreliable "
        f"below; {status}."
    )
    add("")
    add(f"## Targets: {held} of {len(targets)} hold")
    add("")
    add("| target | measured | holds |")
    add("| --- | --- | --- |")
    for _, what, value, ok in targets:
        add(f"| {what} | {value} | {_mark(ok)} |")
    add("")
    missed = {family for family, *_, ok in targets if not ok}
    if missed:
        add("Why the missed targets are missed:")
        add("")
        for why in reasons(data, missed):
            add(f"- {why}")
        add("")

    add(f"## mixc vs flash-linear-attention references (T={PEER_T})")
    add("")
    add(
        "Same inputs, same function: fla scales q by 1/sqrt(d_k) itself, so mixc gets the same "
        "scaled q (the multiply is inside mixc's timed call too). Agreement is the relative "
        "error ||a - b|| / ||b|| of the two fp32 outputs; both are also compared with mixc in "
        "fp64."
    )
    add("")
    add(
        "| mixc spec | fla reference | mixc C | rel. error mixc vs fla (each vs fp64) | forward mixc ms | "
        "forward fla ms | ratio | fwd+bwd mixc ms | fwd+bwd fla ms | ratio |"
    )
    add("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for pair in PAIRS:
        agree = data["agree"][pair.spec]
        cells = []
        for bwd in (False, True):
            m, f = med(pair.spec, "mixc", bwd), med(pair.spec, "fla", bwd)
            cells += [
                f"{_ms(m['median'])} [{_ms(m['q1'])}-{_ms(m['q3'])}]",
                f"{_ms(f['median'])} [{_ms(f['q1'])}-{_ms(f['q3'])}]",
                f"**{m['median'] / f['median']:.2f}**",
            ]
        add(
            f"| {pair.spec} | `{pair.function}` (C={pair.fla_chunk}) | {agree['chunk']} | "
            f"{agree['mixc_vs_fla']:.1e} ({agree['mixc_fp32_vs_fp64']:.1e}, {agree['fla_fp32_vs_fp64']:.1e}) | "
            + " | ".join(cells)
            + " |"
        )
    add("")

    add(f"## chunk vs recurrent (mixc, forward, T={RECURRENT_T})")
    add("")
    add("| spec | C | chunk ms | recurrent ms | speed-up |")
    add("| --- | --- | --- | --- | --- |")
    for name, r in data["recurrent"].items():
        c, rec = statistics.median(r["chunk"]), statistics.median(r["recurrent"])
        speed = _figure(rec / c, TARGETS["recurrent_speedup"], 0)
        add(f"| {name} | {r['C']} | {_ms(c)} | {_ms(rec)} | {speed}x |")
    add("")

    add(f"## chunk forward vs the machine's matmul throughput (T={PEER_T})")
    add("")
    add(
        "FLOPs from the analysis' cost model (`mixc.analysis.costs`, a multiply-add = 2 FLOPs, "
        "the masked half of each C x C product counted as work). The reference is fp32 "
        "`torch.bmm` on the same machine in the same worker, at the shapes the chunked form "
        "multiplies, for all B*NH*T/C chunks: Q K^T (C x d_k x C), P V (C x C x d_v), Q S "
        "(C x d_k x d_v) and K^T V (d_k x C x d_v); its GFLOP/s is their total FLOPs over their "
        "total time."
    )
    add("")
    add(
        "| spec | C | chunk fwd ms | GFLOP/call | GFLOP/s | bmm GFLOP/s (QK^T, PV, QS, K^T V) | % of bmm |"
    )
    add("| --- | --- | --- | --- | --- | --- | --- |")
    for name, r in data["efficiency"].items():
        t = statistics.median(r["times"])
        gflops = r["flops"] / t / 1e9
        shapes = ", ".join(f"{v['gflops']:.0f}" for v in r["matmul"]["shapes"].values())
        add(
            f"| {name} | {r['C']} | {_ms(t)} | {r['flops'] / 1e9:.2f} | {gflops:.1f} | "
            f"{r['matmul']['gflops']:.0f} ({shapes}) | {100 * gflops / r['matmul']['gflops']:.0f}% |"
        )
    add("")

    add("## Peak memory, chunk forward")
    add("")
    add(
        "Peak tensor memory held during one call beyond its inputs (output included), from "
        "torch's own allocator records (`torch.profiler`, `profile_memory=True`): exact for "
        "tensors, blind to the Python heap and to memory the C library keeps after a free."
    )
    add("")
    add(f"| spec | C | T={MEMORY_T[0]} MiB | T={MEMORY_T[1]} MiB | ratio (4x tokens) |")
    add("| --- | --- | --- | --- | --- |")
    for name, r in data["memory"].items():
        lo, hi = (r["peak"][str(t)] for t in MEMORY_T)
        add(f"| {name} | {r['C']} | {lo / 2**20:.1f} | {hi / 2**20:.1f} | {hi / lo:.2f}x |")
    add("")

    add("## `mixc compile` time")
    add("")
    add(
        "Parse to written file, in a fresh process, measured in-process after `import torch` "
        "(Python start-up and `import torch` excluded); `import mixc` is listed apart. Cold: the "
        "first compile in the process (grammar and backend loaded on first use); warm: median "
        "of 5 more."
    )
    add("")
    add("| spec | import mixc s | compile, cold s | compile, warm s |")
    add("| --- | --- | --- | --- |")
    for name, r in data["compile"].items():
        add(f"| {name} | {r['import_s']:.3f} | {r['cold_s']:.3f} | {r['warm_s']:.4f} |")
    add("")

    if "allocator" in data:
        add("## Sensitivity to the C allocator")
        add("")
        add(
            "Every timing above runs with glibc's malloc told to keep freed memory "
            "(`MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=17179869184`, what a "
            "caching allocator such as jemalloc or tcmalloc does), for mixc, fla and the "
            "recurrent form alike. With glibc's defaults, malloc returns freed blocks to the OS "
            "and maps them again on the next call, a page fault per 4 KiB page (about 1.5 us "
            "here), and whether a process pays them is decided by its allocation history: the "
            "same call runs at 1.0x or 1.7x from one fresh process to the next (deltanet's chunk "
            "forward at T=4096: 9.6 to 16.9 ms over six processes, 0 or 20 MiB of faults per "
            "call). The same measurements with both settings, side by side, one round, forward, ms:"
        )
        add("")
        add(
            "| measurement | glibc's default malloc | malloc keeps memory (as in the tables above) |"
        )
        add("| --- | --- | --- |")
        default, keep = data["allocator"]["default"], data["allocator"]["keep"]
        for key in default:
            spec, what = key.split("|")
            label = {
                "mixc": f"{spec}, mixc chunk, T={PEER_T}",
                "fla": f"{spec}, fla reference, T={PEER_T}",
                "chunk8192": f"{spec}, mixc chunk, T={RECURRENT_T}",
                "recurrent8192": f"{spec}, mixc recurrent, T={RECURRENT_T}",
            }[what]
            add(f"| {label} | {_ms(default[key])} | {_ms(keep[key])} |")
        add("")

    add("## Time and memory versus T")
    add("")
    add("![time and memory versus T](bench.png)")
    add("")
    add(
        "`mixc bench` on the four specs above (chunk forward and forward+backward, recurrent "
        "forward up to T=2048): time grows linearly in T for the chunked form, and so does its "
        "memory."
    )
    add("")
    add("| spec | form | pass | " + " | ".join(f"T={t}" for t in args.sweep_T) + " |")
    add("| --- | --- | --- | " + " | ".join("---" for _ in args.sweep_T) + " |")
    for name, sweep in data["sweep"].items():
        rows: dict = {}
        for p in sweep["points"]:
            rows.setdefault((p["form"], p["pass"]), {})[p["T"]] = p["median_s"]
        for (form, pas), by_t in rows.items():
            cells = [_ms(by_t[t]) if t in by_t else "-" for t in args.sweep_T]
            add(f"| {name} | {form} | {pas} | " + " | ".join(cells) + " |")
    add("")
    add("Times in ms (median). Raw numbers: `benchmarks/results.json`.")
    add("")
    return "\n".join(lines)


def draw(data: dict, path: Path) -> None:
    from mixc.tools.bench import BenchResult, Point
    from mixc.tools.bench_report import plot

    results = []
    for sweep in data["sweep"].values():
        r = BenchResult(
            spec=sweep["spec"],
            name=sweep["mixer"],
            sizes=sweep["sizes"],
            chunk_size=sweep["chunk_size"],
            threads=sweep["threads"],
            device=sweep["device"],
            repeats=sweep["repeats"],
        )
        for p in sweep["points"]:
            r.points.append(
                Point(
                    p["form"],
                    p["pass"] != "forward",
                    p["T"],
                    p["times_s"],
                    p["peak_bytes"],
                    p["flops"],
                )
            )
        results.append(r)
    first = results[0]
    title = (
        f"mixc chunked (solid) and recurrent (dotted) forms: B={B}, NH={NH}, d_k=d_v={D}, fp32, "
        f"CPU, {first.threads} threads; squares: forward+backward"
    )
    plot(results, path, title=title)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7, help="timed calls per worker (forward)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of workers, interleaved")
    parser.add_argument(
        "--sweep-T", type=lambda s: [int(x) for x in s.split(",")], default=list(SWEEP_T)
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "RESULTS.md")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results.json")
    parser.add_argument("--plot", type=Path, default=ROOT / "benchmarks" / "bench.png")
    parser.add_argument("--from-json", type=Path, help="rewrite the report from saved results")
    parser.add_argument(
        "--max-busy",
        type=float,
        metavar="FRACTION",
        help="before each worker, wait (up to 15 min) until other work keeps less than this "
        "share of the CPUs busy (e.g. 0.1; sampled over 2 s from /proc/stat)",
    )
    args = parser.parse_args()
    global MAX_BUSY
    MAX_BUSY = args.max_busy
    if args.worker:
        worker(args.worker)
        return 0
    sys.path.insert(0, str(ROOT))
    if args.from_json:
        data = json.loads(args.from_json.read_text())
    else:
        data = measure(args)
        args.json.write_text(json.dumps(data, indent=1) + "\n")
        log(f"wrote {args.json}")
    args.out.write_text(report(data))
    draw(data, args.plot)
    log(f"wrote {args.out} and {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
