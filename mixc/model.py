"""A small causal language model from a pattern of layers: specs, softmax attention, or both.

    model = LanguageModel(
        ["specs/gated_deltanet.mix", "specs/gated_deltanet.mix", "attention"],
        vocab_size=256, hidden_size=128, num_heads=4,
    )
    logits, _ = model(tokens)                       # tokens: [B, T] int64
    out = model.generate(prompt, max_new_tokens=32)  # prefill, then one token at a time

Each entry of the pattern is a block: a pre-norm residual token mixer (a `MixerLayer` built
from the spec, or `Attention` for "attention", or a sliding window of N tokens for
"attention:N"), then a pre-norm residual MLP, as the hybrids of the field stack them (Jamba,
Samba, Griffin). The embedding is tied to the output head. `generate` prefills with the
chunked forms and decodes token by token from every layer's cache.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from mixc.attention import Attention
from mixc.errors import MixcError, Source
from mixc.frontend.spec import Spec
from mixc.layer_checks import count
from mixc.nn import MixerLayer
from mixc.resources import check_bytes

__all__ = ["Block", "Encoder", "LanguageModel", "is_attention", "make_mixer"]


def is_attention(entry) -> bool:
    """Whether a pattern entry names softmax attention ("attention" or "attention:N")."""
    return isinstance(entry, str) and entry.split(":")[0] == "attention"


def make_mixer(
    entry, hidden_size: int, num_heads: int, causal: bool = True, **layer_kwargs
) -> nn.Module:
    """The token mixer of one pattern entry: "attention", "attention:N" (a window of N
    tokens), or a spec (a path, a Source or a loaded Spec) for a MixerLayer with
    `layer_kwargs`. Not `causal`: an encoder's, whose attention has no causal mask."""
    if is_attention(entry):
        _, colon, window = entry.partition(":")
        if colon and not (window.isascii() and window.isdigit()):
            raise MixcError(f"pattern: {entry!r}: expected attention:N with N a window size")
        window = int(window) if colon else None
        return Attention(hidden_size, num_heads, window=window, causal=causal)
    if not isinstance(entry, str | os.PathLike | Source | Spec):
        raise MixcError(f"pattern: expected a spec or 'attention', got {entry!r}")
    layer = MixerLayer(entry, hidden_size, num_heads, **layer_kwargs)
    if causal and not layer.spec.mixer.causal:
        name = layer.spec.mixer.name
        raise MixcError(
            f"pattern: {name} is non-causal (its state {layer.spec.mixer.backward[0]} runs "
            "backward in time), so a language model would read the tokens it predicts; stack "
            "it in mixc.model.Encoder"
        )
    return layer


