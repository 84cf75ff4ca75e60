"""MixerLayer: every shipped spec as an nn.Module; cached decoding continues exactly; the demo."""

from __future__ import annotations

import copy
import io
import pickle
import sys
from pathlib import Path

import pytest
import torch

import mixc
from mixc.nn import MixerCache, MixerLayer
from tests.mixers import rel

ROOT = Path(__file__).parent.parent
SPECS = sorted(ROOT.glob("specs/*.mix"))
CAUSAL = [p for p in SPECS if mixc.load_spec(p).mixer.causal]
NON_CAUSAL = [p for p in SPECS if p not in CAUSAL]


@pytest.mark.parametrize("path", CAUSAL, ids=[p.stem for p in CAUSAL])
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


@pytest.mark.parametrize("path", NON_CAUSAL, ids=[p.stem for p in NON_CAUSAL])
def test_a_non_causal_layer_sees_both_sides_and_has_no_cache(path):
    """Each output reads tokens before and after its own (the mixer's backward state, and the
    centred convolution), the layer keeps no cache, and its gradients are finite."""
    assert NON_CAUSAL, "no non-causal shipped spec"
    torch.manual_seed(0)
    layer = MixerLayer(path, 32, 2, chunk_size=8).double()
    x = torch.randn(2, 21, 32, dtype=torch.float64, requires_grad=True)
    y, cache = layer(x)
    assert cache is None
    (grad,) = torch.autograd.grad(y[:, 10].sum(), x, retain_graph=True)
    seen = grad.abs().sum((0, 2)) > 0  # which tokens output 10 depends on
    assert seen[:10].all() and seen[11:].all(), seen
    for call in (lambda: layer(x, use_cache=True), lambda: layer(x, state=object())):
        with pytest.raises(mixc.MixcError, match=r"is non-causal .* the layer has no cache"):
            call()
    y.square().mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())
    conv = next(iter(layer.conv.values()))  # centred: kernel 4 reads 1 token before, 2 after
    assert conv.kernel_size == (4,) and conv.padding == (0,)


def test_state_dict_round_trip_and_dtype_moves():
    torch.manual_seed(0)
    layer = MixerLayer(ROOT / "specs/mamba2.mix", 32, 4)
    names = dict(layer.named_parameters())
    assert "params.A_log" in names and "bias.dt" in names
    buffer = io.BytesIO()
    torch.save(layer.state_dict(), buffer)
    other = MixerLayer(ROOT / "specs/mamba2.mix", 32, 4)
    other.load_state_dict(torch.load(io.BytesIO(buffer.getvalue())))
    x = torch.randn(1, 9, 32)
    # the same weights, not always the same bits (a BLAS may take another path for tensors at
    # other addresses): within a few hundred float32 roundings; a lost weight moves y by its size
    torch.testing.assert_close(layer(x)[0], other(x)[0], rtol=1e-5, atol=1e-6)
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


DELTANET = ROOT / "specs/deltanet.mix"
BAD_LAYERS = [
    ({"num_heads": 0}, r"^num_heads: expected a positive int, got 0$"),
    ({"num_heads": 2.0}, r"^num_heads: expected a positive int, got 2\.0$"),
    ({"num_heads": True}, r"^num_heads: expected a positive int, got True$"),
    ({"hidden_size": 0}, r"^hidden_size: expected a positive int, got 0$"),
    ({"hidden_size": -32}, r"^hidden_size: expected a positive int, got -32$"),
    ({"hidden_size": 32.0}, r"^hidden_size: expected a positive int, got 32\.0$"),
    (
        {"hidden_size": 2, "num_heads": 4},
        r"^hidden_size: 2 is smaller than num_heads = 4: K, V would be 0; pass sizes=",
    ),
    (
        {"hidden_size": 100, "num_heads": 3},
        r"^hidden_size: 100 is not a multiple of num_heads = 3: K, V would be 33\.3333; pass",
    ),
    ({"sizes": {"K": -4}}, r"^sizes: K: expected a positive int, got -4$"),
    ({"sizes": {"K": 2.5}}, r"^sizes: K: expected a positive int, got 2\.5$"),
    ({"conv_size": -3}, r"^conv_size: expected an int >= 0, got -3$"),
    ({"chunk_size": 12}, r"^chunk_size: expected a power of two, got 12$"),
    ({"transforms": {"v": None}}, r"^transforms: v: expected a list of names, got None$"),
    ({"transforms": {"v": "silu"}}, r"^transforms: v: expected a list of names, got 'silu'$"),
    ({"transforms": ["silu"]}, r"^transforms: expected a dict of lists by input"),
    ({"conv_inputs": ["nope"]}, r"^conv_inputs: nope is not an input of deltanet; only vector"),
    ({"conv_inputs": ["beta"]}, r"^conv_inputs: beta is a per-token scalar of deltanet; only"),
    ({"conv_inputs": "qk"}, r"^conv_inputs: expected a list of names, got 'qk'$"),
]


