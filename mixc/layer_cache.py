"""`MixerCache`: what a `mixc.nn.MixerLayer` call returns so that a later call continues the same
sequences exactly (prefill, then decode token by token), and the check that a cache given back
to a layer is one of its own, for the batch it is called with."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mixc.errors import MixcError
from mixc.layer_checks import size_of

__all__ = ["MixerCache", "check_cache"]


@dataclass
class MixerCache:
    """What decoding needs to continue exactly: the mixer's states and each convolution's last
    inputs (`conv_size - 1` tokens per convolved input). `layer` is the id of the layer whose
    call made it, which refuses it elsewhere (layers of one model have caches of one shape); a
    cache built by hand leaves it None and is checked for its shapes only."""

    states: object
    conv: dict[str, torch.Tensor]
    layer: int | None = None


def check_cache(cache, batch: int, layer) -> None:
    """cache is a MixerCache of `layer`'s structure (its states, and its convolutions' last
    inputs) for `batch` sequences."""
    if not isinstance(cache, MixerCache):
        raise MixcError(f"state: expected the MixerCache of an earlier call, got {cache!r}")
    if cache.layer is not None and cache.layer != id(layer):
        raise MixcError("state: the cache is another layer's (each layer continues its own)")
    states = cache.states if isinstance(cache.states, tuple) else (cache.states,)
    shapes = [
        (layer.num_v_heads, *(size_of(s, layer.sizes) for s in d.shape))
        for d in layer.spec.mixer.carried
    ]
    tails = {name: layer.conv_size - 1 for name in layer.conv_inputs}
    fits = (
        len(states) == len(shapes)
        and all(isinstance(x, torch.Tensor) and x.dim() >= 1 for x in states)
        and set(cache.conv) == set(tails)
        and all(isinstance(x, torch.Tensor) and x.dim() == 3 for x in cache.conv.values())
    )
    if fits:
        fits = all(tuple(x.shape[1:]) == shape for x, shape in zip(states, shapes)) and all(
            tuple(cache.conv[n].shape[1:]) == (tails[n], layer.proj[n].out_features) for n in tails
        )
    if not fits:
        raise MixcError(
            f"state: the cache is not one of this layer's ({layer.spec.mixer.name} with "
            f"{layer.num_v_heads} value heads, sizes {layer.sizes}, conv_size {layer.conv_size})"
        )
    held = {x.shape[0] for x in (*states, *cache.conv.values())}
    if held and held != {batch}:  # a stateless mixer without a convolution holds nothing
        raise MixcError(
            f"state: the cache holds {', '.join(map(str, sorted(held)))} sequences, "
            f"x has B = {batch}"
        )
