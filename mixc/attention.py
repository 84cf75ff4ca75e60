"""`Attention`: causal softmax attention with MixerLayer's calling convention, for hybrid stacks.

    layer = Attention(hidden_size=256, num_heads=4, window=None)
    y, cache = layer(x, use_cache=True)                   # x: [B, T, hidden]
    y_next, cache = layer(x_next, state=cache, use_cache=True)

Queries, keys and values are projections of the hidden state, rotated by their absolute
position (rotary embeddings), and `torch.nn.functional.scaled_dot_product_attention` mixes
them. With a `window`, each token attends to itself and the `window - 1` tokens before it (a
sliding window, as Samba and Griffin interleave with recurrent layers) and the cache keeps only
those; without one, the cache keeps every key and value. With an `attention_mask` (1: a
token, 0: padding), each row's tokens are numbered from its own first token and attend to its
own tokens only, so a padded row is computed as its sequence alone; the cache then keeps each
key's position (-1 for none), and decoding continues every row from its own position.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from mixc.errors import MixcError
from mixc.layer_checks import count
from mixc.layer_padding import check_mask

__all__ = ["Attention", "AttentionCache"]


@dataclass
class AttentionCache:
    """What decoding needs to continue exactly: the keys and values still in view
    ([B, NH, S, d], rotated) and how many tokens came before (the next token's position).
    `layer` is the id of the layer whose call made it. After a padded batch, `positions`
    [B, S] holds each key's position in its row (-1: no key there) and `counts` [B] the
    tokens each row has seen (`seen` is then the most)."""

    k: torch.Tensor
    v: torch.Tensor
    seen: int
    layer: int | None = None
    positions: torch.Tensor | None = None
    counts: torch.Tensor | None = None


def _rotate(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """Rotary position embedding of x [B, NH, T, d] at integer `positions` [T] (or [B, T], a
    row's own): each pair of channels (i, i + d/2) is rotated by the angle position *
    base^(-2i/d)."""
    half = x.shape[-1] // 2
    freq = base ** (-torch.arange(half, dtype=torch.float64, device=x.device) / half)
    angle = positions.to(torch.float64)[..., None] * freq
    if angle.dim() == 3:
        angle = angle[:, None]  # [B, 1, T, half]: one position per row and token
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    a, b = x[..., :half], x[..., half : 2 * half]
    rotated = torch.cat([a * cos - b * sin, a * sin + b * cos], -1)
    return torch.cat([rotated, x[..., 2 * half :]], -1)


class Attention(nn.Module):
    """Causal softmax attention: projections in, rotary positions, SDPA, projection out.

    Args:
        hidden_size, num_heads: model width and number of heads (head size hidden / heads).
        window: attend to at most this many tokens (itself included); None: every earlier one.
        rope_base: the base of the rotary frequencies.
        causal: False for an encoder's attention: every token attends to every token, and
            there is no cache (and no window).
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        *,
        window: int | None = None,
        rope_base: float = 10000.0,
        causal: bool = True,
    ) -> None:
        super().__init__()
        self.hidden_size = count("hidden_size", hidden_size)
        self.num_heads = count("num_heads", num_heads)
        if hidden_size % num_heads:
            raise MixcError(
                f"hidden_size: {hidden_size} is not a multiple of num_heads = {num_heads}"
            )
        self.head_size = hidden_size // num_heads
        self.window = None if window is None else count("window", window)
        self.rope_base = rope_base
        self.causal = causal
        if not causal and window is not None:
            raise MixcError("window: a sliding window looks back only; an encoder's has none")
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size, bias=False)
        self.out_proj = nn.Linear(hidden_size, hidden_size, bias=False)

    def state_size(self, seq_len: int) -> int:
        """Numbers per sequence the cache holds after `seq_len` tokens: a key and a value per
        token in view."""
        seen = seq_len if self.window is None else min(seq_len, self.window - 1)
        return 2 * self.hidden_size * seen

    def forward(
        self,
        x: torch.Tensor,
        state: AttentionCache | None = None,
        use_cache: bool = False,
        attention_mask: torch.Tensor | None = None,
    ):
        """x: [B, T, hidden]. Returns (y [B, T, hidden], cache or None); a cache from an
        earlier call continues that sequence exactly. attention_mask [B, T] (1: a token, 0:
        padding): each row is computed as the sequence of its tokens alone, y is 0 at padding."""
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.hidden_size:
            got = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise MixcError(f"x: expected [B, T, {self.hidden_size}], got {got}")
        B, T, _ = x.shape
        if T == 0:
            raise MixcError("x: the sequence is empty (T = 0); a call needs at least one token")
        if not self.causal and (state is not None or use_cache):
            raise MixcError(
                "an encoder's attention (causal=False) sees the whole sequence and "
                "has no cache; call it with use_cache=False and no state"
            )
        if state is not None:
            self._check_cache(state, B)
        mask = check_mask(attention_mask, B, T, x.device)
        if mask is not None or (state is not None and state.positions is not None):
            return self._padded(x, state, use_cache, mask)
        seen = 0 if state is None else state.seen
        q, k, v = self.qkv(x).view(B, T, 3, self.num_heads, self.head_size).permute(2, 0, 3, 1, 4)
        positions = torch.arange(seen, seen + T, device=x.device)
        q, k = _rotate(q, positions, self.rope_base), _rotate(k, positions, self.rope_base)
        if state is not None:
            k, v = torch.cat([state.k.to(k.dtype), k], 2), torch.cat([state.v.to(v.dtype), v], 2)
        S = k.shape[2]
        if self.window is None and state is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        else:
            key_pos = torch.arange(seen + T - S, seen + T, device=x.device)
            gap = positions[:, None] - key_pos[None, :]  # how far back each key is
            mask = gap >= 0
            if self.window is not None:
                mask = mask & (gap < self.window)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        y = self.out_proj(y.transpose(1, 2).reshape(B, T, self.hidden_size))
        if not use_cache:
            return y, None
        keep = S if self.window is None else min(S, self.window - 1)
        tail = slice(S - keep, S)
        return y, AttentionCache(k[:, :, tail], v[:, :, tail], seen + T, id(self))

    def _padded(self, x, state: AttentionCache | None, use_cache: bool, mask):
        """forward with each row numbered from its own first token: a query attends to the keys
        of its row at positions up to its own (within the window), or to all of them in an
        encoder (causal=False)."""
        B, T, _ = x.shape
        mask = torch.ones(B, T, dtype=torch.bool, device=x.device) if mask is None else mask
        q, k, v = self.qkv(x).view(B, T, 3, self.num_heads, self.head_size).permute(2, 0, 3, 1, 4)
        key_pos, counts = _cached_positions(state, B, x.device)
        q_pos = counts[:, None] + mask.cumsum(1) - 1  # [B, T]; at padding, its last token's
        q, k = _rotate(q, q_pos, self.rope_base), _rotate(k, q_pos, self.rope_base)
        if state is not None:
            k, v = torch.cat([state.k.to(k.dtype), k], 2), torch.cat([state.v.to(v.dtype), v], 2)
        key_pos = torch.cat([key_pos, torch.where(mask, q_pos, -1)], 1)  # [B, S]
        gap = q_pos[:, :, None] - key_pos[:, None, :]  # [B, T, S]
        see = key_pos[:, None, :] >= 0  # the row's tokens (not its padding)
        if self.causal:
            see = see & (gap >= 0)
        if self.window is not None:
            see = see & (gap < self.window)
        see = see | ~mask[:, :, None]  # a padding query sees everything; its y is zeroed
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=see[:, None])
        y = y.transpose(1, 2).reshape(B, T, self.hidden_size) * mask[..., None]
        y = self.out_proj(y)
        if not use_cache:
            return y, None
        counts = counts + mask.sum(1)
        keep = key_pos >= 0
        if self.window is not None:
            keep = keep & (key_pos > counts[:, None] - self.window)
        n = int(keep.sum(1).max())
        order = torch.argsort(keep.to(torch.uint8), dim=1, stable=True)[:, keep.shape[1] - n :]
        positions = torch.where(keep.gather(1, order), key_pos.gather(1, order), -1)
        index = order[:, None, :, None].expand(B, self.num_heads, n, self.head_size)
        cache = AttentionCache(
            k.gather(2, index), v.gather(2, index), int(counts.max()), id(self), positions, counts
        )
        return y, cache

    def _check_cache(self, cache, batch: int) -> None:
        if not isinstance(cache, AttentionCache):
            raise MixcError(f"state: expected the AttentionCache of an earlier call, got {cache!r}")
        if cache.layer is not None and cache.layer != id(self):
            raise MixcError("state: the cache is another layer's (each layer continues its own)")
        if cache.k.shape[0] != batch:
            raise MixcError(
                f"state: the cache holds {cache.k.shape[0]} sequences, x has B = {batch}"
            )


def _cached_positions(state: AttentionCache | None, batch: int, device) -> tuple:
    """The position of each cached key in its row ([B, S], -1 for none) and the tokens each
    row has seen ([B]), from a cache of either kind (or none)."""
    if state is None:
        return torch.zeros(batch, 0, dtype=torch.long, device=device), torch.zeros(
            batch, dtype=torch.long, device=device
        )
    if state.positions is not None:
        return state.positions, state.counts
    S = state.k.shape[2]
    positions = torch.arange(state.seen - S, state.seen, device=device).expand(batch, S)
    return positions, torch.full((batch,), state.seen, device=device)
