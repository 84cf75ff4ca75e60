"""The generated forms run under torch.compile(fullgraph=True) and, compiled or eager, match the
float64 oracle to the float32 bound.

Chunk, recurrent and step are captured as one full graph with the aot_eager backend (graph
capture and autograd, no code generation): by default for one spec of every code path the
generated modules take (each kernel, the normaliser, the log-space write scale, sub-tokens, a
lagged query, the elementwise classes); `-m slow` captures every shipped spec. The inductor CPU
backend compiles one chunked form by default (its first compile alone takes 15 s or more on two
cores) and, with `-m slow`, one spec per kernel and then every form of every spec.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

import mixc
from mixc.oracle.interpret import interpret
from tests.mixers import positional, rel, spec_inputs

ROOT = Path(__file__).parents[2]
SPECS = sorted(ROOT.glob("specs/*.mix"))
ONE_PER_KERNEL = ["gated_retention", "gla", "gated_deltanet"]
#: One spec for each code path of the generated modules: scalar decay (constant and per token),
#: the normaliser, the stabilised write scale, rotations by the position, the delta rule,
#: sub-tokens, diagonal gates with a lagged query, DPLR (with and without a proven gate bound),
#: the elementwise classes, and several writes joined (the rank kernel: any number of seqs).
EVERY_PATH = {
    "retnet", "mamba2", "linear_attention_normalized", "mlstm", "linear_attention_rope",
    "gated_deltanet", "deltaproduct", "rwkv6", "kda", "rwkv7", "mamba1", "hgrn",
    "mamba3_trapezoid",
}  # fmt: skip


def _by_default(names):
    """pytest params of every shipped spec; those not in `names` run with `-m slow` only."""
    return [
        pytest.param(p, id=p.stem, marks=() if p.stem in names else pytest.mark.slow) for p in SPECS
    ]


#: The project's float32 bound against the float64 oracle (relative RMS error of outputs).
FP32 = 1e-5


def _check(path, backend, forms=("chunk", "recurrent", "step")):
    spec, module = mixc.load_spec(path), mixc.load(path)
    inputs, params = spec_inputs(spec, B=1, T=6, NH=2, dtype=torch.float32)
    args = positional(spec, inputs, params)
    n = len(spec.mixer.inputs)
    y_ref = interpret(spec, inputs, params)[0][spec.mixer.outputs[0].target]
    torch._dynamo.reset()
    for form in forms:
        if form == "chunk" and not mixc.analyze(spec).chunkable:
            continue
        fn = getattr(module, form)
        a = [x[:, 0] if i < n else x for i, x in enumerate(args)] if form == "step" else args
        kw = {"chunk_size": 4} if form == "chunk" else {}
        leaves = [x.clone().requires_grad_(True) for x in a]
        y, _ = torch.compile(fn, fullgraph=True, backend=backend)(*leaves, **kw)
        y.square().sum().backward()
        ref = y_ref[:, 0] if form == "step" else y_ref
        assert rel(y, ref) <= FP32, form  # compiled, against the float64 oracle
        assert rel(fn(*a, **kw)[0], ref) <= FP32, form  # and eager
        assert all(x.grad is not None and torch.isfinite(x.grad).all() for x in leaves), form


@pytest.mark.parametrize("path", _by_default(EVERY_PATH))
def test_full_graph_capture(path):
    _check(path, "aot_eager")


@pytest.mark.parametrize(
    "name",
    [
        n if n == "gated_deltanet" else pytest.param(n, marks=pytest.mark.slow)
        for n in ONE_PER_KERNEL
    ],
)
def test_inductor_chunk(name):
    _check(ROOT / f"specs/{name}.mix", "inductor", forms=("chunk",))


@pytest.mark.slow
@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_inductor_every_form(path):
    _check(path, "inductor")


def _layer_step(layer, x):
    """One forward+backward of a layer: (output, the gradients of x and of every parameter)."""
    x = x.detach().requires_grad_(True)
    y, _ = layer(x)
    y.square().mean().backward()
    return y.detach(), [x.grad, *(p.grad for p in layer.parameters())]


def _check_layer(name, backend, **options):
    """A MixerLayer compiled whole (fullgraph=True) computes what the same layer computes in
    float64 (eager), whose kernels the oracle tests check: the output and every gradient, to
    the project's float32 bounds. (Compared with the eager float32 layer instead, two roundings
    of a gradient that cancels to near zero, as Transformer-VQ's codebook's at initialisation,
    all codes equal, may differ by more than the bound: `rel` measures that one against its
    absolute floor.)"""
    from mixc.nn import MixerLayer

    torch.manual_seed(0)
    spec = name if isinstance(name, mixc.Spec) else ROOT / f"specs/{name}.mix"
    layer = MixerLayer(spec, hidden_size=32, num_heads=2, chunk_size=4, **options)
    x = torch.randn(2, 11, 32)
    y_r, g_r = _layer_step(copy.deepcopy(layer).double(), x.double())
    torch._dynamo.reset()
    y_c, g_c = _layer_step(torch.compile(layer, fullgraph=True, backend=backend), x)
    assert rel(y_c, y_r) <= FP32
    for i, (a, b) in enumerate(zip(g_c, g_r, strict=True)):
        assert rel(a, b) <= 1e-4, i  # the project's float32 bound for gradients


def test_layer_full_graph():
    """A layer compiles as one graph, its kernels as operators (aot_eager: no code generation)."""
    _check_layer("gated_deltanet", "aot_eager")


@pytest.mark.slow
@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_inductor_layer(path):
    """Every shipped spec's layer through the inductor backend, forward and backward."""
    _check_layer(path.stem, "inductor")


@pytest.mark.slow
@pytest.mark.parametrize("rotation", ["rotate", "rotate_halves", "rotate_interleaved"])
def test_inductor_layer_of_each_rotation(rotation):
    """A layer whose queries and keys each rotation turns by angles that take a gradient (made
    from the layer's input, as Mamba-3's are): compiled by inductor, its output and every
    gradient (the angles' projection's among them) against the same layer in float64. The
    shipped specs' layers (test_inductor_layer) cover rotate_interleaved by positions
    (linear_attention_rope) and rotate_halves (mamba3_mimo); no shipped spec calls rotate."""
    text = (
        "mixer turned\nin q[K], k[K], v[V], a[P]\nstate H[V, K]\n"
        f"H_t = H_{{t-1}} + v_t {rotation}(k_t, a_t)^T\ny_t = H_t {rotation}(q_t, a_t)\n"
    )
    spec = mixc.load_spec(text=text)
    _check_layer(spec, "inductor", sizes={"K": 8, "V": 8, "P": 3})
