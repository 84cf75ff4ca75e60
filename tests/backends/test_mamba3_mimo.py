"""specs/mamba3_mimo.mix (Mamba-3 MIMO, rank 2) against a reference written here from Mamba-3's
MIMO recurrence (Lahoti et al. 2025; state-spaces/mamba, mamba3_MIMO_step_ref in
tests/ops/tilelang/test_mamba3_mimo.py, with the pairing of the module's kernels: channel i with
i + N/2, the first R pairs turned): a float64 loop over tokens, over any rank, that keeps the
summed angles, the previous token's value and raw keys, and turns the pairs by hand. Every form
of the compiled module computes it (chunk, recurrent, parallel, step, prefill then step), and
mutants of the spec (interleaved or half-split pairs, a rank's previous-token write dropped, the
ranks' gates swapped) do not.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import mixc
from tests.mixers import (
    check_forms_against_reference,
    check_mutant_disagrees,
    check_prefill_then_step,
)

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "specs" / "mamba3_mimo.mix"
f64 = torch.float64
RANK = 2


def _turn_halves(u: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """u [..., N] with channels i and i + N/2 turned by angles[..., i], i < R; the rest kept."""
    out, half = u.clone(), u.shape[-1] // 2
    for i in range(angles.shape[-1]):
        c, s = torch.cos(angles[..., i]), torch.sin(angles[..., i])
        a, b = u[..., i], u[..., half + i]
        out[..., i], out[..., half + i] = a * c - b * s, a * s + b * c
    return out


def reference(x, z, dt, A, Bs, Cs, trap, w, D, B_bias, C_bias, mimo_x, mimo_z, mimo_o, start=None):
    """Mamba-3 MIMO of rank r = len(Bs), in float64. Per token inputs [Bt, T, NH, ...] (Bs and
    Cs: r tensors [Bt, T, NH, N]); per head D [NH], B_bias and C_bias r tensors [NH, N], mimo_x,
    mimo_z, mimo_o r tensors [NH, P]. `start` = (angles, H, x_prev, *B_prev) or None for zeros.
    Returns y [Bt, T, NH, P] and the final (angles, H, x_last, *B_last)."""
    Bt, T, NH, P = x.shape
    N, R, r = Bs[0].shape[-1], w.shape[-1], len(Bs)
    if start is None:
        start = (x.new_zeros(Bt, NH, R), x.new_zeros(Bt, NH, P, N), x.new_zeros(Bt, NH, P))
        start = (*start, *(x.new_zeros(Bt, NH, N) for _ in range(r)))
    theta, H, x_prev, *b_prev = (s.clone() for s in start)
    # the previous token's keys, turned by their own token's angles (the module's K_State)
    k_prev = [_turn_halves(b + bias, theta) for b, bias in zip(b_prev, B_bias, strict=True)]
    v_prev = [x_prev * m for m in mimo_x]
    ys = []
    for t in range(T):
        d = dt[:, t]
        theta = theta + math.pi * d[..., None] * torch.tanh(w[:, t])
        k = [_turn_halves(b[:, t] + bias, theta) for b, bias in zip(Bs, B_bias, strict=True)]
        q = [_turn_halves(c[:, t] + bias, theta) for c, bias in zip(Cs, C_bias, strict=True)]
        v = [x[:, t] * m for m in mimo_x]
        lam = torch.sigmoid(trap[:, t])
        alpha = torch.exp(-d * A[:, t])
        beta, gamma = (1 - lam) * d * alpha, lam * d
        prev = sum(torch.einsum("bhp,bhn->bhpn", vi, ki) for vi, ki in zip(v_prev, k_prev))
        curr = sum(torch.einsum("bhp,bhn->bhpn", vi, ki) for vi, ki in zip(v, k))
        H = (
            alpha[..., None, None] * H
            + beta[..., None, None] * prev
            + gamma[..., None, None] * curr
        )
        y = 0
        for i in range(r):
            out = torch.einsum("bhpn,bhn->bhp", H, q[i]) + D[:, None] * v[i]
            gate = z[:, t] * mimo_z[i]
            y = y + mimo_o[i] * out * gate * torch.sigmoid(gate)
        ys.append(y)
        k_prev, v_prev = k, v
    finals = (theta, H, x[:, -1], *(b[:, -1] for b in Bs)) if T else start
    return torch.stack(ys, 1), finals


def _inputs(Bt=2, T=23, NH=2, P=3, N=8, R=2, seed=0):
    """Inputs in Mamba-3's ranges: dt = softplus(.), A > 0 (its -A), angles' w any real; the
    biases near Mamba-3's start of 1, the MIMO projections near theirs (1/r, 1, 1/r). R = N / 4:
    rope_fraction 0.5. In the compiled forms' order."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=f64)

    args = dict(x=r(Bt, T, NH, P), z=r(Bt, T, NH, P))
    args |= dict(dt=torch.nn.functional.softplus(r(Bt, T, NH) - 1))
    args |= dict(A=torch.rand(Bt, T, NH, generator=g, dtype=f64) + 0.1)
    args |= {f"B{i + 1}": r(Bt, T, NH, N) for i in range(RANK)}
    args |= {f"C{i + 1}": r(Bt, T, NH, N) for i in range(RANK)}
    args |= dict(l=r(Bt, T, NH), w=2 * r(Bt, T, NH, R), D=r(NH))
    args |= {f"{b}{i + 1}_bias": 1 + 0.3 * r(NH, N) for b in "BC" for i in range(RANK)}
    for name, centre in (("x", 1 / RANK), ("z", 1.0), ("o", 1 / RANK)):
        args |= {f"mimo_{name}{i + 1}": centre + 0.3 * r(NH, P) for i in range(RANK)}
    return args