@pytest.mark.parametrize("change,message", BAD_LAYERS, ids=[str(c) for c, _ in BAD_LAYERS])
def test_bad_layer_arguments_are_named(change, message):
    args = {"hidden_size": 32, "num_heads": 2} | change
    size, heads = args.pop("hidden_size"), args.pop("num_heads")
    with pytest.raises(mixc.MixcError, match=message):
        MixerLayer(DELTANET, size, heads, **args)


def test_sizes_given_for_every_symbol_need_no_whole_head_width():
    layer = MixerLayer(DELTANET, 100, 3, sizes={"K": 8, "V": 16})
    assert layer(torch.randn(1, 5, 100))[0].shape == (1, 5, 100)


def test_bad_layer_inputs_and_caches_are_named():
    torch.manual_seed(0)
    layer = MixerLayer(DELTANET, 32, 2, chunk_size=8)
    x = torch.randn(2, 5, 32)
    with pytest.raises(mixc.MixcError, match=r"^x: expected torch\.float32 like the layer's"):
        layer(x.double())
    with pytest.raises(mixc.MixcError, match=r"^x: expected torch\.float32 like the layer's"):
        layer(x.long())
    with pytest.raises(mixc.MixcError, match=r"^x: expected a torch\.Tensor, got list"):
        layer(x.tolist())
    with pytest.raises(mixc.MixcError, match=r"^x: the sequence is empty \(T = 0\)"):
        layer(x[:, :0])
    _, cache = layer(x, use_cache=True)
    with pytest.raises(mixc.MixcError, match=r"^state: the cache holds 2 sequences, x has B = 3"):
        layer(torch.randn(3, 1, 32), state=cache)
    with pytest.raises(mixc.MixcError, match=r"^state: expected the MixerCache of an earlier"):
        layer(x[:, :1], state=cache.states)
    twin = MixerLayer(DELTANET, 32, 2, chunk_size=8)  # a cache of the same shapes
    with pytest.raises(mixc.MixcError, match=r"^state: the cache is another layer's"):
        twin(x[:, :1], state=cache)
    for other in (
        MixerLayer(DELTANET, 32, 4),
        MixerLayer(DELTANET, 32, 2, conv_size=3),
        MixerLayer(ROOT / "specs/linear_attention_normalized.mix", 32, 2),
    ):
        _, foreign = other(x, use_cache=True)
        foreign.layer = None  # as if built by hand: its shapes decide
        with pytest.raises(mixc.MixcError, match=r"^state: the cache is not one of this layer's"):
            layer(x[:, :1], state=foreign)
    by_hand = MixerCache(cache.states, cache.conv)
    assert layer(x[:, :1], state=by_hand)[0].shape == (2, 1, 32)


TEMPERATURE = """
mixer temperature
in    q[K], k[K], v[V]
param tau, scale[V]
state H[V, K]
let   attend(x) = x / tau
H_t = H_{t-1} + v_t k_t^T
y_t = attend(H_t q_t) / scale
"""


def test_parameters_that_divide_start_at_one():
    """A temperature starting at 0 made the first step divide by 0 (NaN outputs)."""
    torch.manual_seed(0)
    layer = MixerLayer(mixc.Source(TEMPERATURE), 32, 2)
    values = layer.param_values()  # stored as logs: they stay positive
    assert torch.equal(values["tau"], torch.ones(2)) and torch.equal(
        values["scale"], torch.ones(2, 16)
    )
    y, _ = layer(torch.randn(2, 7, 32))
    y.square().mean().backward()
    assert torch.isfinite(y).all()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters())


def test_a_matrix_starts_as_mamba1_does():
    """A[P, N], a rate in its decay exp(dt_t * A), is stored as A_log with A = -exp(A_log) and
    starts at A = -1, ..., -N along every row (S4D-real)."""
    layer = MixerLayer(ROOT / "specs/mamba1.mix", 32, 2, sizes={"N": 4})
    rows = -torch.arange(1.0, 5.0)
    assert layer.params.A_log.shape == (2, 16, 4)
    assert torch.allclose(layer.param_values()["A"], rows.expand(2, 16, 4), rtol=0, atol=1e-6)


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


@pytest.mark.parametrize("name", ["kda", "rwkv7"])
def test_diagonal_plus_low_rank_layers_are_finite_at_init_over_4096_tokens(name):
    """The defaults the analysis gives KDA (gate logsigmoid, beta sigmoid, key silu + l2norm)
    and RWKV-7's own parametrisation keep D + a b^T contractive: at initialisation the state
    stays bounded over 4096 tokens, and the output and every gradient are finite."""
    torch.manual_seed(0)
    layer = MixerLayer(ROOT / "specs" / f"{name}.mix", 64, 2)
    if name == "kda":
        assert mixc.nn.default_transforms(layer.spec) == {
            "g": ["logsigmoid"],
            "beta": ["sigmoid"],
            "k": ["silu", "l2norm"],
            "q": ["silu", "l2norm"],
            "v": ["identity"],
        }
    y, cache = layer(torch.randn(1, 4096, 64), use_cache=True)
    assert torch.isfinite(y).all()
    (state,) = cache.states if isinstance(cache.states, tuple) else (cache.states,)
    assert state.abs().max() < 100
    y.square().mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters() if p.grad is not None)


