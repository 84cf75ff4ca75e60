"""Softmax attention against a float64 loop over tokens; hybrid language models: a prefill
followed by token-by-token decoding from every layer's cache equals one pass, and generate()
is the greedy continuation a full pass predicts."""

from __future__ import annotations

import copy
import io
import math
from pathlib import Path

import pytest
import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

import mixc
from mixc.attention import Attention, _rotate
from mixc.model import Encoder, LanguageModel
from tests.mixers import rel

ROOT = Path(__file__).parent.parent


def _attention_loop(layer: Attention, x: torch.Tensor) -> torch.Tensor:
    """The layer's function token by token: each query against the keys it may see."""
    B, T, D = x.shape
    NH, d = layer.num_heads, layer.head_size
    q, k, v = layer.qkv(x).view(B, T, 3, NH, d).permute(2, 0, 3, 1, 4)
    pos = torch.arange(T)
    q, k = _rotate(q, pos, layer.rope_base), _rotate(k, pos, layer.rope_base)
    out = torch.zeros(B, NH, T, d, dtype=x.dtype)
    for t in range(T):
        first = 0 if layer.window is None else max(0, t - layer.window + 1)
        stop = t + 1 if layer.causal else T  # an encoder's attends to every token
        scores = (q[:, :, t : t + 1] @ k[:, :, first:stop].mT) / math.sqrt(d)
        out[:, :, t] = (scores.softmax(-1) @ v[:, :, first:stop])[:, :, 0]
    return layer.out_proj(out.transpose(1, 2).reshape(B, T, D))


@pytest.mark.parametrize("window", [None, 1, 5])
def test_attention_matches_a_loop_and_decodes_from_its_cache(window):
    torch.manual_seed(0)
    layer = Attention(32, 4, window=window).double()
    x = torch.randn(2, 19, 32, dtype=torch.float64)
    y, _ = layer(x)
    assert rel(y, _attention_loop(layer, x)) <= 1e-12
    pieces, (y_head, cache) = [], layer(x[:, :11], use_cache=True)
    pieces.append(y_head)
    for t in range(11, 19):
        y_t, cache = layer(x[:, t : t + 1], state=cache, use_cache=True)
        pieces.append(y_t)
    assert rel(torch.cat(pieces, 1), y) <= 1e-12
    if window is not None:
        assert cache.k.shape[2] == window - 1 and cache.seen == 19


PATTERN = [
    ROOT / "specs/gated_deltanet.mix",
    "attention",
    ROOT / "specs/mamba2.mix",
    "attention:6",
    ROOT / "specs/linear_attention_normalized.mix",
]


def test_hybrid_cached_decode_equals_a_full_pass():
    torch.manual_seed(0)
    model = LanguageModel(PATTERN, vocab_size=50, hidden_size=32, num_heads=2, chunk_size=8)
    model = model.double()
    tokens = torch.randint(0, 50, (2, 23))
    full, _ = model(tokens)
    logits, caches = model(tokens[:, :9], use_cache=True)
    pieces = [logits]
    for t in range(9, 23):
        logits, caches = model(tokens[:, t : t + 1], caches, use_cache=True)
        pieces.append(logits)
    assert rel(torch.cat(pieces, 1), full) <= 1e-10


def test_generate_is_the_greedy_continuation_of_full_passes():
    torch.manual_seed(0)
    model = LanguageModel(PATTERN[:2], vocab_size=40, hidden_size=32, num_heads=2).double()
    prompt = torch.randint(0, 40, (3, 7))
    out = model.generate(prompt, max_new_tokens=6)
    assert out.shape == (3, 13) and torch.equal(out[:, :7], prompt)
    for t in range(7, 13):  # each new token is the argmax of a full pass over what precedes it
        logits, _ = model(out[:, :t])
        assert torch.equal(logits[:, -1].argmax(-1), out[:, t])
    sampled = model.generate(prompt, 4, temperature=1.0, generator=torch.Generator().manual_seed(1))
    assert sampled.shape == (3, 11)


def test_tied_embeddings_and_bad_patterns():
    model = LanguageModel(["attention"], vocab_size=10, hidden_size=16, num_heads=2)
    logits, _ = model(torch.zeros(1, 3, dtype=torch.long))
    logits.sum().backward()
    assert model.embed.weight.grad is not None and logits.shape == (1, 3, 10)
    with torch.no_grad():  # the head is the embedding: a token not in the input moves its logit
        model.embed.weight[7] += 1.0
    moved, _ = model(torch.zeros(1, 3, dtype=torch.long))
    assert not torch.equal(moved[..., 7], logits[..., 7])
    assert torch.equal(moved[..., :7], logits[..., :7])
    with pytest.raises(mixc.MixcError, match="pattern: expected a list"):
        LanguageModel("attention", vocab_size=10)
    with pytest.raises(mixc.MixcError, match="attention:N"):
        LanguageModel(["attention:x"], vocab_size=10)
    with pytest.raises(mixc.MixcError, match="pattern: expected a spec"):
        LanguageModel([3], vocab_size=10)


