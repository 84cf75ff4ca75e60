"""Shipped specs against flash-linear-attention's own references, one command:

    pip install --no-deps fla-core==0.6.0 einops     # the benchmark environment only
    python benchmarks/fla_agreement.py               # prints the table
    python benchmarks/fla_agreement.py --write       # and writes benchmarks/FLA-AGREEMENT.md

Each row runs a mixc spec's forms (chunk where it has one, recurrent) and an fla reference on
the same seeded fp32 inputs, with an initial state, and reports the largest relative error of
the outputs and of the final states (max |a - b| / max |b|). The references are fla's
pure-PyTorch `naive.py` functions, loaded by file path so that `fla.ops` and triton are never
imported; where fla has no pure-PyTorch reference (the gated Oja rule) its fused recurrent
Triton kernel runs under triton's interpreter (TRITON_INTERPRET=1, set here). mixc itself never
imports fla.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from peers import load_fla  # noqa: E402  (benchmarks/ is on the path as the script's folder)

import mixc  # noqa: E402

B, T, NH, K, V = 2, 100, 2, 16, 16
#: fp32 on both sides, each ~1e-6 from the exact answer over 100 tokens; a disagreement in the
#: maths shows as O(1).
AGREE = 1e-4


def _gated_oja():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from fla.ops.gated_oja_rule.fused_recurrent import fused_recurrent_gated_oja_rule

    return fused_recurrent_gated_oja_rule


@dataclass(frozen=True)
class Row:
    spec: str
    reference: str  # what the row compares with, for the table
    inputs: Callable[[torch.Generator], dict[str, torch.Tensor]]  # mixc's inputs, by name
    run: Callable[[dict, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]  # fla (o, h [K, V])


def _randn(gen, *shape):
    return torch.randn(B, T, NH, *shape, generator=gen)


def _unit(gen, d):
    return F.normalize(_randn(gen, d), dim=-1)


def _rand(gen, *shape):
    return torch.rand(B, T, NH, *shape, generator=gen)


def _comba_inputs(gen):
    k = _unit(gen, K)
    return dict(
        q=_randn(gen, K), k=k, v=_randn(gen, V), d=2 * _randn(gen, K),
        g=-0.1 * _rand(gen), beta=_rand(gen),
    )  # fmt: skip


def _comba(x, h0):
    """fla's Comba layer's erase key p = k * sigmoid(decay), given to its reference."""
    fn = load_fla("comba").naive_recurrent_comba
    p = x["k"] * torch.sigmoid(x["d"])
    args = (x["q"], x["k"], x["v"], p, x["beta"], x["g"])
    return fn(*args, scale=1.0, initial_state=h0, output_final_state=True)


def _gdn2_inputs(gen):
    return dict(
        q=_randn(gen, K), k=_unit(gen, K), v=_randn(gen, V), g=-0.1 * _rand(gen, K),
        b=_rand(gen, K), w=_rand(gen, V),
    )  # fmt: skip


def _gdn2(x, h0):
    fn = load_fla("gdn2").naive_recurrent_gdn2
    args = (x["q"], x["k"], x["v"], x["g"], x["b"], x["w"])
    return fn(*args, scale=1.0, initial_state=h0, output_final_state=True)


def _oja_inputs(gen):
    return dict(
        q=_randn(gen, K), k=_randn(gen, K), v=_unit(gen, V), gv=-0.1 * _rand(gen, V),
        beta=_rand(gen),
    )  # fmt: skip


def _oja(x, h0):
    args = (x["q"], x["k"], x["v"], x["gv"], x["beta"])
    return _gated_oja()(*args, scale=1.0, initial_state=h0, output_final_state=True)


ROWS = (
    Row("comba", "fla naive_recurrent_comba", _comba_inputs, _comba),
    Row("gdn2", "fla naive_recurrent_gdn2", _gdn2_inputs, _gdn2),
    Row(
        "gated_oja",
        "fla fused_recurrent_gated_oja_rule (interpreted)",
        _oja_inputs,
        _oja,
    ),
)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


def agree(row: Row) -> dict[str, tuple[float, float]]:
    """{form: (output error, final-state error)} of the spec's forms against the reference."""
    module = mixc.load(ROOT / "specs" / f"{row.spec}.mix")
    gen = torch.Generator().manual_seed(0)
    x = row.inputs(gen)
    h0 = torch.randn(B, NH, V, K, generator=gen)  # mixc's H [V, K]; fla keeps h = H^T
    o_ref, h_ref = row.run(x, h0.transpose(-1, -2).contiguous())
    args = [x[name] for name, _ in module.INPUTS]
    out = {}
    for form in ("chunk", "recurrent"):
        if form == "chunk" and "chunk" not in module.FORMS:
            continue
        o, h = getattr(module, form)(*args, initial_state=h0, output_final_state=True)
        out[form] = (_rel(o, o_ref), _rel(h.transpose(-1, -2), h_ref))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write benchmarks/FLA-AGREEMENT.md")
    args = parser.parse_args()
    lines = [
        "| spec | reference | form | output error | final-state error | agrees |",
        "|---|---|---|---|---|---|",
    ]
    failed = False
    for row in ROWS:
        for form, (eo, eh) in agree(row).items():
            ok = max(eo, eh) < AGREE
            failed |= not ok
            lines.append(
                f"| {row.spec} | {row.reference} | {form} | {eo:.1e} | {eh:.1e} | "
                f"{'yes' if ok else 'NO'} |"
            )
    table = "\n".join(lines)
    print(table)
    if args.write:
        (ROOT / "benchmarks" / "FLA-AGREEMENT.md").write_text(
            "# Shipped specs against flash-linear-attention's references\n\n"
            f"`python benchmarks/fla_agreement.py --write`, {datetime.date.today()}, torch "
            f"{torch.__version__}; B={B}, T={T}, NH={NH}, K={K}, V={V}, fp32, with an initial "
            f"state; relative error max|a - b| / max|b|, agreement below {AGREE:g}.\n\n"
            f"{table}\n"
        )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
