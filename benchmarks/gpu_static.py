"""A static resource report of every Triton kernel of mixc, without a GPU.

Each kernel (forward and backward of every class with a Triton kernel) is compiled by triton for
a GPU target (sm_90: H100/H200; sm_100: B200) at flash-linear-attention's benchmark shapes
(d_k = d_v = 128, 64-token chunks) in bfloat16 (16-bit inputs, products on the tensor cores) and
float32 (IEEE products), with the launch the kernels make (the strides of the last axis 1, the
others and the pointers multiples of 16). The PTX is assembled by the ptxas that ships with
triton, and the report reads off: registers per thread, spill stores and loads (ptxas -v), the
stack frame and shared memory (cuobjdump -res-usage), on sm_100 the tensor memory a program
allocates (columns of 512; more and the kernel cannot launch), the tensor-core instructions in the PTX
(mma, wgmma) and in the machine code (HMMA, HGMMA; cuobjdump -sass), and the compile time.

    python benchmarks/gpu_static.py                 # every kernel, sm_90, bf16 and fp32
    python benchmarks/gpu_static.py --arch 90 100   # and sm_100
    python benchmarks/gpu_static.py --only scalar_decay --dtype bf16 --no-write
    python benchmarks/gpu_static.py --only delta --dtype fp32 --append  # add or replace rows
    python benchmarks/gpu_static.py --dtype tf32 --append  # float32 inputs, TF32 allowed

Each compile runs in its own process, niced, under --timeout seconds (a compile that runs out
is reported as such), one at a time. The table goes to benchmarks/RESULTS-gpu-static.md with
triton's version, and the rows to benchmarks/RESULTS-gpu-static.json, unless --no-write;
--append keeps the rows of earlier runs that this run does not redo. Targets: no spills, tensor-core instructions in every
bf16 kernel, each compile under two minutes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "RESULTS-gpu-static.md"
#: Every row written so far, so that --append can add rows from another run.
ROWS = ROOT / "benchmarks" / "RESULTS-gpu-static.json"
sys.path.insert(0, str(ROOT))  # this checkout's mixc, whichever is installed

KERNEL_DIR = ROOT / "mixc" / "backends" / "triton" / "kernels"


def _kernels() -> tuple[tuple[str, str, str, str], ...]:
    """The kernels: (class, direction, the @triton.jit function, the kernel file that defines
    it), each a function `_tl_<class>_<direction>` or `_tl_<class>_<direction>_<part>` (a
    direction split into several launches) of the class's files (`<class>.py`,
    `<class>_*.py`), read from their text."""
    found = []
    for cls in ("scalar_decay", "delta", "diagonal", "dplr", "elementwise"):
        for direction in ("fwd", "bwd"):
            for path in sorted(KERNEL_DIR.glob(f"{cls}*.py")):
                pattern = rf"^def (_tl_{cls}_{direction}(?:_[a-z]+)*)\("
                for name in re.findall(pattern, path.read_text(encoding="utf-8"), re.M):
                    found.append((cls, direction, name, path.stem))
    return tuple(found)


#: The kernels: (class, direction, the @triton.jit function, its file).
KERNELS = _kernels()
#: The elementwise class (a scan, no matmuls) at Mamba-1's shapes: a state of 16 rows (d_state)
#: per value column, the gate dt_t ⊗ A (g_scale given).
ELEMENTWISE_D_K = 16
#: The pointers that hold 16-bit data on the bf16 path (the inputs, the output and its
#: gradient, DPLR's decayed rows and kept tiles); every other pointer (gates, betas, states,
#: the other kernels' kept tiles, gradients) is float32.
SIXTEEN_BIT = {"q", "k", "v", "a", "b", "do", "o", "qd", "ad", "kd", "bd"}
#: The 16-bit pointers of some kernels only (DPLR's kept tiles: T and the scores).
SIXTEEN_BIT_OF = {"dplr": {"ts", "dts"}}
#: The tensor memory of an sm_100 SM, in 32-bit columns of 128 lanes: triton compiles a kernel
#: that allocates more into a trap and refuses to launch it (OutOfResources, "tensor memory").
TMEM_COLUMNS = 512
#: The most shared memory a program may take on sm_90 and sm_100 (227 KB): triton refuses to
#: launch a kernel that needs more (OutOfResources, "shared memory").
SHARED_BYTES = 232448
#: The kernels of a class with matmuls that multiply nothing themselves: the DPLR backward's
#: gate gradient (sums and scans of the terms the key-side kernel wrote).
SCANS_ONLY = {"_tl_dplr_bwd_gates"}
#: fla's benchmark shapes: key and value width, chunk.
D_K, D_V, CHUNK = 128, 128, 64


#: The DOT constexpr (kernels/common.py, _tl_dot_precision) of each dtype of the report.
DOTS = {"bf16": "bf16", "fp32": "ieee", "tf32": "tf32"}


def _config(cls: str, kernel: str, module: str, dtype: str) -> tuple[int, int, int, int, str]:
    """The launch of one kernel at the benchmark shapes in dtype, as the kernels launch it
    (kernels/common.py, _tl_tiles and _tl_launch, whose tiles depend on the products'
    precision): key rows and value columns of a program (BK, BV), warps, pipeline stages, and
    its DOT ("ieee16": IEEE products summed in parts of 16)."""
    import importlib

    from mixc.backends.triton.kernels.common import _tl_launch, _tl_tiles

    fn = getattr(importlib.import_module(f"mixc.backends.triton.kernels.{module}"), kernel)
    most_k, most_v, _ = _tl_tiles(fn, DOTS[dtype])
    d_k = ELEMENTWISE_D_K if cls == "elementwise" else D_K
    launch = _tl_launch(fn, DOTS[dtype])
    block_k = d_k if most_k is None else min(d_k, most_k)
    dot = launch.get("DOT", DOTS[dtype])
    return block_k, min(D_V, most_v), launch["num_warps"], launch["num_stages"], dot


def _bin(tool: str) -> str:
    import triton

    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / tool)


def _signature(fn, dtype: str, consts: dict, cls: str = ""):
    """(signature, constexprs, attrs) of a launch of fn at the benchmark shapes: each pointer's
    element type, the last axis' strides 1 (a constexpr, as triton specialises them), every other
    integer and pointer a multiple of 16."""
    sig, constexprs, attrs = {}, dict(consts), {}
    for i, name in enumerate(fn.arg_names):
        if name in consts:
            sig[name] = "constexpr"
        elif name.startswith("s") and name.endswith("_d"):
            sig[name], constexprs[name] = "constexpr", 1
        elif name in ("T", "NH", "K", "V") or re.fullmatch(r"s\w+_[bht]", name):
            sig[name], attrs[(i,)] = "i32", [["tt.divisibility", 16]]
        elif re.fullmatch(r"s\w+_[kv]", name):  # a broadcast gate's strides: 0, 1 or more
            sig[name] = "i32"
        else:
            sixteen = SIXTEEN_BIT | SIXTEEN_BIT_OF.get(cls, set())
            sig[name] = "*bf16" if dtype == "bf16" and name in sixteen else "*fp32"
            attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, constexprs, attrs


def compile_one(cls: str, direction: str, dtype: str, arch: int, block_k: int, block_v: int,
                warps: int, stages: int, gate: bool = True, chunk: int = CHUNK,
                kernel: str | None = None, module: str | None = None,
                dot: str | None = None) -> dict:  # fmt: skip
    """Compile one kernel in this process; the figures of its report row."""
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="mixc-static-")
    os.environ["TRITON_DUMP_PTXAS_LOG"] = "1"
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    import importlib
    import io
    from contextlib import redirect_stdout

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(
        importlib.import_module(f"mixc.backends.triton.kernels.{module or cls}"),
        kernel or f"_tl_{cls}_{direction}",
    )
    consts = {"HAS_G": gate, "HAS_SCALE": gate, "BT": chunk, "C": chunk, "BV": block_v,
              "BK": block_k, "SCALAR": False,
              "DOT": dot or DOTS[dtype], "LEVELS": chunk.bit_length() - 1}  # fmt: skip
    consts.update({"KEEP": True} if direction == "fwd" else {"GATE_GRAD": True})
    consts = {name: value for name, value in consts.items() if name in fn.arg_names}
    sig, constexprs, attrs = _signature(fn, dtype, consts, cls)
    source = ASTSource(fn, sig, constexprs, attrs)
    log = io.StringIO()
    start = time.perf_counter()
    with redirect_stdout(log):
        kernel = triton.compile(
            source, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps, "num_stages": stages}
        )  # fmt: skip
    seconds = time.perf_counter() - start
    ptx = kernel.asm["ptx"]
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(kernel.asm["cubin"])
    usage = subprocess.run(
        [_bin("cuobjdump"), "-res-usage", f.name], capture_output=True, text=True
    )
    sass = subprocess.run([_bin("cuobjdump"), "-sass", f.name], capture_output=True, text=True)
    os.unlink(f.name)
    ptxas = log.getvalue()
    res = dict(re.findall(r"(\w+):(\d+)", usage.stdout.split("Function", 1)[-1]))

    def _ptxas(pattern):
        m = re.search(pattern, ptxas)
        return int(m.group(1)) if m else None

    return {
        "seconds": round(seconds, 1),
        "registers": _ptxas(r"Used (\d+) registers") or int(res.get("REG", -1)),
        "spill_stores": _ptxas(r"(\d+) bytes spill stores"),
        "spill_loads": _ptxas(r"(\d+) bytes spill loads"),
        "stack": int(res.get("STACK", -1)),
        "local": int(res.get("LOCAL", -1)),
        "shared": kernel.metadata.shared,
        "tmem": getattr(kernel.metadata, "tmem_size", None),  # sm_100's tensor memory, columns
        "ptx_mma": len(re.findall(r"^\s*mma\.", ptx, re.M)),
        "ptx_wgmma": len(re.findall(r"^\s*wgmma\.mma_async", ptx, re.M)),
        "ptx_tcgen05": len(re.findall(r"^\s*(?:@\S+\s+)?tcgen05\.mma", ptx, re.M)),
        "sass_hmma": len(re.findall(r"\bHMMA\b", sass.stdout)),
        "sass_hgmma": len(re.findall(r"\bHGMMA\b", sass.stdout)),
        "sass_utcmma": len(re.findall(r"\bUTC\w*MMA\b", sass.stdout)),
    }


def _run_child(row: dict, timeout: float, niceness: int = 19) -> dict:
    """compile_one in a child process, niced, under timeout seconds."""
    command = ["nice", "-n", str(niceness), sys.executable, __file__, "--child", json.dumps(row)]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"compile not finished after {timeout:.0f} s"}
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": f"failed: {last[:160]}", "seconds": round(time.perf_counter() - start, 1)}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _verdict(row: dict, result: dict) -> str:
    if "error" in result:
        return result["error"]
    misses = []
    if (result["spill_stores"] or 0) + (result["spill_loads"] or 0) + result["local"] > 0:
        misses.append("spills")
    # scans, no matmul to put on the tensor cores
    matmuls = row["cls"] != "elementwise" and _name(row) not in SCANS_ONLY
    if (
        matmuls
        and row["dtype"] in ("bf16", "tf32")
        and result["ptx_mma"] + result["ptx_wgmma"] + result.get("ptx_tcgen05", 0) == 0
    ):
        misses.append("no tensor-core instructions")
    if (result.get("shared") or 0) > SHARED_BYTES:
        misses.append(f"shared memory {result['shared']} of {SHARED_BYTES} B: cannot launch")
    if (result.get("tmem") or 0) > TMEM_COLUMNS:
        misses.append(f"tensor memory {result['tmem']} of {TMEM_COLUMNS} columns: cannot launch")
    if result["seconds"] > 120:
        misses.append("compile over 2 min")
    return "; ".join(misses) or "meets the targets"


def _name(row: dict) -> str:
    """The @triton.jit function of a row (rows written before a direction could be split into
    several launches name only the class and direction)."""
    return row.get("kernel") or f"_tl_{row['cls']}_{row['direction']}"


def _table(rows: list[tuple[dict, dict]]) -> list[str]:
    head = (
        "| kernel | dtype | sm | BK, BV, warps, stages | regs | spill st/ld (B) | stack | shared (B) "
        "(TMEM cols) | mma / wgmma / tcgen05.mma (PTX) | HMMA / HGMMA / UTC*MMA (SASS) | compile (s) | verdict |"
    )
    lines = [head, "|" + " --- |" * 12]
    for row, r in rows:
        name = f"`{_name(row)}`"
        conf = f"{row.get('block_k', '?')}, {row['block_v']}, {row['warps']}, {row['stages']}"
        if row.get("dot", DOTS[row["dtype"]]) != DOTS[row["dtype"]]:
            conf += f" ({row['dot']})"  # IEEE products in parts of 16
        if "error" in r:
            lines.append(
                f"| {name} | {row['dtype']} | {row['arch']} | {conf} | | | | | | | "
                f"{r.get('seconds', '')} | {_verdict(row, r)} |"
            )
            continue
        lines.append(
            f"| {name} | {row['dtype']} | {row['arch']} | {conf} | {r['registers']} | "
            f"{r['spill_stores']} / {r['spill_loads']} | {r['stack']} | {r['shared']}"
            f"{f' ({tmem})' if (tmem := r.get('tmem')) else ''} | "
            f"{r['ptx_mma']} / {r['ptx_wgmma']} / {r.get('ptx_tcgen05', 0)} | "
            f"{r['sass_hmma']} / {r['sass_hgmma']} / {r.get('sass_utcmma', 0)} | "
            f"{r['seconds']} | {_verdict(row, r)} |"
        )
    return lines


def _write(rows, command: str, append: bool) -> None:
    import triton

    def key(row):
        return (_name(row), row["dtype"], row["arch"])

    order = {kernel[2]: i for i, kernel in enumerate(KERNELS)}
    if append and ROWS.exists():
        new = {key(row) for row, _ in rows}
        old = [tuple(pair) for pair in json.loads(ROWS.read_text(encoding="utf-8"))["rows"]]
        # the rows of kernels that no longer exist (a direction since split) are dropped
        rows = [p for p in old if key(p[0]) not in new and _name(p[0]) in order] + rows
    rows.sort(key=lambda p: (order[_name(p[0])], p[0]["dtype"], p[0]["arch"]))
    ROWS.write_text(json.dumps({"triton": triton.__version__, "rows": rows}, indent=1) + "\n")
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = [
        "# Triton kernels: static resource report (no GPU)",
        "",
        f"Last written by `{command}` on {now} (rows of earlier runs kept by --append): "
        f"triton {triton.__version__}, "
        f"{platform.machine()} host with {os.cpu_count()} CPUs shared with other work (compile "
        "times are this machine's, niced). Shapes: d_k = d_v = 128, 64-token chunks, "
        "gates on, the forward keeping what the backward reads, the backward with the gates' "
        "gradients. bf16: 16-bit q, k, v (and a, b, dO), products in bf16 with float32 "
        "accumulation, gate sums in tf32x3; fp32: IEEE float32 products; tf32: float32 inputs "
        "with TF32 allowed (torch.set_float32_matmul_precision('high')). Registers and spills "
        "from ptxas -v, stack and shared memory from cuobjdump -res-usage, tensor-core "
        "instructions counted in the PTX and in the SASS (HGMMA: Hopper's warpgroup MMA).",
        "",
        *_table(rows),
        "",
    ]
    OUT.write_text("\n".join(text), encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, nargs="+", default=[90])
    parser.add_argument(
        "--dtype", nargs="+", default=["bf16", "fp32"], choices=["bf16", "fp32", "tf32"]
    )
    parser.add_argument("--only", nargs="+", help="class files (scalar_decay, delta, ...)")
    parser.add_argument("--direction", nargs="+", default=["fwd", "bwd"])
    parser.add_argument("--kernel", nargs="+", help="these @triton.jit kernels only, by name")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--nice", type=int, default=19, help="niceness of each compile")
    parser.add_argument("--block-k", type=int, help="override BK of every kernel")
    parser.add_argument("--block-v", type=int, help="override BV of every kernel")
    parser.add_argument("--warps", type=int, help="override num_warps of every kernel")
    parser.add_argument("--dot", help="override DOT of every kernel (fp32: ieee, ieee16)")
    parser.add_argument("--no-gate", action="store_true", help="compile without gates")
    parser.add_argument("--chunk", type=int, default=CHUNK, help="tokens per chunk (BT)")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--append", action="store_true", help="keep earlier runs' other rows")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(compile_one(**json.loads(args.child))))
        return 0
    rows = []
    for cls, direction, kernel, module in KERNELS:
        if (args.only and cls not in args.only) or direction not in args.direction:
            continue
        if args.kernel and kernel not in args.kernel:
            continue
        for dtype in args.dtype:
            block_k, block_v, warps, stages, dot = _config(cls, kernel, module, dtype)
            for arch in args.arch:
                row = {"cls": cls, "direction": direction, "kernel": kernel, "module": module,
                       "dtype": dtype, "arch": arch,
                       "block_k": args.block_k or block_k, "block_v": args.block_v or block_v,
                       "warps": args.warps or warps, "stages": stages,
                       "gate": not args.no_gate, "chunk": args.chunk, "dot": args.dot or dot}  # fmt: skip
                result = _run_child(row, args.timeout, args.nice)
                rows.append((row, result))
                print(_table([(row, result)])[-1], flush=True)
    if not args.no_write:
        command = " ".join(["python benchmarks/gpu_static.py", *(argv or sys.argv[1:])])
        _write(rows, command, args.append)
    return 0


if __name__ == "__main__":
    sys.exit(main())
