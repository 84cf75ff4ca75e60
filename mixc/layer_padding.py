"""Padded batches in the layers: an `attention_mask` ([B, T], 1 for a token, 0 for padding, on
either side or anywhere in a row) makes each row the sequence of its real tokens, computed
exactly as that sequence run alone.

The layers do it by packing, not by masking: each row's real tokens are moved to its front in
their order (`Packing.compact`, a stable sort of the mask), where the short causal convolution
sees only them and the cache's last inputs; the mixer then runs the real tokens of every row as
packed sequences (`cu_seqlens`, which every compiled form takes), each from its row's state;
padding positions come out as zeros. A padding token never enters a convolution or a state, for
every spec: masking the inputs instead would need, for each spec, inputs that make its
transition the identity and its writes zero, which the spec does not always have (a write with a
constant term), and measured no faster (docs/layers.md).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from mixc.errors import MixcError

__all__ = ["Packing", "check_mask", "packing"]


def check_mask(mask, batch: int, length: int, device: torch.device) -> torch.Tensor | None:
    """The attention mask as a bool [B, T] tensor, or None where it has no padding (or is None;
    under torch.compile, only where it is None). It may be bool, integer or floating, of 0 and
    1 only (not checked under torch.compile)."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        raise MixcError(f"attention_mask: expected a tensor [B, T] of 0 and 1, got {mask!r}")
    if tuple(mask.shape) != (batch, length):
        raise MixcError(
            f"attention_mask: expected [B, T] = [{batch}, {length}] like the input, "
            f"got {list(mask.shape)}"
        )
    if mask.device != device:
        raise MixcError(
            f"attention_mask: expected a tensor on {device} (like the input), got one on "
            f"{mask.device}"
        )
    if mask.is_complex():
        raise MixcError(f"attention_mask: expected 0 and 1, got {mask.dtype}")
    compiling = torch.compiler.is_compiling()  # no branch on the mask's values there
    if mask.dtype != torch.bool:
        if not compiling and mask.numel() and not bool(((mask == 0) | (mask == 1)).all()):
            bad = mask[(mask != 0) & (mask != 1)][0].item()
            raise MixcError(f"attention_mask: expected 1 for a token and 0 for padding, got {bad}")
        mask = mask != 0
    return mask if compiling or not bool(mask.all()) else None


@dataclass(frozen=True)
class Packing:
    """Where each row's real tokens are: `order` [B, T] lists a row's positions, its real
    tokens first (in order), `lengths` [B] counts them, `valid` [B, T] marks the first
    `lengths` positions of the compacted rows, `cu_seqlens` [B + 1] are the offsets of the
    packed sequences. `tokens` and `firsts` index the real tokens in the flattened [B * T]
    rows, original and compacted, and `total` counts them: found when first asked for (by the
    packed sequences, with a cache), since their sizes depend on the mask's values, which a
    torch.compile graph cannot (the compacted rows need none of them: see `expand`)."""

    mask: torch.Tensor
    order: torch.Tensor
    lengths: torch.Tensor
    valid: torch.Tensor
    cu_seqlens: torch.Tensor

    @functools.cached_property
    def tokens(self) -> torch.Tensor:
        return self.mask.flatten().nonzero()[:, 0]

    @functools.cached_property
    def firsts(self) -> torch.Tensor:
        return self.valid.flatten().nonzero()[:, 0]

    @property
    def total(self) -> int:
        return len(self.tokens)

    def compact(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, ...] with each row's real tokens moved to its front, in order, and zeros
        after them."""
        index = self.order.view(*self.order.shape, *[1] * (x.dim() - 2))
        valid = self.valid.view(index.shape)
        return torch.where(valid, x.gather(1, index.expand(x.shape)), x.new_zeros(()))

    def expand(self, y: torch.Tensor) -> torch.Tensor:
        """y [B, T, ...] of compacted rows (`compact`) -> the original layout, zeros at padding
        (a scatter by `order`, a permutation of each row: every position written once)."""
        index = self.order.view(*self.order.shape, *[1] * (y.dim() - 2)).expand(y.shape)
        real = torch.where(self.valid.view(index.shape[:2] + (1,) * (y.dim() - 2)), y, 0.0)
        return y.new_zeros(y.shape).scatter(1, index, real)

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, ...] in the original layout -> the real tokens as one row [1, total, ...]."""
        return x.flatten(0, 1).index_select(0, self.tokens)[None]

    def pack_compacted(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, ...] compacted (`compact`) -> the real tokens as one row [1, total, ...]."""
        return x.flatten(0, 1).index_select(0, self.firsts)[None]

    def unpack(self, y: torch.Tensor) -> torch.Tensor:
        """y [1, total, ...] -> [B, T, ...] in the original layout, zeros at padding."""
        out = y.new_zeros(self.mask.numel(), *y.shape[2:])
        return out.index_copy(0, self.tokens, y[0]).unflatten(0, self.mask.shape)

    def last(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """The last n rows of each sequence in x [B, n + T, ...] (n earlier inputs, then the
        compacted row): positions lengths .. lengths + n - 1."""
        index = self.lengths[:, None] + torch.arange(n, device=x.device)
        index = index.view(*index.shape, *[1] * (x.dim() - 2))
        return x.gather(1, index.expand(x.shape[0], n, *x.shape[2:]))


def packing(mask: torch.Tensor) -> Packing:
    """The packing of a bool [B, T] mask (`check_mask`)."""
    order = torch.argsort((~mask).to(torch.uint8), dim=1, stable=True)
    lengths = mask.sum(1)
    valid = torch.arange(mask.shape[1], device=mask.device) < lengths[:, None]
    cu_seqlens = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
    return Packing(mask, order, lengths, valid, cu_seqlens)
