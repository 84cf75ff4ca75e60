"""Padded batches: an attention_mask makes every row of a batch the sequence of its real tokens,
computed as that sequence run alone (the reference: the same layer called on the sequence by
itself, with no mask, whose forms the oracle checks in tests/test_agreement.py), left or right
padding, through MixerLayer, LanguageModel and its cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mixc
from mixc.attention import Attention
from mixc.model import Encoder, LanguageModel
from mixc.nn import MixerLayer
from tests.mixers import rel

ROOT = Path(__file__).parent.parent
#: One shipped spec of each transition class, and a spec with two states.
CLASSES = {
    "retnet": "scalar constant",
    "mamba2": "scalar data-dependent",
    "gla": "diagonal key-side",
    "deltanet": "identity minus rank-1",
    "kda": "diagonal times identity minus rank-1",
    "rwkv7": "diagonal plus low rank",
    "mamba1": "elementwise gate",
    "mlstm": "two states, scalar data-dependent",
}
LENGTHS = (9, 5, 1)  # the rows' real tokens; T = 9, chunks of 4


def _states(cache) -> tuple[torch.Tensor, ...]:
    return cache.states if isinstance(cache.states, tuple) else (cache.states,)


def padded(seqs: list[torch.Tensor], side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows [T_i, ...] as one batch [B, T, ...] padded with noise on `side`, and its mask."""
    T = max(len(s) for s in seqs)
    shape = (len(seqs), T, *seqs[0].shape[1:])
    floating = seqs[0].is_floating_point()
    x = torch.randn(shape, dtype=seqs[0].dtype) if floating else torch.randint(0, 50, shape)
    mask = torch.zeros(len(seqs), T, dtype=torch.long)
    for b, s in enumerate(seqs):
        where = slice(T - len(s), T) if side == "left" else slice(0, len(s))
        x[b, where], mask[b, where] = s, 1
    return x, mask


def real(y: torch.Tensor, mask: torch.Tensor, b: int) -> torch.Tensor:
    return y[b][mask[b].bool()]


#: Non-causal specs (a backward state): no cache, and the padding after a row's tokens must not
#: reach its backward state.
NON_CAUSAL = ("hydra", "bidirectional_gla")
OTHERS = sorted(
    p.stem for p in ROOT.glob("specs/*.mix") if p.stem not in CLASSES and p.stem not in NON_CAUSAL
)
SWEEP = [
    *[pytest.param(n, {}, id=n) for n in CLASSES],
    *[pytest.param(n, {}, id=n, marks=pytest.mark.slow) for n in OTHERS],
    *[
        pytest.param(n, {"num_v_heads": 4, "mode": mode}, id=f"{n}-grouped-{mode}")
        for n, mode in [("gated_deltanet", "chunk"), ("mamba2", "recurrent")]
    ],
]


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("name,options", SWEEP)
def test_a_padded_batch_is_each_sequence_alone(name, options, side):
    torch.manual_seed(0)
    layer = MixerLayer(ROOT / f"specs/{name}.mix", 16, 2, chunk_size=4, **options).double()
    seqs = [torch.randn(n, 16, dtype=torch.float64) for n in LENGTHS]
    x, mask = padded(seqs, side)
    y, cache = layer(x, use_cache=True, attention_mask=mask)  # packed: exact final states
    y_rows, _ = layer(x, attention_mask=mask)  # no cache: each row's tokens first, as they are
    assert (y[~mask.bool()] == 0).all() and (y_rows[~mask.bool()] == 0).all()
    nxt = torch.randn(len(seqs), 2, 16, dtype=torch.float64)
    steps = []  # then decode two tokens per row from the padded prefill's cache
    state = cache
    for t in range(2):
        y_t, state = layer(nxt[:, t : t + 1], state=state, use_cache=True)
        steps.append(y_t)
    for b, s in enumerate(seqs):
        y_b, cache_b = layer(s[None], use_cache=True)
        assert rel(real(y, mask, b), y_b[0]) <= 1e-12
        assert rel(real(y_rows, mask, b), y_b[0]) <= 1e-12
        assert all(rel(a[b], r[0]) <= 1e-12 for a, r in zip(_states(cache), _states(cache_b)))
        whole, _ = layer(torch.cat([s, nxt[b]])[None])
        assert rel(torch.cat([st[b] for st in steps]), whole[0, -2:]) <= 1e-12


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("name", NON_CAUSAL)
def test_a_padded_batch_of_a_non_causal_mixer_is_each_sequence_alone(name, side):
    """The backward state starts at each row's last token, not at the end of the padded row: the
    rows run packed (cu_seqlens), each reversed within its own bounds. Padding with noise, in
    the middle of a row too; the centred convolution sees zeros beyond a row's ends."""
    torch.manual_seed(0)
    layer = MixerLayer(ROOT / f"specs/{name}.mix", 16, 2, chunk_size=4).double()
    seqs = [torch.randn(n, 16, dtype=torch.float64) for n in LENGTHS]
    x, mask = padded(seqs, side)
    holes = torch.tensor([[1, 0, 1, 1, 0, 0, 1, 1, 1]])
    for x_b, mask_b in ((x, mask), (torch.randn(1, 9, 16, dtype=torch.float64), holes)):
        y, _ = layer(x_b, attention_mask=mask_b)
        assert (y[~mask_b.bool()] == 0).all()
        for b in range(len(x_b)):
            alone, _ = layer(x_b[b][mask_b[b].bool()][None])
            assert rel(real(y, mask_b, b), alone[0]) <= 1e-12
    mode = "recurrent" if layer.mode != "recurrent" else "chunk"
    other = MixerLayer(ROOT / f"specs/{name}.mix", 16, 2, chunk_size=4, mode=mode).double()
    other.load_state_dict(layer.state_dict())
    assert rel(other(x, attention_mask=mask)[0], layer(x, attention_mask=mask)[0]) <= 1e-12


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_gradients_are_the_sum_of_each_sequence_alone(side):
    torch.manual_seed(0)
    layer = MixerLayer(ROOT / "specs/gated_deltanet.mix", 16, 2, chunk_size=4).double()
    seqs = [torch.randn(n, 16, dtype=torch.float64) for n in LENGTHS]
    x, mask = padded(seqs, side)
    layer(x, attention_mask=mask)[0].square().sum().backward()
    padded_grads = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    for s in seqs:
        layer(s[None])[0].square().sum().backward()
    assert all(rel(a, p.grad) <= 1e-12 for a, p in zip(padded_grads, layer.parameters()))