@pytest.mark.parametrize("name", ["keys", "update", "training", "forward", "items"])
def test_an_input_named_like_a_torch_container_attribute_is_a_clear_error(name):
    text = (
        f"mixer m\nin q[K], {name}[K], v[V]\nstate H[V, K]\n"
        f"H_t = H_{{t-1}} + v_t {name}_t^T\ny_t = H_t q_t\n"
    )
    with pytest.raises(mixc.MixcError, match=f"cannot hold '{name}'.*rename it"):
        MixerLayer(mixc.Source(text), hidden_size=32, num_heads=2)


@pytest.mark.parametrize("name", ["mamba2", "rwkv7"])  # learnable parameters stored by domain
def test_a_layer_copies_and_pickles(name):
    """deepcopy and pickle raised `cannot pickle 'module' object` (the compiled module): the
    copy is rebuilt from the spec's text and computes the same function with its own weights."""
    torch.manual_seed(0)
    layer = MixerLayer(ROOT / f"specs/{name}.mix", 32, 2, chunk_size=8)
    x = torch.randn(2, 5, 32)
    y = layer(x)[0]
    for copied in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        torch.testing.assert_close(copied(x)[0], y)
        assert copied.mixer is layer.mixer  # the compiled module comes from load()'s cache
        assert copied.out_proj.weight is not layer.out_proj.weight
        assert set(copied.param_values()) == set(layer.param_values())
    state = layer.__getstate__()
    assert "mixer" not in state and "spec" not in state  # no compiled code, no IR pickled


def test_an_empty_batch_runs_and_continues():
    """B = 0 divided by zero in the chunked form (and the layer's reshape could not infer a
    size from no elements): the layer returns [0, T, hidden] and a cache that continues."""
    layer = MixerLayer(ROOT / "specs/gated_deltanet.mix", 32, 2)
    x = torch.randn(0, 5, 32, requires_grad=True)
    y, cache = layer(x, use_cache=True)
    assert y.shape == (0, 5, 32)
    y.sum().backward()
    assert x.grad.shape == x.shape
    y, cache = layer(torch.randn(0, 1, 32), state=cache, use_cache=True)
    assert y.shape == (0, 1, 32) and cache.states.shape[0] == 0


@pytest.mark.parametrize(
    "spec,change,message",
    [
        (5, {}, r"^spec: expected a spec path, a Source or a loaded Spec, got int$"),
        (None, {"hidden_size": 10**13}, r"^hidden_size: 10000000000000 would need .* memory$"),
        (None, {"conv_size": 10**9}, r"^conv_size: 1000000000 would need .* of memory$"),
        (None, {"sizes": {"K": 10**12}}, r"^sizes: \{'K': 1000000000000, 'V': 16\} would need"),
    ],
    ids=["int spec", "hidden_size", "conv_size", "sizes"],
)
def test_absurd_layer_arguments_are_named_before_allocating(spec, change, message):
    """MixerLayer(5, ...) raised a TypeError; a huge hidden_size overflowed inside torch and a
    huge conv_size tried to allocate 128 GB: named, checked against the machine's memory."""
    args = {"hidden_size": 32, "num_heads": 2} | change
    size, heads = args.pop("hidden_size"), args.pop("num_heads")
    with pytest.raises(mixc.MixcError, match=message):
        MixerLayer(DELTANET if spec is None else spec, size, heads, **args)


def test_use_cache_must_be_a_bool():
    layer = MixerLayer(DELTANET, 32, 2)
    with pytest.raises(mixc.MixcError, match=r"^use_cache: expected True or False, got str$"):
        layer(torch.randn(1, 3, 32), use_cache="no")


def test_mamba3_layer_keeps_its_angles_as_given_and_turns_a_quarter_of_the_channels():
    """The angle rate w of Mamba-3's summed angles is neither convolved nor put through silu
    (it is read only by the state of angles); R defaults to N / 4 (rope_fraction 0.5)."""
    layer = MixerLayer(ROOT / "specs" / "mamba3.mix", 64, 2, output_gate=False)
    assert layer.transforms["w"] == ["identity"] and "w" not in layer.conv_inputs
    assert layer.transforms["B"] == ["silu"] and "B" in layer.conv_inputs
    assert layer.sizes["R"] == layer.sizes["N"] // 4
    x = torch.randn(2, 40, 64, requires_grad=True)
    y, _ = layer(x)
    y.square().mean().backward()
    grads = [p.grad for p in layer.parameters()]
    assert torch.isfinite(y).all() and all(g is not None and torch.isfinite(g).all() for g in grads)
