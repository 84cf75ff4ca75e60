"""Issue 30's measurement of a value-side transition: the gated Oja rule (specs/gated_oja.mix)
chunk forward (chunk_dplr_value: chunk_dplr, then chunk_diagonal) against its recurrent form at
T = 8192.

    PYTHONPATH=. python benchmarks/oja.py      # CPU, 2 threads, fp32, B=1, NH=4, d=64

The chunk and recurrent forms are timed in one process in alternation (a warm-up call of each
at T = 256, then `--repeats` timed calls of each, one of each in turn), forward under no_grad;
the figure is the ratio of medians. Inputs as the layer draws them: the decays exp(gv) through
a logsigmoid, beta in (0, 1)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import mixc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from peers import chunk_vs_recurrent  # noqa: E402


def inputs(T: int, B=1, NH=4, d=64):
    g = torch.Generator().manual_seed(0)
    q, k, v, gv = (torch.randn(B, T, NH, d, generator=g) for _ in range(4))
    beta = torch.sigmoid(torch.randn(B, T, NH, generator=g))
    return [q, k, v, F.logsigmoid(gv + 3.0), beta]


def main() -> None:
    chunk_vs_recurrent(mixc.load(ROOT / "specs/gated_oja.mix"), inputs, "gated_oja")


if __name__ == "__main__":
    main()
