"""Every compiled form against the float64 step-by-step oracle (mixc.oracle.interpret), which is
itself checked against hand-written loops of each mixer in test_interpret.py.

Outputs, final states and gradients of every input, parameter and initial state; fp32 within
a relative RMS error of 1e-5, for T in {1, 7, 64, 68}, several chunk sizes, with and without
an initial state.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mixc
from mixc.check.fuzz import reference
from mixc.check.tolerance import NEAR_ZERO
from mixc.errors import Source
from mixc.oracle.interpret import interpret
from tests.mixers import VARIANTS, positional, random_states, rel, spec_inputs

SPECS = sorted(Path(__file__).parents[2].glob("specs/*.mix"))
CASES = [pytest.param(p, id=p.stem) for p in SPECS] + [
    pytest.param(Source(text), id=name) for name, text in VARIANTS.items()
]
FP32 = 1e-5


def _oracle(spec, inputs, params, states, cot_y, cot_s):
    ref = reference(spec, inputs, params, states, cot_y, cot_s)
    return ref.y, ref.finals, ref.grads


def _run(form, spec, inputs, params, states, cot_y, cot_s, dtype, **kw):
    leaves = {
        n: x.detach().to(dtype).requires_grad_(True)
        for n, x in {**inputs, **params, **states}.items()
    }
    args = positional(spec, {n: leaves[n] for n in inputs}, {n: leaves[n] for n in params})
    init = tuple(leaves[s.name] for s in spec.mixer.carried) if states else None
    if len(spec.mixer.carried) == 1 and init is not None:
        init = init[0]
    y, final = form(args, init, **kw)
    finals = final if isinstance(final, tuple) else (final,) if final is not None else ()
    finals = dict(zip([s.name for s in spec.mixer.carried], finals))
    loss = (y.double() * cot_y).sum() + sum((finals[n].double() * cot_s[n]).sum() for n in finals)
    grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    return y, finals, dict(zip(leaves, grads))


def _chunk(module, chunk_size):
    def form(args, init):
        return module.chunk(
            *args, initial_state=init, output_final_state=True, chunk_size=chunk_size
        )

    return form


def _recurrent(module):
    def form(args, init):
        return module.recurrent(*args, initial_state=init, output_final_state=True)

    return form


def _step_loop(module):
    def form(args, init):
        T = args[0].shape[1]
        state, ys = init, []
        for t in range(T):
            step_args = [a[:, t] if i < n_inputs else a for i, a in enumerate(args)]
            y, state = module.step(*step_args, state=state)
            ys.append(y)
        return torch.stack(ys, 1), state

    n_inputs = len(module.INPUTS)
    return form


def _assert_close(got, ref, what, tol):
    y, finals, grads = got
    ry, rfinals, rgrads = ref
    # a gradient below NEAR_ZERO of the example's largest (one that vanishes analytically, as
    # an angle turning every key and query alike at one token: Mamba-3 MIMO's) is measured
    # against that floor, as mixc fuzz measures it: its float32 value is the difference of
    # halves of the example's size, each rounded
    scale = max((g.double().norm() / max(g.numel(), 1) ** 0.5).item() for g in rgrads.values())
    assert y.shape == ry.shape, f"{what}: output shape {tuple(y.shape)} vs {tuple(ry.shape)}"
    assert rel(y, ry) <= tol, f"{what}: output rel err {rel(y, ry):.2e}"
    for n in rfinals:
        assert rel(finals[n], rfinals[n]) <= tol, (
            f"{what}: final {n} rel err {rel(finals[n], rfinals[n]):.2e}"
        )
    for n, rg in rgrads.items():
        g = grads[n]
        if g is None:  # an input the form does not use: the oracle's gradient must be zero
            assert rg.abs().max() == 0, f"{what}: no gradient for {n}"
            continue
        assert torch.isfinite(g).all(), f"{what}: non-finite gradient for {n}"
        err = rel(g, rg, floor=NEAR_ZERO * scale)
        assert err <= tol * 10, f"{what}: grad {n} rel err {err:.2e}"


@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "initial-state"])
#: T = 68: whole chunks of 4, two chunks of 64 and five of 16 with a partial last one (as
#: T = 100 did, in two thirds of its time: the oracle, step loop and recurrence run per token)
@pytest.mark.parametrize("T", [1, 7, pytest.param(64, marks=pytest.mark.slow), 68])
@pytest.mark.parametrize("spec_src", CASES)
def test_forms_match_oracle(spec_src, T, with_state):
    spec = mixc.load_spec(spec_src)
    module = mixc.load(spec_src)
    gen = torch.Generator().manual_seed(T * 2 + with_state)
    inputs, params = spec_inputs(spec, T=T, generator=gen)
    states = random_states(spec, generator=gen) if with_state else {}
    # the shapes of the cotangents: the oracle's on the first token, the output's T tokens long
    outputs, finals = interpret(spec, {n: x[:, :1] for n, x in inputs.items()}, params)
    y_first = outputs[spec.mixer.outputs[0].target]
    cot_y = torch.randn(y_first.shape[0], T, *y_first.shape[2:], dtype=torch.float64, generator=gen)
    cot_s = {
        s: torch.randn(*x.shape, dtype=torch.float64, generator=gen) for s, x in finals.items()
    }
    ref = _oracle(spec, inputs, params, states, cot_y, cot_s)

    forms = {"recurrent": _recurrent(module)}
    if "step" in module.FORMS:  # a non-causal mixer has none
        forms["step"] = _step_loop(module)
    if "chunk" in module.FORMS:
        for cs in (4, 16, 64) if T in (7, 68) else (16,):
            forms[f"chunk{cs}"] = _chunk(module, cs)
    for name, form in forms.items():
        got = _run(form, spec, inputs, params, states, cot_y, cot_s, torch.float32)
        _assert_close(got, ref, name, FP32)
    if hasattr(module, "parallel") and not with_state:
        no_cot = {n: torch.zeros_like(c) for n, c in cot_s.items()}
        ref = _oracle(spec, inputs, params, {}, cot_y, no_cot)
        got = _run(
            lambda a, i: module.parallel(*a), spec, inputs, params, {}, cot_y, {}, torch.float32
        )
        _assert_close(got, (ref[0], {}, ref[2]), "parallel", FP32)