def test_a_model_saves_whole_copies_and_averages():
    """torch.save of a whole model, deepcopy and AveragedModel (EMA weights) raised `cannot
    pickle 'module' object`; each copy computes the same logits."""
    torch.manual_seed(0)
    specs = [ROOT / "specs/gated_deltanet.mix", ROOT / "specs/mamba2.mix", "attention:4"]
    model = LanguageModel(specs, vocab_size=11, hidden_size=16, num_heads=2)
    tokens = torch.randint(0, 11, (2, 6))
    logits = model(tokens)[0]
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    torch.testing.assert_close(loaded(tokens)[0], logits)
    torch.testing.assert_close(copy.deepcopy(model)(tokens)[0], logits)
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
    ema.update_parameters(model)
    torch.testing.assert_close(ema(tokens)[0], logits)


def test_bad_model_arguments_and_tokens_are_named():
    """A window '²' (a digit to str.isdigit, not to int), hidden_size -32 or '32' (as a
    config.json may hold them), a huge hidden_size and ids outside the vocabulary raised
    ValueError, RuntimeError or IndexError: each is a MixcError naming the argument."""
    with pytest.raises(mixc.MixcError, match=r"^pattern: 'attention:²': expected attention:N"):
        LanguageModel(["attention:²"], vocab_size=10)
    for bad in (-32, "32", 32.0):
        with pytest.raises(mixc.MixcError, match=r"^hidden_size: expected a positive int, got"):
            LanguageModel(["attention"], vocab_size=10, hidden_size=bad)
    with pytest.raises(mixc.MixcError, match=r"^hidden_size: 10000000000000 would need .*memory$"):
        LanguageModel(["attention"], vocab_size=10, hidden_size=10**13)
    with pytest.raises(mixc.MixcError, match=r"^vocab_size: 1000000000000 would need "):
        LanguageModel(["attention"], vocab_size=10**12, hidden_size=16)
    model = LanguageModel(["attention"], vocab_size=10, hidden_size=16, num_heads=2)
    for bad in (10, 99, -1):
        with pytest.raises(
            mixc.MixcError, match=rf"^tokens: expected ids in \[0, 10\), got {bad}$"
        ):
            model(torch.tensor([[1, bad]]))
    with pytest.raises(mixc.MixcError, match=r"^use_cache: expected True or False"):
        model(torch.tensor([[1, 2]]), use_cache="no")


def test_an_encoders_attention_matches_a_loop_over_every_token():
    torch.manual_seed(0)
    layer = Attention(32, 4, causal=False).double()
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    y, cache = layer(x)
    assert cache is None and rel(y, _attention_loop(layer, x)) <= 1e-12
    with pytest.raises(mixc.MixcError, match="has no cache"):
        layer(x, use_cache=True)
    with pytest.raises(mixc.MixcError, match="sliding window looks back only"):
        Attention(32, 4, causal=False, window=4)


def test_an_encoder_sees_both_sides_and_a_language_model_refuses_a_non_causal_spec():
    torch.manual_seed(0)
    encoder = Encoder([ROOT / "specs/hydra.mix", "attention"], 16, 32, 2, chunk_size=4).double()
    tokens = torch.randint(0, 16, (2, 12))
    logits, _ = encoder(tokens)
    for t in (0, 11):  # a token changed at either end moves the logits at the other
        other = tokens.clone()
        other[:, t] = (other[:, t] + 1) % 16
        assert (encoder(other)[0][:, 11 - t] - logits[:, 11 - t]).abs().max() > 1e-6
    with pytest.raises(mixc.MixcError, match="keeps no cache"):
        encoder(tokens, use_cache=True)
    with pytest.raises(mixc.MixcError, match="does not generate"):
        encoder.generate(tokens, 3)
    with pytest.raises(
        mixc.MixcError, match=r"hydra is non-causal .* stack it in mixc\.model\.Encoder"
    ):
        LanguageModel([ROOT / "specs/hydra.mix"], 16)


def _copy_from_the_right(pattern, steps=120):
    """Token accuracy after training on: predict each token's right neighbour (a masked-token
    task that needs the tokens after the predicted one)."""
    torch.manual_seed(0)
    model = Encoder(pattern, 8, 32, 2, mlp_ratio=2, chunk_size=8)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        tokens = torch.randint(0, 8, (16, 16), generator=gen)
        logits, _ = model(tokens)
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, 8), tokens[:, 1:].reshape(-1)
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    tokens = torch.randint(0, 8, (64, 16), generator=gen)
    with torch.no_grad():
        guess = model(tokens)[0][:, :-1].argmax(-1)
    return (guess == tokens[:, 1:]).float().mean().item()


@pytest.mark.slow  # 240 training steps: minutes on a busy 2-core machine
def test_an_encoder_of_a_non_causal_spec_learns_what_only_the_right_side_holds():
    """The bidirectional layer learns to read the next token; the same stack of a causal spec
    stays near chance (1/8): it cannot see it."""
    both = _copy_from_the_right([ROOT / "specs/bidirectional_gla.mix"])
    left = _copy_from_the_right([ROOT / "specs/gla.mix"])
    assert both > 0.9 and left < 0.3, (both, left)
