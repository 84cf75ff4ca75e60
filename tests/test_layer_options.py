"""MixerLayer's options as fla's layers have them: grouped value heads (num_v_heads) and a value
expansion (expand_v) in every form and in the cache; the form asked for (mode); roles(path)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

import mixc
from mixc.errors import Source
from mixc.layer_checks import value_symbols
from mixc.nn import MixerLayer, roles
from tests.mixers import rel

ROOT = Path(__file__).parent.parent
GROUPED = ["gated_deltanet", "mamba2", "kda", "mlstm"]


def _states(cache) -> tuple[torch.Tensor, ...]:
    return cache.states if isinstance(cache.states, tuple) else (cache.states,)


def _ungrouped(layer: MixerLayer) -> MixerLayer:
    """The reference: a layer of num_v_heads query and key heads, each a copy of the shared
    head of its group (projection rows and convolution filters repeated), every other weight
    the grouped layer's."""
    spec = layer.spec
    other = MixerLayer(
        spec, layer.hidden_size, layer.num_v_heads, sizes=dict(layer.sizes), chunk_size=4
    ).double()
    group = layer.num_v_heads // layer.num_heads
    state = {}
    for key, value in layer.state_dict().items():
        name = key.split(".")[1] if key.startswith(("proj.", "conv.")) else None
        if name in layer.roles.keys:
            heads = value.reshape(layer.num_heads, -1, *value.shape[1:])
            value = heads.repeat_interleave(group, 0).reshape(-1, *value.shape[1:])
        state[key] = value
    other.load_state_dict(state)
    return other


@pytest.mark.parametrize("name", GROUPED)
def test_grouped_value_heads_agree_in_every_form_and_with_repeated_heads(name):
    torch.manual_seed(0)
    path = ROOT / f"specs/{name}.mix"
    layer = MixerLayer(path, 16, 2, num_v_heads=4, expand_v=2, chunk_size=4).double()
    assert layer.num_v_heads == 4 and layer.sizes[value_symbols(layer.spec)[0]] == 16
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    y, cache = layer(x, use_cache=True)
    assert _states(cache)[0].shape[1] == 4  # a state per value head
    recurrent = MixerLayer(path, 16, 2, num_v_heads=4, expand_v=2, mode="recurrent").double()
    recurrent.load_state_dict(layer.state_dict())
    assert rel(recurrent(x)[0], y) <= 1e-12
    pieces, state = [], None  # the cache: token by token
    for t in range(11):
        y_t, state = layer(x[:, t : t + 1], state=state, use_cache=True)
        pieces.append(y_t)
    assert rel(torch.cat(pieces, 1), y) <= 1e-12
    assert all(rel(a, b) <= 1e-12 for a, b in zip(_states(state), _states(cache)))
    assert rel(_ungrouped(layer)(x)[0], y) <= 1e-12


def test_the_shared_inputs_are_the_queries_and_keys():
    assert roles(ROOT / "specs/gated_deltanet.mix").keys == {"q", "k"}
    assert roles(ROOT / "specs/mamba2.mix").keys == {"B", "C"}
    assert roles(ROOT / "specs/hgrn.mix").keys == frozenset()  # nothing to share
    layer = MixerLayer(ROOT / "specs/mamba2.mix", 16, 2, num_v_heads=6)
    widths = {name: p.out_features for name, p in layer.proj.items()}
    assert widths == {"x": 6 * 8, "dt": 6, "B": 2 * 8, "C": 2 * 8}


@pytest.mark.parametrize(
    "change,message",
    [
        ({"num_v_heads": 3}, r"^num_v_heads: expected a multiple of num_heads = 2 \(each query"),
        ({"num_v_heads": 0}, r"^num_v_heads: expected a positive int, got 0$"),
        ({"expand_v": 0}, r"^expand_v: expected a positive number, got 0$"),
        ({"expand_v": 1.3}, r"^expand_v: V = 8 x 1.3 = 10.4 is not a whole number$"),
        ({"expand_v": 2, "sizes": {"V": 8}}, r"^expand_v: gla's value sizes \(V\) are all given"),
        ({"mode": "fast"}, r"^mode: expected one of 'auto', 'chunk', 'recurrent', got 'fast'$"),
    ],
    ids=["not a multiple", "zero heads", "zero expand", "fraction", "sizes given", "mode"],
)
def test_bad_head_and_mode_arguments_are_named(change, message):
    with pytest.raises(mixc.MixcError, match=message):
        MixerLayer(ROOT / "specs/gla.mix", 16, 2, **change)


def test_expand_v_widens_the_values_only():
    layer = MixerLayer(ROOT / "specs/gla.mix", 16, 2, expand_v=1.5)
    assert layer.sizes == {"K": 8, "V": 12}
    assert layer.out_proj.in_features == 2 * 12


#: A spec with no chunked form (its state goes through tanh); its name is this file's alone,
#: so that no other test has warned about it first.
SEQUENTIAL = (
    "mixer squash_layer_options\nin q[K], k[K], v[V]\nstate H[V, K]\n"
    "H_t = tanh(H_{t-1}) + v_t k_t^T\ny_t = H_t q_t\n"
)


def test_mode_chunk_is_refused_with_the_reason_and_auto_warns_once():
    spec = Source(SEQUENTIAL, "squash.mix")
    with pytest.raises(mixc.MixcError) as error:
        MixerLayer(spec, 16, 2, mode="chunk")
    assert str(error.value).startswith(
        "mode='chunk': squash.mix: squash_layer_options has no chunked form (H: not affine: "
        "tanh(...) of a state"
    )
    assert "use mode='recurrent'" in str(error.value)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = MixerLayer(spec, 16, 2)  # auto: falls back to the token loop, says so once
        MixerLayer(spec, 16, 2)
        asked = MixerLayer(spec, 16, 2, mode="recurrent")
    assert [str(w.message).split(":")[0] for w in caught] == ["squash.mix"]
    assert "runs the token loop" in str(caught[0].message)
    assert first.mode == asked.mode == "recurrent"
    y, cache = first(torch.randn(1, 5, 16), use_cache=True)
    assert y.shape == (1, 5, 16) and cache is not None


def test_mode_recurrent_equals_chunk_for_a_chunked_spec():
    torch.manual_seed(0)
    layer = MixerLayer(ROOT / "specs/kda.mix", 16, 2, chunk_size=4, mode="chunk").double()
    loop = MixerLayer(ROOT / "specs/kda.mix", 16, 2, mode="recurrent").double()
    loop.load_state_dict(layer.state_dict())
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    assert layer.mode == "chunk" and loop.mode == "recurrent"
    assert rel(loop(x)[0], layer(x)[0]) <= 1e-12


def test_roles_takes_a_path_like_every_api():
    by_path = roles("specs/gated_deltanet.mix")
    assert by_path == roles(ROOT / "specs/gated_deltanet.mix")
    assert by_path == roles(mixc.load_spec(ROOT / "specs/gated_deltanet.mix"))
    assert by_path.transforms["k"] == ["silu", "l2norm"]
    with pytest.raises(mixc.MixcError, match=r"^specs/no_such_mixer\.mix: no such spec file$"):
        roles("specs/no_such_mixer.mix")
    with pytest.raises(mixc.MixcError, match=r"^spec: expected a spec path, a Source or a"):
        roles(3)
