"""How much the bfloat16 rule for kernels that round their operands raises the bounds, one command:

    python benchmarks/bf16_operands.py                 # every shipped spec with such a kernel
    python benchmarks/bf16_operands.py --only mamba2   # some of them
    python benchmarks/bf16_operands.py --write         # and write benchmarks/RESULTS-bf16-operands.md

For each shipped spec whose Triton module calls a kernel with `operands=` (its `OPERANDS`), it
draws examples as `mixc fuzz --dtype bfloat16` does (hypothesis, derandomised) and prints, over
every quantity (output, final states, gradients) of every example, the bound the chunked form
gets (docs/fuzzing.md: 4x what rounding the kernels' operands to bfloat16 costs in float64, plus
the float32 bound, at least the plain bfloat16 bound) against the plain float32 bound (1e-5 /
1e-4, or what the example's conditioning raises it to) and against the plain bfloat16 bound (4x
the rounding of the result): the median and the largest ratio, and the largest bound. A bound
near 1 would pass anything; the ratio to float32's says how far the rule is from the float32
check. Needs no GPU and no triton (the Triton modules' OPERANDS are read from their text).
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "RESULTS-bf16-operands.md"
sys.path.insert(0, str(ROOT))  # this checkout's mixc

from mixc.check.forms import drawn_operand_bounds  # noqa: E402
from mixc.check.operands import declared_operands  # noqa: E402
from mixc.driver import compile_source  # noqa: E402


def declared(path: Path) -> dict[str, tuple[str, ...]]:
    """The OPERANDS the spec's Triton module declares ({} for none), read from its text."""
    return declared_operands(compile_source(path, "triton"))


def ratios(path: Path, n: int, max_T: int) -> list[tuple[float, float, float]]:
    """(rule's bound, float32 bound, plain bfloat16 bound) of every quantity of n examples."""
    drawn = drawn_operand_bounds(path, declared(path), n, max_T)
    return [(raised, fp32, plain) for _, raised, plain, fp32 in drawn]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="these specs only")
    parser.add_argument("--examples", type=int, default=10, help="examples a spec (default 10)")
    parser.add_argument("--max-T", type=int, default=100, help="longest sequence (default 100)")
    parser.add_argument("--write", action="store_true", help=f"write {OUT.relative_to(ROOT)}")
    args = parser.parse_args()
    torch.set_num_threads(1)
    paths = sorted((ROOT / "specs").glob("*.mix"))
    paths = [p for p in paths if not args.only or p.stem in args.only]
    lines = [
        "| spec | kernels' rounded operands | quantities | raised by the rule | rule / fp32 "
        "bound (median, max) | rule / plain bf16 bound (median, max) | largest plain bf16 "
        "bound | largest rule's bound |",
        "|---|---|---|---|---|---|---|---|",
    ]
    start = time.perf_counter()
    for path in paths:
        ops = declared(path)
        if not ops:
            continue
        rows = ratios(path, args.examples, args.max_T)
        fp32 = [a / b for a, b, _ in rows]
        bf16 = [a / c for a, _, c in rows]
        raised = sum(1 for x in bf16 if x > 1 + 1e-9)
        kernels = ", ".join(f"{k} ({', '.join(v)})" for k, v in ops.items())
        lines.append(
            f"| {path.stem} | {kernels} | {len(rows)} | {raised} | "
            f"{statistics.median(fp32):.3g}, {max(fp32):.3g} | "
            f"{statistics.median(bf16):.3g}, {max(bf16):.3g} | "
            f"{max(c for _, _, c in rows):.2e} | {max(a for a, _, _ in rows):.2e} |"
        )
        print(lines[-1], flush=True)
    if args.write:
        load = os.getloadavg()[0]
        OUT.write_text(
            "# The bfloat16 rule for kernels that round their operands: its bounds\n\n"
            f"`python benchmarks/bf16_operands.py --examples {args.examples} --write`, "
            f"{datetime.date.today()}: torch {torch.__version__}, {args.examples} examples a "
            f"spec drawn as mixc fuzz draws them (T <= {args.max_T}); "
            f"{time.perf_counter() - start:.0f} s at load {load:.1f}. Every quantity (output, "
            "final states, gradients) of every example of every shipped spec whose Triton module "
            "declares OPERANDS: the bound its chunked forms get under `mixc fuzz --dtype "
            "bfloat16` (docs/fuzzing.md) against the float32 bound of the same example (1e-5 "
            "or 1e-4, or what its conditioning raises it to) and against the plain bfloat16 "
            "bound (4x the rounding of the result); 'raised by the rule': the quantities whose "
            "bound the operands' rounding raises. Only the scalar-decay and diagonal kernels "
            "take operands= (the delta rule's and DPLR's products mostly multiply what the "
            "chunk computed, which the rule does not model: they multiply float32, docs/"
            "triton.md), so the specs of those two classes only.\n\n" + "\n".join(lines) + "\n"
        )


if __name__ == "__main__":
    main()