def test_a_padded_call_compiles_as_one_graph():
    """Without a cache, a padded call has no size that depends on the mask: torch.compile
    captures it whole (fullgraph=True; aot_eager: graph capture and autograd), and it is still
    each sequence alone, gradients included."""
    torch.manual_seed(0)
    layer = MixerLayer(ROOT / "specs/gated_deltanet.mix", 16, 2, chunk_size=4).double()
    seqs = [torch.randn(n, 16, dtype=torch.float64) for n in LENGTHS]
    x, mask = padded(seqs, "left")
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    y, _ = compiled(x, attention_mask=mask)
    y.square().sum().backward()
    padded_grads = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    for b, s in enumerate(seqs):
        y_b, _ = layer(s[None])
        y_b.square().sum().backward()
        assert rel(real(y, mask, b), y_b[0]) <= 1e-12
    assert (y[~mask.bool()] == 0).all()
    assert all(rel(a, p.grad) <= 1e-12 for a, p in zip(padded_grads, layer.parameters()))


def test_a_row_of_padding_only_keeps_its_state_and_a_mask_continues_a_cache():
    torch.manual_seed(0)
    layer = MixerLayer(ROOT / "specs/mlstm.mix", 16, 2, chunk_size=4).double()
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    _, cache = layer(x, use_cache=True)
    more = torch.randn(2, 3, 16, dtype=torch.float64)
    mask = torch.tensor([[0, 1, 1], [0, 0, 0]])
    y, after = layer(more, state=cache, use_cache=True, attention_mask=mask)
    _, alone = layer(more[:1, 1:], state=_first(cache), use_cache=True)
    assert (y[1] == 0).all() and (y[0, 0] == 0).all()
    assert all(rel(a[1], c[1]) == 0 for a, c in zip(_states(after), _states(cache)))
    assert all(rel(a[1], c[1]) == 0 for a, c in zip(after.conv.values(), cache.conv.values()))
    assert all(rel(a[:1], c) <= 1e-12 for a, c in zip(_states(after), _states(alone)))
    zero, fresh = layer(more, use_cache=True, attention_mask=torch.zeros(2, 3))
    assert (zero == 0).all() and all((s == 0).all() for s in _states(fresh))


def _first(cache):
    """The cache of the first sequence only."""
    states = tuple(s[:1] for s in _states(cache))
    conv = {k: v[:1] for k, v in cache.conv.items()}
    return mixc.nn.MixerCache(states if len(states) > 1 else states[0], conv)


