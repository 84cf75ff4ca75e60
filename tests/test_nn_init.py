"""MixerLayer's defaults at initialisation, for every shipped spec and for random specs of every
class: outputs and gradients are finite over 8192 tokens of random input, and the state's memory
spans the sequence (what a token 64 steps back contributes is not forgotten)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from mixc.check.random_specs import GATE_FORMS, random_specs
from mixc.frontend.spec import load_spec
from mixc.nn import MixerLayer

ROOT = Path(__file__).parent.parent
SPECS = sorted(ROOT.glob("specs/*.mix"))


def _finite_at_init(spec, T: int = 8192) -> None:
    """Outputs and every parameter's gradient are finite for T tokens of N(0, 1) input (1024
    for a spec without a chunked form: its recurrent form is a Python loop over tokens)."""
    torch.manual_seed(0)
    layer = MixerLayer(spec, 16, 2)
    T = T if "chunk" in layer.mixer.FORMS else min(T, 1024)
    y, _ = layer(torch.randn(1, T, 16))
    assert torch.isfinite(y).all()
    y.square().mean().backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def _memory_at_init(spec, back: int = 64) -> float:
    """How much the last output depends on the input `back` tokens before it, relative to the
    input 8 tokens before it (gradient norms; both reach it through the state only, past the
    convolution's window): a decay near 0.5, the old default, gives 0.5^56 ~ 1e-17; decays that
    start near 1 keep it near 1."""
    torch.manual_seed(0)
    layer = MixerLayer(spec, 32, 4).double()
    x = torch.randn(1, 2 * back, 32, dtype=torch.float64, requires_grad=True)
    y, _ = layer(x)
    y[0, -1].square().sum().backward()
    g = x.grad[0].norm(dim=-1)
    return (g[-1 - back] / g[-9]).item()


#: Shipped specs known to forget faster at init than the test asks, and why.
FORGETFUL: dict[str, str] = {}


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(
            p, marks=pytest.mark.xfail(reason=FORGETFUL[p.stem], strict=True, raises=AssertionError)
        )
        if p.stem in FORGETFUL
        else p
        for p in SPECS
    ],
    ids=[p.stem for p in SPECS],
)
def test_shipped_specs_are_finite_and_remember_at_init(path):
    _finite_at_init(path)
    assert _memory_at_init(path) >= 1e-3


def test_erase_strengths_start_at_one_half():
    """The erase strength each layer starts with, computed by hand from its bias (as the spec
    writes it): 0.5 for gated DeltaNet's sigmoid(beta) and for DeltaProduct's 2 sigmoid(b)
    (whose b then starts near logit(1/4)), so that two erases a token keep a memory."""
    torch.manual_seed(0)
    x = torch.randn(2, 64, 32)
    gdn = MixerLayer(ROOT / "specs/gated_deltanet.mix", 32, 4)
    beta = torch.sigmoid(gdn.bias["beta"])
    assert beta.eq(0.5).all()
    product = MixerLayer(ROOT / "specs/deltaproduct.mix", 32, 4)
    for name in ("b1", "b2"):
        start = 2 * torch.sigmoid(product.bias[name])
        assert ((start - 0.5).abs() < 0.01).all(), name
        # and what the layer feeds the mixer, with the projection of x added, centres on it
        b = 2 * torch.sigmoid(product.proj[name](x).view(2, 64, 4) + product.bias[name])
        assert 0.4 < b.median() < 0.6


#: A vector gate times a full gate: one bias shared by a_t and G_t starts this decay at most
#: sigmoid(x) sigmoid(-x) <= 1/4 for every x, so `start_decays` solves them one at a time.
#: Found when the value-side class's random form changed the derandomized draws.
FORGETFUL_SPEC = """mixer mix
in    q[K]
in    k[K], v[V], G[V, K], a[V]
state H[V, K]
H_t = exp(-softplus(a_t)) ⊙ G_t ⊙ H_{t-1} + v_t k_t^T
y_t = H_t q_t
"""


def test_a_vector_gate_times_a_full_gate_remembers_at_init():
    spec = load_spec(text=FORGETFUL_SPEC)
    _finite_at_init(spec)
    assert _memory_at_init(spec) >= 1e-3


@settings(max_examples=12, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(random_specs(GATE_FORMS))
def test_random_specs_are_finite_and_remember_at_init(text):
    spec = load_spec(text=text)
    _finite_at_init(spec)
    assert _memory_at_init(spec) >= 1e-3


def test_decays_start_slow_in_the_shipped_layers():
    """The decay each shipped layer starts with, computed by hand from its parameters (as the
    spec writes it), lies in (0.9, 1): memories of tens to hundreds of tokens."""
    torch.manual_seed(0)
    x = torch.randn(2, 64, 32)
    gla = MixerLayer(ROOT / "specs/gla.mix", 32, 4)
    g = torch.nn.functional.logsigmoid(gla.proj["g"](x).view(2, 64, 4, 8) + gla.bias["g"])
    retention = MixerLayer(ROOT / "specs/gated_retention.mix", 32, 4)
    a = torch.sigmoid(retention.proj["a"](x).view(2, 64, 4) + retention.bias["a"])
    mamba = MixerLayer(ROOT / "specs/mamba2.mix", 32, 4)
    dt = torch.nn.functional.softplus(mamba.proj["dt"](x).view(2, 64, 4) + mamba.bias["dt"])
    A = -torch.exp(mamba.params["A_log"])
    assert ((1 <= -A) & (-A <= 16)).all()  # Mamba-2's A_log ~ log U(1, 16)
    assert mamba.params["D"].eq(1).all()
    for decay in (g.exp(), a, torch.exp(dt * A)):
        assert 0.9 < decay.median() < 1 and decay.max() < 1


@pytest.mark.parametrize(
    "text",
    [
        "mixer temp\nin q[K], k[K], v[V]\nparam tau\nstate H[V, K]\n"
        "H_t = H_{t-1} + v_t k_t^T\ny_t = H_t q_t / tau\n",
        "mixer scan\nin x[P], dt, B[N], C[N]\nparam Alpha[P, N], D\nstate H[P, N]\n"
        "H_t = exp(dt_t Alpha) * H_{t-1} + dt_t x_t B_t^T\ny_t = H_t C_t + D x_t\n",
        "mixer raw\nin q[K], k[K], v[V]\nparam lam, eta\nstate H[V, K]\n"
        "H_t = lam H_{t-1} + eta v_t k_t^T\ny_t = H_t q_t\n",
    ],
    ids=["temperature", "shaped rate", "raw decay"],
)
def test_parameters_start_by_their_role(text):
    """A temperature starts at 1 and stays positive; a shaped rate beside an input starts with
    magnitudes in [1, 16] whatever its name; a decay of parameters alone starts near 1; a
    write scale starts at 1 (0 would silence the state)."""
    torch.manual_seed(0)
    layer = MixerLayer(load_spec(text=text), 32, 4)
    values = layer.param_values()
    if "tau" in values:
        assert values["tau"].eq(1).all() and "tau_log" in layer.params
    if "Alpha" in values:
        assert ((values["Alpha"] <= -1) & (values["Alpha"] >= -16)).all()
        assert values["D"].eq(1).all()
    if "lam" in values:
        assert ((0.9 < values["lam"]) & (values["lam"] < 1)).all()
        assert values["eta"].eq(1).all()
    _finite_at_init(load_spec(text=text), T=1024)
    assert _memory_at_init(load_spec(text=text)) >= 1e-3


def test_a_codebook_starts_with_rows_that_differ_and_learns():
    """Transformer-VQ's codebook C [S, K] (read inside a softmax under a divisor, and by the
    arg max) starts as a random matrix: with equal rows (all ones, or exp(0) as a positive
    parameter) every key picks the same code and C's gradient is rounding noise."""
    torch.manual_seed(0)
    layer = MixerLayer(ROOT / "specs/transformer_vq.mix", 32, 2)
    C = layer.param_values()["C"]
    assert "C" in layer.params  # stored as it is, not as a log
    assert (C[:, 1:] - C[:, :1]).abs().amax() > 0.1  # rows differ
    y, _ = layer(torch.randn(2, 16, 32))
    y.square().sum().backward()
    grads = {n: p.grad.abs().max().item() for n, p in layer.named_parameters()}
    assert grads["params.C"] > 1e-3 * max(grads.values())
