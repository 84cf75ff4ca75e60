"""Cross-check of the pipeline specs against flash-linear-attention 0.6.0's pure-PyTorch
references (issue 30): specs/gsa.mix against `naive_recurrent_gsa`, specs/precond_gdn.mix against
`naive_recurrent_precond_gated_delta_rule`. Not a test and not a dependency of mixc: fla-core is
installed only where this script runs, e.g.

    pip install --target /tmp/fla060 fla-core==0.6.0 --no-deps   # einops too, if missing
    python benchmarks/fla_pipelines.py [--fla /tmp/fla060/fla]

Each naive.py is loaded by its path (importing fla.ops needs triton). The specs' inputs map onto
fla's as their headers say; fla's scale is passed as 1 (the specs l2-normalise q themselves).
Every compiled form (chunk at two chunk sizes, recurrent, step token by token) is compared with
fla's reference in float64, with initial states."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from peers import load_fla  # noqa: E402

import mixc  # noqa: E402

B, T, NH, K, V, M = 2, 77, 3, 16, 12, 8


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def forms(module, args, states):
    """Every form's output and final states, each from the initial states `states`."""
    out = {}
    for c in (16, 64):
        out[f"chunk C={c}"] = module.chunk(
            *args, initial_state=states, output_final_state=True, chunk_size=c
        )
    out["recurrent"] = module.recurrent(*args, initial_state=states, output_final_state=True)
    ys, state = [], states
    for t in range(T):
        y, state = module.step(*(x[:, t] for x in args), state=state)
        ys.append(y)
    out["step"] = (torch.stack(ys, 1), state)
    return out


def gsa(fla: Path | None) -> list[str]:
    naive = load_fla("gsa", root=fla).naive_recurrent_gsa
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(B, T, NH, K, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(B, T, NH, V, generator=g, dtype=torch.float64)
    a = torch.randn(B, T, NH, M, generator=g, dtype=torch.float64)
    Ks0 = 0.1 * torch.randn(B, NH, M, K, generator=g, dtype=torch.float64)
    Vs0 = 0.1 * torch.randn(B, NH, V, M, generator=g, dtype=torch.float64)
    qn, kn = (x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6) for x in (q, k))
    gate = F.logsigmoid(a)
    # fla: hk [K, M] = Ks^T, hv [M, V] = Vs^T; slots written with s = 1 - exp(g)
    y_ref, (hk, hv) = naive(
        qn,
        kn,
        v,
        1 - gate.exp(),
        gate,
        scale=1.0,
        initial_state=(Ks0.mT.contiguous(), Vs0.mT.contiguous()),
        output_final_state=True,
    )
    module = mixc.load(ROOT / "specs/gsa.mix")
    lines = []
    for form, (y, (Ks, Vs)) in forms(module, (q, k, v, a), (Ks0, Vs0)).items():
        errs = (rel(y, y_ref), rel(Ks.mT, hk), rel(Vs.mT, hv))
        lines.append(f"gsa {form}: y {errs[0]:.1e}, Ks {errs[1]:.1e}, Vs {errs[2]:.1e}")
    return lines


def precond(fla: Path | None) -> list[str]:
    naive = load_fla("precond_gated_delta_rule", root=fla).naive_recurrent_precond_gated_delta_rule
    g = torch.Generator().manual_seed(1)
    q, k = (torch.randn(B, T, NH, K, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(B, T, NH, V, generator=g, dtype=torch.float64)
    a, b, gl, beta = (torch.randn(B, T, NH, generator=g, dtype=torch.float64) for _ in range(4))
    gl, beta = F.logsigmoid(gl), torch.sigmoid(beta)
    H0 = 0.1 * torch.randn(B, NH, V, K, generator=g, dtype=torch.float64)
    A0 = torch.rand(B, NH, K, generator=g, dtype=torch.float64)
    # fla normalises q and k with F.normalize (x / max(|x|, 1e-12)); the spec's l2norm is
    # x / sqrt(|x|^2 + 1e-6): give both unit vectors, on which they agree to 5e-7
    qn, kn = (F.normalize(x, dim=-1) for x in (q, k))
    # fla computes in float32 whatever its inputs: its reference is float32 here
    y_ref, S, A = naive(
        qn,
        kn,
        v,
        F.logsigmoid(a),
        gl,
        torch.sigmoid(b),
        beta,
        scale=1.0,
        initial_state=H0.mT.float(),
        initial_A_state=A0.float(),
        output_final_state=True,
    )
    module = mixc.load(ROOT / "specs/precond_gdn.mix")
    lines = []
    for form, (y, (A_, H)) in forms(module, (qn, kn, v, a, b, gl, beta), (A0, H0)).items():
        errs = (rel(y, y_ref.double()), rel(H.mT, S.double()), rel(A_, A.double()))
        lines.append(f"precond_gdn {form}: y {errs[0]:.1e}, H {errs[1]:.1e}, A {errs[2]:.1e}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--fla", type=Path, help="the fla package folder (default: the installed one)"
    )
    args = parser.parse_args()
    for line in gsa(args.fla) + precond(args.fla):
        print(line)


if __name__ == "__main__":
    main()
