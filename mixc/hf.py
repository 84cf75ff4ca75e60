"""Hugging Face transformers compatibility (`pip install 'mixc[hf]'`): a config and a causal LM.

    import mixc.hf  # registers "mixc" with AutoConfig and AutoModelForCausalLM
    config = mixc.hf.MixcConfig.from_pattern(
        ["specs/gated_deltanet.mix", "attention"], vocab_size=256, hidden_size=128, num_heads=4
    )
    model = mixc.hf.MixcForCausalLM(config)
    model.save_pretrained("out")
    model = AutoModelForCausalLM.from_pretrained("out")   # no spec files needed here
    tokens = model.generate(prompt, max_new_tokens=32, do_sample=False)

The model is a `mixc.model.LanguageModel` (`.model`). The config carries the text of every spec
in the pattern (`specs`, by mixer name), so a saved model loads where the spec files are not;
that text goes through mixc's parser, verifier and compiler like any other spec, and a bad one
is a located MixcError. Decoding keeps mixc's own per-layer caches (recurrent states,
convolution tails, attention keys and values) in a `MixcCache`, which the model returns as its
`cache` and `generate` hands back each step; transformers' key-value caches have no place for
a recurrent state of an arbitrary spec, so the model opts out of them.

transformers is imported here only: `import mixc` never needs it.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from mixc.errors import MixcError, Source
from mixc.frontend.spec import load_spec, source_of
from mixc.model import LanguageModel, is_attention
from mixc.nn import MixerLayer

try:
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        GenerationMixin,
        PreTrainedConfig,
        PreTrainedModel,
    )
    from transformers.modeling_outputs import CausalLMOutputWithPast
except ImportError as exc:  # ModuleNotFoundError, or a transformers too old to have these
    raise MixcError(f"mixc.hf needs transformers 5 ({exc}): pip install 'mixc[hf]'") from None

__all__ = ["LAYER_OPTIONS", "MixcCache", "MixcConfig", "MixcForCausalLM"]

#: The MixerLayer options a config may carry in `layer_kwargs`.
LAYER_OPTIONS = tuple(inspect.signature(MixerLayer).parameters)[3:]


class MixcConfig(PreTrainedConfig):
    """A LanguageModel's configuration, specs included.

    Fields:
        pattern: one entry per block: "attention", "attention:N" (a window of N tokens), or
            the name of a spec in `specs`.
        specs: spec text by name (the mixer's name in the spec).
        vocab_size, hidden_size, num_heads, mlp_ratio: as LanguageModel takes them.
        layer_kwargs: MixerLayer options for every spec layer (sizes, conv_size, chunk_size, ...).
    """

    model_type = "mixc"

    pattern: list[str] | None = None
    specs: dict[str, str] | None = None
    vocab_size: int = 256
    hidden_size: int = 128
    num_heads: int = 4
    mlp_ratio: int = 4
    layer_kwargs: dict[str, Any] | None = None
    tie_word_embeddings: bool = True
    use_cache: bool = True

    @classmethod
    def from_pattern(
        cls,
        pattern: Sequence,
        vocab_size: int,
        hidden_size: int = 128,
        num_heads: int = 4,
        *,
        mlp_ratio: int = 4,
        **layer_kwargs,
    ) -> MixcConfig:
        """The config of `LanguageModel(pattern, vocab_size, ...)`: each spec of the pattern (a
        path, a Source or a loaded Spec) is read and kept as text under its mixer's name."""
        if isinstance(pattern, str | os.PathLike) or not isinstance(pattern, Sequence):
            raise MixcError(f"pattern: expected a list of specs or 'attention', got {pattern!r}")
        entries, specs = [], {}
        for entry in pattern:
            if is_attention(entry):
                entries.append(entry)
                continue
            spec = entry if hasattr(entry, "mixer") else load_spec(_source(entry))
            name = spec.mixer.name
            if is_attention(name):
                raise MixcError(
                    f"pattern: a spec names its mixer {name!r}, which the config would read as "
                    "an attention layer; rename the mixer"
                )
            if specs.get(name, spec.source.text) != spec.source.text:
                raise MixcError(
                    f"pattern: two different specs name their mixer {name!r}; rename one "
                    "(the config keeps specs by mixer name)"
                )
            specs[name] = spec.source.text
            entries.append(name)
        config = cls(
            pattern=entries,
            specs=specs,
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            num_heads=num_heads,
            mlp_ratio=mlp_ratio,
            layer_kwargs=dict(layer_kwargs),
        )
        config.layer_options()  # the options are MixerLayer's
        return config

    def layer_pattern(self) -> list:
        """The LanguageModel pattern this config describes: attention entries as they are, spec
        names as Sources of their text (located as `<config specs['name']>` in errors)."""
        pattern, specs = self.pattern, self.specs or {}
        if not isinstance(pattern, list) or not pattern:
            raise MixcError(
                f"config: pattern: expected a non-empty list of layers, got {pattern!r}"
            )
        if not isinstance(specs, dict):
            raise MixcError(f"config: specs: expected spec text by name, got {specs!r}")
        out = []
        for entry in pattern:
            if not isinstance(entry, str):
                raise MixcError(f"config: pattern: expected layer names, got {entry!r}")
            if is_attention(entry):
                out.append(entry)
            elif entry in specs:
                text = specs[entry]
                if not isinstance(text, str):
                    raise MixcError(f"config: specs[{entry!r}]: expected spec text, got {text!r}")
                out.append(Source(text, f"<config specs[{entry!r}]>"))
            else:
                raise MixcError(
                    f"config: pattern: {entry!r} is neither 'attention', 'attention:N' nor a "
                    f"spec in specs ({', '.join(map(repr, specs)) or 'none'})"
                )
        return out

    def layer_options(self) -> dict[str, Any]:
        """`layer_kwargs`, checked to be MixerLayer options."""
        options = self.layer_kwargs or {}
        if not isinstance(options, dict):
            raise MixcError(f"config: layer_kwargs: expected a dict, got {options!r}")
        unknown = sorted(set(options) - set(LAYER_OPTIONS))
        if unknown:
            raise MixcError(
                f"config: layer_kwargs: {', '.join(map(repr, unknown))} unknown (MixerLayer "
                f"takes {', '.join(LAYER_OPTIONS)})"
            )
        return options


def _source(entry) -> Source:
    if not isinstance(entry, str | os.PathLike | Source):
        raise MixcError(f"pattern: expected a spec or 'attention', got {entry!r}")
    return source_of(entry)


def _map_tensors(x, f: Callable[[torch.Tensor], torch.Tensor]):
    """x with f applied to every tensor inside it (tuples, lists, dicts, dataclasses)."""
    if isinstance(x, torch.Tensor):
        return f(x)
    if isinstance(x, tuple | list):
        return type(x)(_map_tensors(v, f) for v in x)
    if isinstance(x, dict):
        return {k: _map_tensors(v, f) for k, v in x.items()}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        changes = {fd.name: _map_tensors(getattr(x, fd.name), f) for fd in dataclasses.fields(x)}
        return dataclasses.replace(x, **changes)
    return x


def _this_call(mask, seen: int, shape) -> torch.Tensor | None:
    """The attention mask's columns for this call's tokens: all of a [B, T] mask, the last T
    of a [B, seen + T] one (transformers' generate passes the mask of every token so far)."""
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        return mask  # None, or refused with its shape by the layers
    B, T = shape
    if seen and mask.shape == (B, seen + T):
        return mask[:, seen:]
    if mask.shape != (B, T):
        also = f" or [{B}, {seen + T}] (cached and new tokens)" if seen else ""
        raise MixcError(
            f"attention_mask: expected [B, T] = [{B}, {T}]{also}, got {list(mask.shape)}"
        )
    return mask


class MixcCache:
    """What decoding continues from: each layer's own cache (MixerCache or AttentionCache) and
    how many tokens it has seen. `generate` passes it back to the model as `cache`."""

    def __init__(self, layers: list, seen: int) -> None:
        self.layers = layers
        self.seen = seen

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Keep the sequences `beam_idx` names, in that order (beam search)."""
        self.layers = [_map_tensors(c, lambda t: t.index_select(0, beam_idx)) for c in self.layers]

    def __repr__(self) -> str:
        return f"MixcCache({len(self.layers)} layers, {self.seen} tokens)"


class MixcForCausalLM(PreTrainedModel, GenerationMixin):
    """A LanguageModel behind transformers' interface: forward(input_ids, ...) returns a
    CausalLMOutputWithPast (with the loss when `labels` are given), and `generate` decodes
    from mixc's per-layer caches."""

    config_class = MixcConfig
    base_model_prefix = "model"
    _no_split_modules: ClassVar[list[str]] = ["Block"]

    def __init__(self, config: MixcConfig) -> None:
        super().__init__(config)
        self.model = LanguageModel(
            config.layer_pattern(),
            config.vocab_size,
            config.hidden_size,
            config.num_heads,
            mlp_ratio=config.mlp_ratio,
            **config.layer_options(),
        )
        self.post_init()

    @classmethod
    def get_init_context(cls, *args, **kwargs):
        """transformers builds a loading model on the meta device; mixc's layers compute their
        starting decays while they are built, which needs real tensors, so they are built on the
        default device (the checkpoint then overwrites every weight)."""
        contexts = super().get_init_context(*args, **kwargs)
        return [c for c in contexts if not isinstance(c, torch.device)]

    def _init_weights(self, module) -> None:
        """Nothing: each mixc module starts itself as it is built (decays near 1, ...)."""

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model keeps its own cache (MixcCache), see the module's docstring

    def get_input_embeddings(self):
        return self.model.embed

    def set_input_embeddings(self, value) -> None:
        self.model.embed = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: MixcCache | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        return_dict: bool | None = None,
        past_key_values: MixcCache | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **unused,
    ) -> CausalLMOutputWithPast:
        """input_ids [B, T]; `cache` (or the older name `past_key_values`) continues the
        sequences of an earlier call; `attention_mask` ([B, T], or [B, cached + T] as
        `generate` passes it; 1: a token, 0: padding) makes each row the sequence of its tokens
        alone, which numbers them from its own first token: `position_ids` are then not read
        (without a mask they must be the positions that follow the cache); `labels` [B, T] give
        the next-token cross-entropy (-100: ignored). Other keyword arguments of transformers'
        models (output_attentions, ...) are accepted and unused."""
        cache = cache if cache is not None else past_key_values
        if input_ids is None or inputs_embeds is not None:
            raise MixcError("input_ids: required (mixc's model takes tokens, not embeddings)")
        if cache is not None and not isinstance(cache, MixcCache):
            raise MixcError(f"cache: expected the MixcCache of an earlier call, got {cache!r}")
        seen = 0 if cache is None else cache.seen
        attention_mask = _this_call(attention_mask, seen, input_ids.shape)
        if position_ids is not None and attention_mask is None:
            expected = torch.arange(seen, seen + input_ids.shape[1], device=position_ids.device)
            if not bool((position_ids == expected).all()):
                raise MixcError(
                    f"position_ids: expected {seen} to {seen + input_ids.shape[1] - 1} in every "
                    "row (the positions after the cache; for padding, pass attention_mask)"
                )
        use_cache = self.config.use_cache if use_cache is None else use_cache
        logits, layers = self.model(
            input_ids,
            None if cache is None else cache.layers,
            use_cache=use_cache,
            attention_mask=attention_mask,
        )
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100
            )
        new = MixcCache(layers, seen + input_ids.shape[1]) if use_cache else None
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=new)


AutoConfig.register(MixcConfig.model_type, MixcConfig, exist_ok=True)
AutoModelForCausalLM.register(MixcConfig, MixcForCausalLM, exist_ok=True)
