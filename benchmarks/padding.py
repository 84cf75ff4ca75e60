"""Padded batches in MixerLayer: packing (what the layer does) against masking, timed.

    python benchmarks/padding.py [--spec specs/gated_deltanet.mix] [--threads 1]

The layer moves each row's real tokens to its front (for the convolution); without a cache to
return it runs those compacted rows as they are (causal forms: the padding after a row's tokens
cannot reach them), and with one it packs them into sequences (cu_seqlens) whose final states
are exact. Masking, the other way, is prototyped here only: it zeroes every input
at padding (before the convolution and after the transforms) and runs the whole padded batch.
That is exact only for left padding from a zero state and for a spec whose zero inputs make an
identity transition with no write (gated_deltanet: g = 0, beta = 0), so the layer packs; this
script checks the two agree on such a spec, then times both (B=4, T=512, 25% padding on the
left), with the unpadded batch (every token real)
for scale. Medians of interleaved calls,
in CPU time of the process.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from mixc.nn import MixerLayer


def masked(layer: MixerLayer, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The masking prototype: every input zeroed at padding, the whole batch run."""
    B, T, _ = x.shape
    m = mask.to(x.dtype)
    inputs = []
    for name, dims in layer.dims.items():
        h = layer.proj[name](x) * m[..., None]
        if name in layer.conv:
            h = F.pad(h, (0, 0, layer.conv_size - 1, 0))
            h = F.silu(layer.conv[name](h.transpose(1, 2)).transpose(1, 2))
        h = h.view(B, T, layer.heads[name], *dims)
        if name in layer.bias:
            h = h + layer.bias[name]
        h = layer._transformed(name, h) * m.view(B, T, 1, *[1] * len(dims))
        inputs.append(h)
    y, _ = layer.mixer.chunk(*inputs, *layer._params(), chunk_size=layer.chunk_size)
    y = layer.norm(y.reshape(B, T, layer.num_v_heads, layer.head_out)).reshape(B, T, -1)
    return layer.out_proj(y * F.silu(layer.gate(x))) * m[..., None]


def timed(fn, backward: bool) -> float:
    """Milliseconds of this process's CPU time (all its threads): on a machine shared with other
    work, less disturbed than wall time."""
    start = time.process_time()
    if backward:
        fn().square().mean().backward()
    else:
        with torch.no_grad():
            fn()
    return (time.process_time() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default="specs/gated_deltanet.mix")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    B, T, hidden, heads = 4, 512, 256, 4
    layer = MixerLayer(args.spec, hidden, heads)
    x = torch.randn(B, T, hidden)
    lengths = [512, 384, 384, 256]  # 1536 of 2048 tokens: 25% padding
    mask = torch.zeros(B, T, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, T - n :] = 1
    with torch.no_grad():
        packed, ref = layer(x, attention_mask=mask)[0], masked(layer, x, mask)
    err = ((packed - ref).norm() / ref.norm()).item()
    print(f"{args.spec}: B={B} T={T} hidden={hidden} heads={heads} fp32, {args.threads} threads")
    print(f"packing vs masking: relative difference {err:.1e}")
    ways = {
        "unpadded (every token real)": lambda: layer(x)[0],
        "compacted rows (no cache)": lambda: layer(x, attention_mask=mask)[0],
        "packed (cu_seqlens, cache)": lambda: layer(x, attention_mask=mask, use_cache=True)[0],
        "masking (zero inputs)": lambda: masked(layer, x, mask),
    }
    for backward in (False, True):
        times = {name: [] for name in ways}
        for _ in range(2 + args.repeats):
            for name, fn in ways.items():
                times[name].append(timed(fn, backward))
        what = "forward+backward" if backward else "forward"
        for name, ts in times.items():
            print(f"  {what:16} {name:28} {statistics.median(ts[2:]):7.1f} ms")


if __name__ == "__main__":
    main()