def _reference(args, start=None):
    a = args

    def ranks(prefix, suffix=""):
        return [a[f"{prefix}{i + 1}{suffix}"] for i in range(RANK)]

    return reference(
        *(a[n] for n in ("x", "z", "dt", "A")),
        ranks("B"),
        ranks("C"),
        a["l"],
        a["w"],
        a["D"],
        ranks("B", "_bias"),
        ranks("C", "_bias"),
        ranks("mimo_x"),
        ranks("mimo_z"),
        ranks("mimo_o"),
        start=start,
    )


def _start(Bt=2, NH=2, P=3, N=8, R=2, seed=1):
    g = torch.Generator().manual_seed(seed)
    angles = 3 * torch.randn(Bt, NH, R, generator=g, dtype=f64)
    rest = [torch.randn(Bt, NH, P, N, generator=g, dtype=f64)]
    rest += [torch.randn(Bt, NH, P, generator=g, dtype=f64)]
    return (angles, *rest, *(torch.randn(Bt, NH, N, generator=g, dtype=f64) for _ in range(RANK)))


def _rel(a, b) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.fixture(scope="module")
def module():
    return mixc.load(SPEC)


def test_the_halves_turn_is_rotate_halves():
    """The reference's hand-written turn is the built-in the spec calls (the oracle's)."""
    from mixc.frontend.builtins import BUILTINS

    u, angles = torch.randn(3, 10, dtype=f64), torch.randn(3, 2, dtype=f64)
    got = BUILTINS["rotate_halves"].tensor(u[..., None], angles[..., None])[..., 0]
    assert torch.equal(got, _turn_halves(u, angles))


@pytest.mark.parametrize("start", [False, True], ids=["zero state", "initial state"])
def test_every_form_computes_the_reference(module, start):
    args = _inputs()
    init = _start() if start else None
    want, finals = _reference(args, init)
    check_forms_against_reference(module, args, init, want, finals)


def test_prefill_then_step_is_one_pass(module):
    """The step carries the summed angles, the previous token's value and both ranks' keys:
    prefill 15 tokens in the chunked form, then step token by token, gives what the reference
    gives in one pass."""
    args = _inputs(T=23)
    want, finals = _reference(args)
    check_prefill_then_step(module, args, want, finals)


def test_float32_at_mamba3_ranges(module):
    """In float32, at Mamba-3's sizes in small (N = 16, R = N / 4), within 1e-5 of float64."""
    args = _inputs(T=64, N=16, R=4, P=8, seed=3)
    want, _ = _reference(args)
    y, _ = module.chunk(*(v.float() for v in args.values()), chunk_size=16)
    assert _rel(y.double(), want) < 1e-5


#: Each a plausible slip in writing Mamba-3 MIMO, which the reference tells apart.
MUTANTS = {
    "interleaved pairs (the step reference's)": (
        "= rotate_halves(u, angle)",
        "= rotate_interleaved(u, angle)",
    ),
    "half-split pairs of the leading 2R channels": (
        "= rotate_halves(u, angle)",
        "= rotate(u, angle)",
    ),
    "rank 2's previous-token write dropped": (
        " + (1 - lam_t) dt_t a_t (mimo_x2 * x_{t-1}) turn(B2_{t-1} + B2_bias, Th_{t-1})^T",
        "",
    ),
    "rank 2's value read without its projection": (
        "lam_t dt_t (mimo_x2 * x_t) turn(B2_t",
        "lam_t dt_t x_t turn(B2_t",
    ),
    "the ranks' gates swapped": (
        "silu(mimo_z1 * z_t) + mimo_o2",
        "silu(mimo_z2 * z_t) + mimo_o2",
    ),
}


@pytest.mark.parametrize("name", list(MUTANTS))
def test_mutants_disagree_with_the_reference(name):
    args = _inputs()
    want, _ = _reference(args)
    check_mutant_disagrees(SPEC, *MUTANTS[name], args, want)
