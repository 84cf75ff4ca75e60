"""Decoding speed: the compiled `step`'s time per token, one token at a time from a state.

    python benchmarks/decode.py kda gated_deltanet rwkv7     # shipped specs, by name

B = 1, NH = 4, every size of the spec 128 (d = 128), fp32, one CPU thread; each spec runs 200
tokens from a zero state, five times, and the best run counts. The inputs are random (scale
0.1), so no gate pushes the state towards overflow in 200 tokens. Results: DECODE.md.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

import mixc

B, NH, D, TOKENS, RUNS = 1, 4, 128, 200, 5


def per_token(spec: str) -> float:
    """Seconds per token of `step` for the shipped spec named `spec`."""
    module = mixc.load(Path(__file__).parents[1] / "specs" / f"{spec}.mix")
    gen = torch.Generator().manual_seed(0)
    args = [
        0.1 * torch.randn(B, NH, *(1 if d == "1" else D for d in shape), generator=gen)
        for _, shape in module.INPUTS
    ]
    best = float("inf")
    for _ in range(RUNS):
        state = None
        start = time.perf_counter()
        for _ in range(TOKENS):
            _, state = module.step(*args, state=state)
        best = min(best, (time.perf_counter() - start) / TOKENS)
    return best


def main(specs: list[str]) -> None:
    torch.set_num_threads(1)
    print(f"step, B={B}, NH={NH}, d={D}, fp32, 1 thread, best of {RUNS} x {TOKENS} tokens")
    for spec in specs:
        print(f"{spec:>16}: {per_token(spec) * 1e6:7.0f} us a token")


if __name__ == "__main__":
    main(sys.argv[1:] or ["kda", "gated_deltanet", "rwkv7"])
