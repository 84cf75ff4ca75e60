"""Inputs read at t-1 (a token shift): every form carries each lagged input's last token beside
the states, so a prefill with `chunk` followed by decoding with `step` equals one pass, and the
oracle agrees with a loop written out by hand."""

from __future__ import annotations

import pytest
import torch

import mixc
from mixc.oracle.interpret import interpret
from tests.mixers import VARIANTS, positional, random_states, rel, spec_inputs

SOURCE = mixc.Source(VARIANTS["token_shift"])
B, T, NH, PREFILL = 2, 23, 3, 15


def test_the_module_carries_each_lagged_input_after_the_states():
    module = mixc.load(SOURCE)
    carried = (("k_{t-1}", ("K",)), ("v_{t-1}", ("V",)), ("a_{t-1}", ()))
    assert module.STATES == (("H", ("V", "K")), *carried)
    assert "summary" not in module.FORMS
    spec = mixc.load_spec(SOURCE)
    with pytest.raises(mixc.MixcError, match=r"reads k_\{t-1\}, v_\{t-1\}, a_\{t-1\}"):
        module.summary(*positional(spec, *spec_inputs(spec, B=1, T=4, NH=1)))


def _by_hand(inputs, params, states):
    """H_t = sigmoid(a_t) H_{t-1} + v_t (mu * k_t + (1 - mu) * k_{t-1})^T,
    y_t = H_t q_t + sigmoid(a_{t-1}) v_{t-1}, one (batch, head) at a time."""
    q, k, v, a = (inputs[n] for n in "qkva")
    ys = torch.zeros_like(v)
    finals = {n: torch.zeros_like(x) for n, x in states.items()}
    names = ("H", "k_{t-1}", "v_{t-1}", "a_{t-1}")
    for b in range(B):
        for h in range(NH):
            H, k_prev, v_prev, a_prev = (states[n][b, h] for n in names)
            mu = params["mu"][h]
            for t in range(T):
                key = mu * k[b, t, h] + (1 - mu) * k_prev
                H = torch.sigmoid(a[b, t, h]) * H + torch.outer(v[b, t, h], key)
                ys[b, t, h] = H @ q[b, t, h] + torch.sigmoid(a_prev) * v_prev
                k_prev, v_prev, a_prev = k[b, t, h], v[b, t, h], a[b, t, h]
            for n, x in zip(names, (H, k_prev, v_prev, a_prev), strict=True):
                finals[n][b, h] = x
    return ys, finals


@pytest.mark.parametrize("with_state", [False, True])
def test_the_oracle_reads_each_input_one_token_back(with_state):
    spec = mixc.load_spec(SOURCE)
    gen = torch.Generator().manual_seed(5)
    inputs, params = spec_inputs(spec, B=B, T=T, NH=NH, generator=gen)
    states = random_states(spec, B=B, NH=NH, generator=gen)
    assert set(states) == {"H", "k_{t-1}", "v_{t-1}", "a_{t-1}"}
    if not with_state:
        states = {n: torch.zeros_like(x) for n, x in states.items()}
    out, finals = interpret(spec, inputs, params, states if with_state else None)
    ys, want = _by_hand(inputs, params, states)
    torch.testing.assert_close(out["y"], ys, rtol=1e-12, atol=1e-12)
    for n in want:
        torch.testing.assert_close(finals[n], want[n], rtol=1e-12, atol=1e-12)


def test_prefill_with_chunk_then_step_equals_one_pass():
    spec, module = mixc.load_spec(SOURCE), mixc.load(SOURCE)
    gen = torch.Generator().manual_seed(6)
    inputs, params = spec_inputs(spec, B=B, T=T, NH=NH, generator=gen)
    states = random_states(spec, B=B, NH=NH, generator=gen)
    init = tuple(states[s.name] for s in spec.mixer.carried)
    args = positional(spec, inputs, params)
    n = len(spec.mixer.inputs)

    out, finals = interpret(spec, inputs, params, states)
    y, final = module.chunk(*args, initial_state=init, output_final_state=True, chunk_size=8)
    assert rel(y, out["y"]) <= 1e-12
    for got, s in zip(final, spec.mixer.carried, strict=True):
        assert rel(got, finals[s.name]) <= 1e-12, s.name

    def decode(state):
        prefix = [a[:, :PREFILL] if i < n else a for i, a in enumerate(args)]
        y_pre, state = module.chunk(
            *prefix, initial_state=state, output_final_state=True, chunk_size=8
        )
        ys = [y_pre]
        for t in range(PREFILL, T):
            token = [a[:, t] if i < n else a for i, a in enumerate(args)]
            y_t, state = module.step(*token, state=state)
            ys.append(y_t[:, None])
        return torch.cat(ys, 1), state

    y2, final2 = decode(init)
    assert rel(y2, y) <= 1e-12
    for got, want in zip(final2, final, strict=True):
        assert rel(got, want) <= 1e-12

    # the carried tokens matter: forgetting them after the prefill changes the next output
    prefix = [a[:, :PREFILL] if i < n else a for i, a in enumerate(args)]
    _, state = module.chunk(*prefix, initial_state=init, output_final_state=True, chunk_size=8)
    state = (state[0], *(torch.zeros_like(x) for x in state[1:]))
    y_t, _ = module.step(*[a[:, PREFILL] if i < n else a for i, a in enumerate(args)], state=state)
    assert rel(y_t, y[:, PREFILL]) > 1e-3


def test_a_layer_caches_the_lagged_inputs():
    from mixc.nn import MixerLayer

    torch.manual_seed(0)
    layer = MixerLayer(SOURCE, hidden_size=32, num_heads=2).double()
    x = torch.randn(2, 11, 32, dtype=torch.float64)
    y, _ = layer(x)
    y_pre, cache = layer(x[:, :6], use_cache=True)
    ys = [y_pre]
    for t in range(6, 11):
        y_t, cache = layer(x[:, t : t + 1], state=cache, use_cache=True)
        ys.append(y_t)
    assert rel(torch.cat(ys, 1), y) <= 1e-12


LAGGED_GATE = mixc.Source(
    "mixer lagged_gate\nin q[K], k[K], v[V], a\nstate H[V, K]\n"
    "H_t = sigmoid(a_{t-1}) H_{t-1} + v_t k_t^T\ny_t = H_t q_t\n"
)


@pytest.mark.parametrize("form", ["chunk", "parallel"])
def test_a_gate_of_a_lagged_input_reads_it_one_token_back(form):
    """The kernels' gate arguments read a_{t-1} as the other sequence expressions do (the
    shifted input), not a_t."""
    spec, module = mixc.load_spec(LAGGED_GATE), mixc.load(LAGGED_GATE)
    gen = torch.Generator().manual_seed(7)
    inputs, params = spec_inputs(spec, B=B, T=T, NH=NH, generator=gen)
    out, _ = interpret(spec, inputs, params, None)
    args = positional(spec, inputs, params)
    y = module.chunk(*args, chunk_size=8)[0] if form == "chunk" else module.parallel(*args)[0]
    assert rel(y, out["y"]) <= 1e-12
