"""specs/mamba3.mix (Mamba-3 SISO) against a reference written here from Mamba-3's recurrence
(Lahoti et al. 2025; state-spaces/mamba, mamba3_siso_step_ref in
tests/ops/triton/test_mamba3_siso.py): a plain float64 loop, token by token, that keeps the
summed angles, the previous token's turned key and value, and turns pairs (2i, 2i + 1) by hand.
Every form of the compiled module computes it (chunk, recurrent, step, prefill then step), and
mutants of the spec (the turn on C only, the angle read a token late, half-split pairs) do not.
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
SPEC = ROOT / "specs" / "mamba3.mix"
f64 = torch.float64


def _turn_pairs(u: list[float], angles: list[float]) -> list[float]:
    """u with each leading pair (2i, 2i + 1) turned by angles[i]; the rest kept."""
    out = list(u)
    for i, a in enumerate(angles):
        c, s = math.cos(a), math.sin(a)
        out[2 * i] = u[2 * i] * c - u[2 * i + 1] * s
        out[2 * i + 1] = u[2 * i] * s + u[2 * i + 1] * c
    return out


def reference(x, z, dt, A, B, C, trap, w, D, B_bias, C_bias, start=None):
    """Mamba-3 SISO, one head of one sequence at a time. Inputs as the compiled forms take them
    ([Bt, T, NH, ...]); `start` = (angles, H, x_prev, B_prev) or None for zeros. Returns y
    [Bt, T, NH, P] and the final (angles, H, x_last, B_last)."""
    Bt, T, NH, P = x.shape
    N, R = B.shape[-1], w.shape[-1]
    y = torch.zeros(Bt, T, NH, P, dtype=f64)
    finals = [torch.zeros(Bt, NH, R, dtype=f64), torch.zeros(Bt, NH, P, N, dtype=f64)]
    finals += [torch.zeros(Bt, NH, P, dtype=f64), torch.zeros(Bt, NH, N, dtype=f64)]
    for b in range(Bt):
        for h in range(NH):
            theta = [0.0] * R if start is None else start[0][b, h].tolist()
            H = [[0.0] * N for _ in range(P)] if start is None else start[1][b, h].tolist()
            v_prev = [0.0] * P if start is None else start[2][b, h].tolist()
            b_prev = [0.0] * N if start is None else start[3][b, h].tolist()
            bias_b, bias_c = B_bias[h].tolist(), C_bias[h].tolist()
            # the previous token's key, turned by its own angles (Mamba-3's K_State)
            k_prev = _turn_pairs([bi + ci for bi, ci in zip(b_prev, bias_b)], theta)
            for t in range(T):
                d = dt[b, t, h].item()
                theta = [
                    th + math.pi * d * math.tanh(wi) for th, wi in zip(theta, w[b, t, h].tolist())
                ]
                k = _turn_pairs([bi + ci for bi, ci in zip(B[b, t, h].tolist(), bias_b)], theta)
                q = _turn_pairs([ci + bi for ci, bi in zip(C[b, t, h].tolist(), bias_c)], theta)
                v = x[b, t, h].tolist()
                lam = 1 / (1 + math.exp(-trap[b, t, h].item()))
                alpha = math.exp(-d * A[b, t, h].item())
                beta, gamma = (1 - lam) * d * alpha, lam * d
                H = [
                    [
                        alpha * H[p][n] + beta * v_prev[p] * k_prev[n] + gamma * v[p] * k[n]
                        for n in range(N)
                    ]
                    for p in range(P)
                ]
                zs = z[b, t, h].tolist()
                for p in range(P):
                    out = sum(H[p][n] * q[n] for n in range(N)) + D[h].item() * v[p]
                    y[b, t, h, p] = out * zs[p] / (1 + math.exp(-zs[p]))
                k_prev, v_prev = k, v
                b_prev = B[b, t, h].tolist()
            finals[0][b, h] = torch.tensor(theta, dtype=f64)
            finals[1][b, h] = torch.tensor(H, dtype=f64)
            finals[2][b, h] = torch.tensor(v_prev, dtype=f64)
            finals[3][b, h] = torch.tensor(b_prev, dtype=f64)
    return y, tuple(finals)


def _inputs(Bt=2, T=23, NH=2, P=3, N=8, R=2, seed=0, dtype=f64):
    """Inputs in Mamba-3's ranges: dt = softplus(.), A > 0 (its -A), angles' w any real; B and C
    biases near Mamba-3's start of 1. R = N / 4: rope_fraction 0.5."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=f64)

    args = dict(
        x=r(Bt, T, NH, P),
        z=r(Bt, T, NH, P),
        dt=torch.nn.functional.softplus(r(Bt, T, NH) - 1),
        A=torch.rand(Bt, T, NH, generator=g, dtype=f64) + 0.1,
        B=r(Bt, T, NH, N),
        C=r(Bt, T, NH, N),
        l=r(Bt, T, NH),
        w=2 * r(Bt, T, NH, R),
        D=r(NH),
        B_bias=1 + 0.1 * r(NH, N),
        C_bias=1 + 0.1 * r(NH, N),
    )
    return {k: v.to(dtype) for k, v in args.items()}


