"""MixerLayer: every shipped spec as an nn.Module; cached decoding continues exactly; the demo."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
import torch

import mixc
from mixc.nn import MixerLayer
from tests.mixers import rel

ROOT = Path(__file__).parent.parent
SPECS = sorted(ROOT.glob("specs/*.mix"))


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_prefill_then_decode_equals_one_pass(path):
    torch.manual_seed(0)
    layer = MixerLayer(path, 32, 2, chunk_size=8).double()
    x = torch.randn(2, 21, 32, dtype=torch.float64)
    y, cache = layer(x, use_cache=True)
    y_head, state = layer(x[:, :13], use_cache=True)
    pieces = [y_head]
    for t in range(13, 21):
        y_t, state = layer(x[:, t : t + 1], state=state, use_cache=True)
        pieces.append(y_t)
    assert rel(torch.cat(pieces, 1), y) <= 1e-12
    final = cache.states if isinstance(cache.states, tuple) else (cache.states,)
    decoded = state.states if isinstance(state.states, tuple) else (state.states,)
    assert all(rel(a, b) <= 1e-12 for a, b in zip(decoded, final))
    y.square().mean().backward()
    grads = [p.grad for p in layer.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_state_dict_round_trip_and_dtype_moves():
    torch.manual_seed(0)
    layer = MixerLayer(ROOT / "specs/mamba2.mix", 32, 4)
    assert "A_log" in dict(layer.named_parameters()) and "dt_bias" in dict(layer.named_parameters())
    buffer = io.BytesIO()
    torch.save(layer.state_dict(), buffer)
    other = MixerLayer(ROOT / "specs/mamba2.mix", 32, 4)
    other.load_state_dict(torch.load(io.BytesIO(buffer.getvalue())))
    x = torch.randn(1, 9, 32)
    assert torch.equal(layer(x)[0], other(x)[0])
    y16, _ = layer.to(torch.bfloat16)(x.to(torch.bfloat16))
    assert y16.dtype == torch.bfloat16 and torch.isfinite(y16).all()


def test_overrides_and_errors():
    layer = MixerLayer(
        ROOT / "specs/deltanet.mix",
        32,
        2,
        sizes={"K": 8, "V": 24},
        transforms={"v": ["silu"]},
        conv_size=0,
        output_gate=False,
        norm=False,
    )
    assert layer.transforms == {
        "k": ["silu", "l2norm"],
        "q": ["silu", "l2norm"],
        "beta": ["sigmoid"],
        "v": ["silu"],
    }
    assert layer.proj["k"].out_features == 16 and layer.proj["v"].out_features == 48
    with pytest.raises(mixc.MixcError, match="sizes: P not in the spec"):
        MixerLayer(ROOT / "specs/deltanet.mix", 32, 2, sizes={"P": 4})
    with pytest.raises(mixc.MixcError, match="transforms: unknown 'tanhh'"):
        MixerLayer(ROOT / "specs/deltanet.mix", 32, 2, transforms={"q": ["tanhh"]})
    with pytest.raises(mixc.MixcError, match=r"x: expected \[B, T, 32\], got \[2, 5\]"):
        layer(torch.zeros(2, 5))


def test_layer_compiles_as_one_graph():
    torch.manual_seed(0)
    layer = MixerLayer(ROOT / "specs/gated_deltanet.mix", 32, 2, chunk_size=8)
    x = torch.randn(1, 12, 32)
    torch._dynamo.reset()
    y = torch.compile(layer, fullgraph=True, backend="aot_eager")(x)[0]
    assert rel(y, layer(x)[0]) <= 1e-6


def test_demo_runs_shortened():
    sys.path.insert(0, str(ROOT / "examples"))
    import train_demo

    result = train_demo.main(["--steps", "40", "--batch", "16"])
    assert result["cache_agreement"] == 1.0
    assert result["last_loss"] < result["first_loss"]
