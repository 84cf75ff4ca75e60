"""Decays of exactly 0 written as a product (`gamma H`, `a_t H`, `H diag(a_t)`): their log-gate
is log(0) = -inf, at which the chunked and parallel gradients were 0 * inf (NaN or inf) where the
recurrence's are finite. Every form is compared, gradients included, with the float64 oracle, as
in test_compile.py."""

from __future__ import annotations

import pytest
import torch

import mixc
from mixc.oracle.interpret import interpret
from tests.backends.test_compile import FP32, _assert_close, _oracle
from tests.mixers import random_states, spec_inputs

RETNET_ZERO_HEAD = """
mixer retnet_zero_head
in    q[K], k[K], v[V]
param gamma = 1 - 2^(-h)
state H[V, K]
H_t = gamma H_{t-1} + v_t k_t^T
y_t = H_t q_t
"""
GATED_INPUT = """
mixer gated_input
in    q[K], k[K], v[V], a
state H[V, K]
H_t = a_t H_{t-1} + v_t k_t^T
y_t = H_t q_t
"""
GLA_INPUT = """
mixer gla_input
in    q[K], k[K], v[V], a[K]
state H[V, K]
H_t = H_{t-1} diag(a_t) + v_t k_t^T
y_t = H_t q_t
"""
GATED_DELTA_INPUT = """
mixer gated_delta_input
in    q[K], k[K], v[V], a, beta
state H[V, K]
H_t = a_t H_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T
y_t = H_t q_t
"""


def _zero_decays(name, inputs, params):
    """The arguments with decays of exactly 0: a head's gamma, or a at a few tokens (and, for a
    per-channel gate, in one channel only)."""
    if name in ("retnet", "retnet_zero_head"):
        heads = inputs["q"].shape[2]
        gamma = 1 - 2.0 ** -torch.arange(heads, dtype=torch.float64)  # 0, 1/2, 3/4
        return inputs, {**params, "gamma": gamma}
    a = inputs["a"].clone()
    if a.dim() == 4:
        a[:, 2, :, 1] = 0
        a[0, 5, 1, 0] = 0
    else:
        a[:, 2] = 0
        a[0, 5, 1] = 0
    return {**inputs, "a": a}, params


CASES = {
    "retnet": "specs/retnet.mix",
    "retnet_zero_head": mixc.Source(RETNET_ZERO_HEAD),
    "gated_input": mixc.Source(GATED_INPUT),
    "gla_input": mixc.Source(GLA_INPUT),
    "gated_delta_input": mixc.Source(GATED_DELTA_INPUT),
}


def _forms(module, with_state):
    """Every form as (inputs and required parameters, initial state, defaulted parameters by
    name) -> (y, final state or None)."""
    n_in = len(module.INPUTS)

    def steps(args, init, **defaults):
        state, ys = init, []
        for t in range(args[0].shape[1]):
            y, state = module.step(
                *[a[:, t] for a in args[:n_in]], *args[n_in:], state=state, **defaults
            )
            ys.append(y)
        return torch.stack(ys, 1), state

    forms = {
        "recurrent": lambda args, init, **kw: module.recurrent(
            *args, initial_state=init, output_final_state=True, **kw
        ),
        "step": steps,
    }
    for size in (2, 4, 16):
        forms[f"chunk{size}"] = lambda args, init, size=size, **kw: module.chunk(
            *args, initial_state=init, output_final_state=True, chunk_size=size, **kw
        )
    if "parallel" in module.FORMS and not with_state:
        forms["parallel"] = lambda args, init, **kw: module.parallel(*args, **kw)
    return forms


def _run(form, spec, inputs, params, states, cot_y, cot_s):
    """fp32 (y, final states, gradients of every input, parameter and state by name)."""
    leaves = {
        n: x.detach().float().requires_grad_(True)
        for n, x in {**inputs, **params, **states}.items()
    }
    defaulted = {p.name for p in spec.mixer.params if p.default is not None}
    args = [leaves[d.name] for d in spec.mixer.inputs]
    args += [leaves[p.name] for p in spec.mixer.params if p.name not in defaulted]
    init = tuple(leaves[s.name] for s in spec.mixer.states) if states else None
    y, final = form(
        args, init[0] if init else None, **{n: leaves[n] for n in defaulted & set(leaves)}
    )
    finals = {} if final is None else {spec.mixer.states[0].name: final}
    loss = (y.double() * cot_y).sum() + sum((finals[n].double() * cot_s[n]).sum() for n in finals)
    grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    return y, finals, dict(zip(leaves, grads))


@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "initial-state"])
@pytest.mark.parametrize("name", CASES)
def test_a_decay_of_zero_has_the_recurrence_gradient_in_every_form(name, with_state):
    source = CASES[name]
    spec, module = mixc.load_spec(source), mixc.load(source)
    gen = torch.Generator().manual_seed(3)
    inputs, params = _zero_decays(name, *spec_inputs(spec, T=9, generator=gen))
    states = random_states(spec, generator=gen) if with_state else {}
    outputs, finals = interpret(spec, inputs, params)
    cot_y = torch.randn(
        *outputs[spec.mixer.outputs[0].target].shape, dtype=torch.float64, generator=gen
    )
    cot_s = {
        n: torch.randn(*x.shape, dtype=torch.float64, generator=gen) for n, x in finals.items()
    }
    for form_name, form in _forms(module, with_state).items():
        own_s = {} if form_name == "parallel" else cot_s
        ref = _oracle(
            spec, inputs, params, states, cot_y, {n: 0 * c for n, c in cot_s.items()} | own_s
        )
        got = _run(form, spec, inputs, params, states, cot_y, own_s)
        _assert_close(got, ref if own_s else (ref[0], {}, ref[2]), form_name, FP32)