@pytest.mark.parametrize(
    "mask,message",
    [
        (torch.ones(2, 4), r"^attention_mask: expected \[B, T\] = \[2, 3\] like the input, got"),
        (
            torch.full((2, 3), 2),
            r"^attention_mask: expected 1 for a token and 0 for padding, got 2",
        ),
        ([[1, 1, 1]], r"^attention_mask: expected a tensor \[B, T\] of 0 and 1, got \[\[1"),
    ],
    ids=["shape", "values", "not a tensor"],
)
def test_a_bad_attention_mask_is_named(mask, message):
    layer = MixerLayer(ROOT / "specs/gla.mix", 16, 2)
    with pytest.raises(mixc.MixcError, match=message):
        layer(torch.randn(2, 3, 16), attention_mask=mask)


@pytest.mark.parametrize("side", ["left", "right"])
def test_language_model_padded_batch_and_generate(side):
    torch.manual_seed(0)
    pattern = [
        ROOT / "specs/gated_deltanet.mix",
        "attention",
        ROOT / "specs/mlstm.mix",
        "attention:4",
    ]
    model = LanguageModel(pattern, 50, 16, 2, chunk_size=4).double()
    seqs = [torch.randint(0, 50, (n,)) for n in LENGTHS]
    tokens, mask = padded(seqs, side)
    logits, _ = model(tokens, attention_mask=mask)
    for b, s in enumerate(seqs):
        assert rel(real(logits, mask, b), model(s[None])[0][0]) <= 1e-12
    out = model.generate(tokens, 4, attention_mask=mask)  # from each row's last token
    for b, s in enumerate(seqs):
        assert torch.equal(out[b, -4:], model.generate(s[None], 4)[0, -4:])


@pytest.mark.parametrize("side", ["left", "right"])
def test_encoder_padded_batch_is_each_sequence_alone(side):
    """An encoder's attention sees its row's tokens on both sides of a query, never the row's
    padding; its non-causal mixers' backward states start at the row's last token."""
    torch.manual_seed(0)
    model = Encoder([ROOT / "specs/hydra.mix", "attention"], 50, 16, 2, chunk_size=4).double()
    seqs = [torch.randint(0, 50, (n,)) for n in LENGTHS]
    tokens, mask = padded(seqs, side)
    logits, _ = model(tokens, attention_mask=mask)
    for b, s in enumerate(seqs):
        assert rel(real(logits, mask, b), model(s[None])[0][0]) <= 1e-12


@pytest.mark.parametrize("window", [None, 3])
def test_attention_padded_then_decoding_is_each_sequence_alone(window):
    torch.manual_seed(0)
    layer = Attention(16, 2, window=window).double()
    seqs = [torch.randn(n, 16, dtype=torch.float64) for n in LENGTHS]
    x, mask = padded(seqs, "left")
    y, cache = layer(x, use_cache=True, attention_mask=mask)  # packed: exact final states
    y_rows, _ = layer(x, attention_mask=mask)  # no cache: each row's tokens first, as they are
    assert (y[~mask.bool()] == 0).all() and (y_rows[~mask.bool()] == 0).all()
    nxt = torch.randn(len(seqs), 3, 16, dtype=torch.float64)
    steps = []
    for t in range(3):
        y_t, cache = layer(nxt[:, t : t + 1], state=cache, use_cache=True)
        steps.append(y_t)
    for b, s in enumerate(seqs):
        whole, _ = layer(torch.cat([s, nxt[b]])[None])
        assert rel(real(y, mask, b), whole[0, : len(s)]) <= 1e-12
        assert rel(torch.cat([st[b] for st in steps]), whole[0, -3:]) <= 1e-12


def test_padding_inside_a_row_is_skipped_as_well():
    """A mask with holes: each row is still the sequence of its tokens, and the convolution
    reads across a hole from the token before it."""
    torch.manual_seed(0)
    layer = MixerLayer(ROOT / "specs/gla.mix", 16, 2, chunk_size=4).double()
    x = torch.randn(2, 8, 16, dtype=torch.float64)
    mask = torch.tensor([[1, 0, 1, 1, 0, 0, 1, 1], [0, 1, 1, 0, 1, 0, 0, 1]])
    for use_cache in (False, True):
        y, _ = layer(x, use_cache=use_cache, attention_mask=mask)
        for b in range(2):
            alone, _ = layer(x[b][mask[b].bool()][None])
            assert rel(real(y, mask, b), alone[0]) <= 1e-12