def _start(Bt=2, NH=2, P=3, N=8, R=2, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (
        3 * torch.randn(Bt, NH, R, generator=g, dtype=f64),
        torch.randn(Bt, NH, P, N, generator=g, dtype=f64),
        torch.randn(Bt, NH, P, generator=g, dtype=f64),
        torch.randn(Bt, NH, N, generator=g, dtype=f64),
    )


def _rel(a, b) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.fixture(scope="module")
def module():
    return mixc.load(SPEC)


@pytest.mark.parametrize("start", [False, True], ids=["zero state", "initial state"])
def test_every_form_computes_the_reference(module, start):
    args = _inputs()
    init = _start() if start else None
    want, finals = reference(*args.values(), start=init)
    check_forms_against_reference(module, args, init, want, finals)


def test_prefill_then_step_is_one_pass(module):
    """The step carries the summed angles and the previous token: prefill 15 tokens in the
    chunked form, then step token by token, gives what the reference gives in one pass."""
    args = _inputs(T=23)
    want, finals = reference(*args.values())
    check_prefill_then_step(module, args, want, finals)


def test_float32_at_mamba3_ranges(module):
    """In float32, from Mamba-3's ranges, within 1e-5 of the float64 reference."""
    args = _inputs(T=64, N=16, R=4, P=8, seed=3)
    want, _ = reference(*args.values())
    y, _ = module.chunk(*(v.float() for v in args.values()), chunk_size=16)
    assert _rel(y.double(), want) < 1e-5


def test_float32_with_angles_far_from_zero(module):
    """The summed angles are float64 in every form: from angles of some 3 * 10^5 rad (10^6
    tokens at 0.3 rad a token), float32 inputs give what the float64 reference gives on the same
    rounded values, within 1e-5, in the chunked form, the recurrent form, and prefill then step.
    A float32 state could not: the angles rounded to float32 (ulp 0.03 rad) move the output by
    more than 1e-3."""
    args = {k: v.float().double() for k, v in _inputs(T=32).items()}
    start = list(_start())
    start[0] = 3e5 + start[0]  # float64, as the forms keep it
    start[1:] = [s.float().double() for s in start[1:]]
    want, finals = reference(*args.values(), start=tuple(start))
    low = [v.float() for v in args.values()]
    state = (start[0], *(s.float() for s in start[1:]))
    y, got = module.chunk(*low, initial_state=state, output_final_state=True, chunk_size=8)
    assert _rel(y.double(), want) < 1e-5 and got[0].dtype == f64
    assert (got[0] - finals[0]).abs().max() < 1e-9  # the angles themselves, in float64
    y, _ = module.recurrent(*low, initial_state=state)
    assert _rel(y.double(), want) < 1e-5
    y0, carried = module.chunk(
        *[v[:, :20] if v.dim() >= 3 else v for v in low],
        initial_state=state,
        output_final_state=True,
    )
    ys = [y0]
    for t in range(20, 32):
        y_t, carried = module.step(*[v[:, t] if v.dim() >= 3 else v for v in low], state=carried)
        ys.append(y_t[:, None])
    assert _rel(torch.cat(ys, 1).double(), want) < 1e-5
    rounded = (start[0].float().double(), *start[1:])
    assert _rel(reference(*args.values(), start=rounded)[0], want) > 1e-3


def test_biases_added_in_the_kernel_and_the_dot_off_its_scores(module):
    """Without autograd the chunked form adds B's and C's biases as the kernel copies each
    span (a _Turned with its bias; 300 tokens, the last chunk padded) and reads k_t . q_t off
    the kernel's scores (diagonal=True: _tokenwise not called); under autograd the kernel
    returns no diagonal and k_t . q_t sums its vectors and biases a slice of tokens at a time
    (_tokenwise: 256 tokens a slice here, called more than once). Both what the reference
    gives."""
    args = _inputs(Bt=2, T=300, NH=4, P=4, N=64, R=8, seed=5)
    want, finals = reference(*args.values())
    calls = []
    tokenwise = module._tokenwise

    def counted(fn, *xs):
        return tokenwise(lambda *a: calls.append(1) or fn(*a), *xs)

    module._tokenwise = counted
    try:
        with torch.no_grad():
            y, got = module.chunk(*args.values(), output_final_state=True, chunk_size=16)
        assert not calls
        assert _rel(y, want) < 1e-12
        assert all(_rel(a, b) < 1e-12 for a, b in zip(got, finals))
        tracked = {k: v.clone().requires_grad_(k == "x") for k, v in args.items()}
        y, _ = module.chunk(*tracked.values(), chunk_size=16)
        assert len(calls) > 1 and y.requires_grad
        assert _rel(y.detach(), want) < 1e-12
    finally:
        module._tokenwise = tokenwise


def test_summed_angles_computed_where_they_are_summed(module):
    """Without autograd, on CPU, the chunked form's angles pi dt_t tanh(w_t) are computed in the
    buffer their sum runs in (_tanh_angle_sums): the same bits as the angles computed apart and
    summed (_angle_sums, what it does under autograd), within 1e-12 (relatively) of a float64
    sum of torch.tanh from the initial states, and w of +-30 and +-inf turn by +-pi dt."""
    g = torch.Generator().manual_seed(3)
    dt = torch.rand(2, 50, 3, 1, 1, generator=g)
    w = torch.randn(2, 50, 3, 4, 1, generator=g) * 3
    w[0, :4, 0, 0, 0] = torch.tensor([30.0, -30.0, math.inf, -math.inf])
    initial = torch.randn(2, 3, 4, 1, dtype=f64, generator=g) * 1e5
    scale = math.pi * dt.double()
    with torch.no_grad():
        got = module._tanh_angle_sums(scale, w, initial)
        apart = module._angle_sums(scale * module._wide_tanh(w.double()), initial)
    assert all(torch.equal(a, b) for a, b in zip(got, apart))
    sums = torch.cat([initial[:, None], scale * torch.tanh(w.double())], 1).cumsum(1)
    assert (got[0] - sums[:, :-1]).abs().max() < 1e-12 * 1e5
    assert (got[1] - sums[:, 1:]).abs().max() < 1e-12 * 1e5
    assert torch.equal(got[2], got[1][:, -1])
    ends = (got[1] - got[0])[0, :4, 0, 0, 0]
    want = scale[0, :4, 0, 0, 0] * torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=f64)
    assert (ends - want).abs().max() < 1e-9  # a difference of two sums of some 1e5


#: Each a plausible slip in writing Mamba-3, which the reference tells apart.
MUTANTS = {
    "the turn on C only": (
        "turn(B_{t-1} + B_bias, Th_{t-1})^T + lam_t dt_t x_t turn(B_t + B_bias, Th_t)^T",
        "(B_{t-1} + B_bias)^T + lam_t dt_t x_t (B_t + B_bias)^T",
    ),
    "the angle read a token late": (
        "turn(B_t + B_bias, Th_t)^T\ny_t = (H_t turn(C_t + C_bias, Th_t)",
        "turn(B_t + B_bias, Th_{t-1})^T\ny_t = (H_t turn(C_t + C_bias, Th_{t-1})",
    ),
    "half-split pairs": (
        "= rotate_interleaved(u, angle)",
        "= rotate(u, angle)",
    ),
}


@pytest.mark.parametrize("name", list(MUTANTS))
def test_mutants_disagree_with_the_reference(name):
    args = _inputs()
    want, _ = reference(*args.values())
    check_mutant_disagrees(SPEC, *MUTANTS[name], args, want)