class Block(nn.Module):
    """x + mixer(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, mixer: nn.Module, hidden_size: int, mlp_ratio: int) -> None:
        super().__init__()
        self.mixer = mixer
        self.norm1, self.norm2 = nn.RMSNorm(hidden_size), nn.RMSNorm(hidden_size)
        self.mlp = nn.Sequential(
            nn.Linear(hidden_size, mlp_ratio * hidden_size),
            nn.GELU(),
            nn.Linear(mlp_ratio * hidden_size, hidden_size),
        )

    def forward(self, x: torch.Tensor, cache=None, use_cache: bool = False, attention_mask=None):
        y, cache = self.mixer(
            self.norm1(x), state=cache, use_cache=use_cache, attention_mask=attention_mask
        )
        x = x + y
        return x + self.mlp(self.norm2(x)), cache


class LanguageModel(nn.Module):
    """Embedding (tied to the output head), one block per pattern entry, a final RMSNorm.

    Args:
        pattern: one entry per block: a spec, "attention" or "attention:N".
        vocab_size, hidden_size, num_heads: sizes (every mixer gets the same width and heads).
        mlp_ratio: the MLP's hidden width over hidden_size (0: no MLP).
        layer_kwargs: passed to every MixerLayer (sizes, conv_size, chunk_size, ...).
    """

    causal = True  # its attention layers have a causal mask

    def __init__(
        self,
        pattern: Sequence,
        vocab_size: int,
        hidden_size: int = 128,
        num_heads: int = 4,
        *,
        mlp_ratio: int = 4,
        **layer_kwargs,
    ) -> None:
        super().__init__()
        if isinstance(pattern, str | os.PathLike) or not isinstance(pattern, Sequence):
            raise MixcError(f"pattern: expected a list of specs or 'attention', got {pattern!r}")
        if not pattern:
            raise MixcError("pattern: expected at least one layer")
        self.vocab_size = count("vocab_size", vocab_size)
        hidden_size = count("hidden_size", hidden_size)
        count("num_heads", num_heads)
        mlp_ratio = count("mlp_ratio", mlp_ratio, least=0)
        embed = vocab_size * hidden_size
        per_block = (2 * mlp_ratio + 4) * hidden_size**2  # an MLP and at most attention's 4
        option = "vocab_size" if embed >= len(pattern) * per_block else "hidden_size"
        value = vocab_size if option == "vocab_size" else hidden_size
        size = torch.get_default_dtype().itemsize
        total = (embed + len(pattern) * per_block) * size
        check_bytes(option, value, total, "the model's embedding and blocks")
        self.pattern = list(pattern)
        self.embed = nn.Embedding(vocab_size, hidden_size)
        nn.init.normal_(self.embed.weight, std=hidden_size**-0.5)
        self.blocks = nn.ModuleList(
            Block(
                make_mixer(e, hidden_size, num_heads, self.causal, **layer_kwargs),
                hidden_size,
                mlp_ratio,
            )
            for e in pattern
        )
        if mlp_ratio == 0:
            for block in self.blocks:
                block.mlp = nn.Identity()
        self.norm = nn.RMSNorm(hidden_size)

    def forward(
        self,
        tokens: torch.Tensor,
        caches: list | None = None,
        use_cache: bool = False,
        attention_mask: torch.Tensor | None = None,
    ):
        """tokens: [B, T] int64. Returns (logits [B, T, vocab], caches or None); caches from
        an earlier call continue those sequences. attention_mask [B, T] (1: a token, 0:
        padding, e.g. on the left of shorter prompts): each row is computed as its tokens
        alone; the logits at padding are meaningless."""
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.is_floating_point():
            raise MixcError("tokens: expected an integer tensor [B, T]")
        if tokens.dtype == torch.bool or tokens.is_complex():
            raise MixcError(f"tokens: expected an integer tensor [B, T], got {tokens.dtype}")
        if not isinstance(use_cache, bool):
            raise MixcError(f"use_cache: expected True or False, got {type(use_cache).__name__}")
        if tokens.device.type == "cpu" and tokens.numel() and not torch.compiler.is_compiling():
            # on the CPU the check is one pass over the ids, no wait for a device: elsewhere the
            # embedding's own bounds check reports it
            low, high = (int(x) for x in torch.aminmax(tokens))
            if low < 0 or high >= self.vocab_size:
                bad = low if low < 0 else high
                raise MixcError(f"tokens: expected ids in [0, {self.vocab_size}), got {bad}")
        if caches is not None and len(caches) != len(self.blocks):
            raise MixcError(
                f"caches: expected {len(self.blocks)} (one per layer), got {len(caches)}"
            )
        x = self.embed(tokens)
        new = []
        for block, cache in zip(self.blocks, caches or [None] * len(self.blocks), strict=True):
            x, cache = block(x, cache, use_cache=use_cache, attention_mask=attention_mask)
            new.append(cache)
        logits = F.linear(self.norm(x), self.embed.weight)
        return logits, (new if use_cache else None)

    @torch.no_grad()
    def generate(
        self,
        prompt: torch.Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 0.0,
        generator: torch.Generator | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The prompt [B, T] followed by `max_new_tokens` tokens, greedy (temperature 0) or
        sampled: one pass over the prompt, then one token a step from every layer's cache.
        attention_mask [B, T] marks the prompts' padding (0) for prompts of several lengths
        (padded on the left, as transformers does, or on the right): each row continues from
        its last prompt token."""
        n = count("max_new_tokens", max_new_tokens, least=0)
        out = [prompt]
        if n == 0:
            return prompt
        logits, caches = self(prompt, use_cache=True, attention_mask=attention_mask)
        if attention_mask is not None:  # each row's last token: T - 1 less the padding after it
            ends = prompt.shape[1] - 1 - attention_mask.flip(1).to(torch.int8).argmax(1)
            logits = logits[torch.arange(len(ends), device=ends.device), ends][:, None]
        for i in range(n):
            last = logits[:, -1].float()
            if temperature > 0:
                probs = torch.softmax(last / temperature, -1)
                token = torch.multinomial(probs, 1, generator=generator)
            else:
                token = last.argmax(-1, keepdim=True)
            out.append(token)
            if i + 1 < n:
                logits, caches = self(token, caches, use_cache=True)
        return torch.cat(out, 1)


class Encoder(LanguageModel):
    """A bidirectional stack, for encoders (masked-token prediction): LanguageModel's blocks,
    its attention layers without a causal mask, logits at every token from the whole sequence.
    Non-causal specs (a backward state: hydra, bidirectional_gla) see both sides of each
    token; a causal spec may be stacked too and sees the tokens up to its own. No cache, no
    generate.

        encoder = Encoder(["specs/hydra.mix", "attention"], vocab_size=256)
        logits, _ = encoder(tokens)                     # tokens: [B, T] int64
    """

    causal = False

    def forward(
        self,
        tokens: torch.Tensor,
        caches: list | None = None,
        use_cache: bool = False,
        attention_mask: torch.Tensor | None = None,
    ):
        """tokens: [B, T] int64. Returns (logits [B, T, vocab], None). attention_mask [B, T]
        (1: a token, 0: padding, anywhere in a row): each row is encoded as the sequence of its
        tokens alone; the logits at padding are meaningless."""
        if caches is not None or use_cache is not False:
            raise MixcError(
                "an Encoder reads whole sequences and keeps no cache: call it with "
                "use_cache=False and no caches"
            )
        return super().forward(tokens, attention_mask=attention_mask)

    def generate(self, prompt: torch.Tensor, max_new_tokens: int, **kwargs) -> torch.Tensor:
        raise MixcError(
            "an Encoder does not generate: each token's logits read the tokens after it; "
            "use LanguageModel for generation"
        )
