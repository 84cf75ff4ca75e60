"""Per-token values read at t-1 (mixc.frontend.lags): `kn_{t-1}` for `kn_t = unit(k_t)` is the
value one token earlier, its equation on the previous token's inputs (and readouts: `o_{t-1}` for
`o_t = H1_t q_t` is `H1_{t-1} q_{t-1}`), carried as the inputs at t-1 are. Checked against a loop
written out by hand, the float64 oracle (every form, gradients, initial states, packed
sequences), prefill then step, and mutants that read the value at t."""

from __future__ import annotations

import pytest
import torch

import mixc
from mixc.check import fuzz
from mixc.oracle.interpret import interpret
from tests.mixers import positional, random_states, rel, spec_inputs

# a trapezoid-like write (Mamba-3's): the token's second write reads the previous token's unit key
TRAPEZOID = mixc.Source(
    "mixer trap_lag\nin q[K], k[K], v[V], g, l\nstate H[V, K]\nlet unit(x) = l2norm(x)\n"
    "kn_t = unit(k_t)\nlam_t = sigmoid(l_t)\nd_t = -softplus(g_t)\n"
    "H_t = exp(d_t) H_{t-1} + (1 - lam_t) v_{t-1} kn_{t-1}^T + lam_t v_t kn_t^T\ny_t = H_t q_t\n"
)
# a pipeline whose second state writes the first's readout of the previous token
READOUT = mixc.Source(
    "mixer lag_readout\nin q[K], k[K], v[V], g, u[K], q2[K]\nstate H1[V, K], H2[V, K]\n"
    "H1_t = exp(-softplus(g_t)) H1_{t-1} + v_t k_t^T\no_t = H1_t q_t\n"
    "H2_t = H2_{t-1} + o_{t-1} u_t^T\ny_t = H2_t q2_t\n"
)
B, T, NH, PREFILL = 2, 21, 2, 13


def test_a_value_at_t_minus_1_is_its_equation_one_token_earlier():
    written = mixc.load_spec(mixc.Source(TRAPEZOID.text.replace("kn_{t-1}", "unit(k_{t-1})")))
    spec = mixc.load_spec(TRAPEZOID)
    assert spec.mixer.update("H") == written.mixer.update("H")
    assert [d.name for d in spec.mixer.carried] == ["H", "k_{t-1}", "v_{t-1}"]
    # a value read only at t-1 is not left behind as an output
    readout = mixc.load_spec(READOUT)
    assert [e.target for e in readout.mixer.outputs] == ["y"]
    assert "H1_{t-1} q_{t-1}" in str(readout.mixer.update("H2"))


def _by_hand(inputs, states):
    """The trapezoid one (batch, head) at a time, from the carried previous k and v."""
    q, k, v, g, lg = (inputs[n] for n in ("q", "k", "v", "g", "l"))

    def unit(x):
        return x / torch.sqrt((x * x).sum() + 1e-6)

    ys = torch.zeros_like(v)
    for b in range(B):
        for h in range(NH):
            H, k_prev, v_prev = (states[n][b, h] for n in ("H", "k_{t-1}", "v_{t-1}"))
            for t in range(T):
                lam = torch.sigmoid(lg[b, t, h])
                decay = torch.exp(-torch.nn.functional.softplus(g[b, t, h]))
                H = (
                    decay * H
                    + (1 - lam) * torch.outer(v_prev, unit(k_prev))
                    + lam * torch.outer(v[b, t, h], unit(k[b, t, h]))
                )
                ys[b, t, h] = H @ q[b, t, h]
                k_prev, v_prev = k[b, t, h], v[b, t, h]
    return ys


def test_the_oracle_reads_the_value_one_token_back():
    spec = mixc.load_spec(TRAPEZOID)
    gen = torch.Generator().manual_seed(3)
    inputs, params = spec_inputs(spec, B=B, T=T, NH=NH, generator=gen)
    states = random_states(spec, B=B, NH=NH, generator=gen)
    out, _ = interpret(spec, inputs, params, states)
    assert rel(out["y"], _by_hand(inputs, states)) <= 1e-12


@pytest.mark.parametrize("source", [TRAPEZOID, READOUT], ids=["trapezoid", "readout"])
def test_every_form_agrees_with_the_oracle(source):
    for dtype, examples in (("float32", 6), ("float64", 2)):
        report = fuzz(mixc.load_spec(source), examples=examples, dtype=dtype)
        assert report.ok, report.failure.summary()


def test_prefill_with_chunk_then_step_equals_one_pass():
    spec, module = mixc.load_spec(TRAPEZOID), mixc.load(TRAPEZOID)
    gen = torch.Generator().manual_seed(4)
    inputs, params = spec_inputs(spec, B=B, T=T, NH=NH, generator=gen)
    states = random_states(spec, B=B, NH=NH, generator=gen)
    init = tuple(states[s.name] for s in spec.mixer.carried)
    args = positional(spec, inputs, params)
    n = len(spec.mixer.inputs)
    y, final = module.chunk(*args, initial_state=init, output_final_state=True, chunk_size=8)
    prefix = [a[:, :PREFILL] if i < n else a for i, a in enumerate(args)]
    ys, state = module.chunk(*prefix, initial_state=init, output_final_state=True, chunk_size=8)
    ys = [ys]
    for t in range(PREFILL, T):
        y_t, state = module.step(
            *[a[:, t] if i < n else a for i, a in enumerate(args)], state=state
        )
        ys.append(y_t[:, None])
    assert rel(torch.cat(ys, 1), y) <= 1e-12
    for got, want in zip(state, final, strict=True):
        assert rel(got, want) <= 1e-12


# the value read at t instead of t-1, in the chunked form and in the token loop
MUTANTS = [
    (
        "_k2_H = _seq_vector(_l2norm(_prev_k), _sizes, cu_seqlens)",
        "_k2_H = _seq_vector(_l2norm(k), _sizes, cu_seqlens)",
        {"chunk", "packed"},
    ),
    ("_unit_k = _l2norm(_prev_k)", "_unit_k = _l2norm(k_t)", {"recurrent", "step"}),
]


@pytest.mark.parametrize(("target", "replacement", "forms"), MUTANTS, ids=["chunk", "loop"])
def test_a_value_read_at_t_instead_of_t_minus_1_is_caught(tmp_path, target, replacement, forms):
    source = mixc.compile_source(TRAPEZOID)
    assert source.count(target) == 1, "the generated code changed"
    module = tmp_path / "trap_lag_mutant.py"
    module.write_text(source.replace(target, replacement))
    report = fuzz(mixc.load_spec(TRAPEZOID), module, examples=10, shrink=False)
    assert not report.ok
    assert report.failure.form in forms and report.failure.kind == "numerical"
