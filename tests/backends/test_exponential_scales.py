"""Exponential write scales (mLSTM's exp(i_t)): the chunked form carries the scale in log space
(xLSTM's max-stabiliser), so its output stays finite and accurate where exp(i_t) overflows a
float32, checked against the float64 oracle."""

from __future__ import annotations

from pathlib import Path

import torch

import mixc
from mixc.check.fuzz import FACTOR, TOLERANCE
from mixc.oracle.interpret import interpret
from tests.mixers import positional, rel, spec_inputs

MLSTM = Path(__file__).parents[2] / "specs/mlstm.mix"


def test_the_plan_carries_the_write_scale_in_log_space_for_a_ratio_only():
    plan = mixc.analyze(mixc.load_spec(MLSTM))
    (group,) = plan.groups
    assert group.states == ("H", "n") and str(group.log_scale) == "i_t"
    assert str(plan.outputs[0].scaled) == "_r0 / max(abs(_r1), _unscale_H)"
    assert "no quadratic form with a stabiliser" in plan.forms.parallel.text
    linear = mixc.Source(MLSTM.read_text().replace("/ max(", "* max("))
    plain = mixc.analyze(mixc.load_spec(linear))
    assert plain.groups[0].log_scale is None and plain.outputs[0].scaled is None


def _loss_and_grads(y, cot, leaves):
    loss = (y.double() * cot).sum()
    return torch.autograd.grad(loss, leaves)


def test_chunk_stays_finite_and_accurate_for_input_gates_up_to_200():
    spec, module = mixc.load_spec(MLSTM), mixc.load(MLSTM)
    gen = torch.Generator().manual_seed(11)
    B, T, NH = 2, 70, 2
    inputs, _ = spec_inputs(spec, B=B, T=T, NH=NH, generator=gen)
    big = torch.rand(B, T, NH, generator=gen, dtype=torch.float64) < 0.5
    inputs["i"] = torch.where(big, 200 * torch.rand(B, T, NH, generator=gen), inputs["i"])
    inputs["i"][:, 3] = 200.0  # exp(200) ~ 7e86: far past float32's 3.4e38
    low = {n: x.float().requires_grad_(True) for n, x in inputs.items()}
    ref_in = {n: x.detach().double().requires_grad_(True) for n, x in low.items()}
    want = interpret(spec, ref_in)[0]["y"]
    cot = torch.randn(want.shape, generator=gen, dtype=torch.float64)
    want_grads = _loss_and_grads(want, cot, list(ref_in.values()))
    # the fuzzer's rule (mixc.check.fuzz): the fixed float32 bounds, raised to FACTOR times the
    # oracle's own change when every input moves by one float32 rounding, the largest of four
    # random directions. Inputs up to 200 make this example ill-conditioned: one rounding of
    # i_t = 200 moves exp(i_t) by 1.2e-5, and some directions move the gradients by 8e-4.
    eps = torch.finfo(torch.float32).eps / 2
    fixed, fixed_grad = TOLERANCE[torch.float32]
    bound, grad_bounds = fixed, [fixed_grad] * len(ref_in)
    for _ in range(4):
        nudged = {
            n: (x.detach() * (1 + eps * torch.randn(x.shape, generator=gen))).requires_grad_(True)
            for n, x in ref_in.items()
        }
        moved = interpret(spec, nudged)[0]["y"]
        moved_grads = _loss_and_grads(moved, cot, list(nudged.values()))
        bound = max(bound, FACTOR * rel(moved, want))
        grad_bounds = [
            max(most, FACTOR * rel(m, r))
            for most, m, r in zip(grad_bounds, moved_grads, want_grads, strict=True)
        ]
    # the example is not so ill-conditioned that anything passes: a stabiliser that is off by
    # a token or a factor moves the output by its own size, and an unstabilised one overflows
    assert bound < 1e-2 and max(grad_bounds) < 1e-2
    for chunk_size in (8, 64):
        y, _ = module.chunk(*positional(spec, low, {}), chunk_size=chunk_size)
        assert torch.isfinite(y).all()
        assert rel(y.double(), want) <= bound, (chunk_size, rel(y.double(), want), bound)
        grads = _loss_and_grads(y, cot, list(low.values()))
        for name, got, ref, most in zip(low, grads, want_grads, grad_bounds, strict=True):
            assert torch.isfinite(got).all(), name
            assert rel(got.double(), ref) <= most, (chunk_size, name, rel(got.double(), ref))
    # without the stabiliser the same float32 computation is not finite: the recurrence
    y, _ = module.recurrent(*positional(spec, {n: x.detach() for n, x in low.items()}, {}))
    assert not torch.isfinite(y).all()
