"""`MixerLayer`: a compiled mixer as a drop-in torch.nn.Module.

    layer = MixerLayer("specs/gated_deltanet.mix", hidden_size=256, num_heads=4)
    y, cache = layer(x, use_cache=True)           # x: [B, T, hidden]
    y_next, cache = layer(x_next, state=cache, use_cache=True)

Each spec input gets a projection from the hidden state (vectors `Linear(hidden, NH * d)`,
per-token scalars `Linear(hidden, NH)`), then a chain of transforms (`TRANSFORMS`), optionally a
short causal depthwise convolution first. Per-head parameters without a default are learnable
(`PARAM_INITS`). The mixer's output per head goes through an optional RMSNorm and an optional
output gate, then an output projection. Nothing here depends on which mixer the spec is.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from mixc.algebra.expand import inline
from mixc.analysis.plan import analyze
from mixc.driver import load
from mixc.errors import MixcError
from mixc.frontend.ir import Binary, Name, walk
from mixc.frontend.spec import load_spec

__all__ = ["PARAM_INITS", "TRANSFORMS", "MixerCache", "MixerLayer", "default_transforms"]


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


#: Transforms applied to a projected input, by name (applied in order).
TRANSFORMS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "identity": lambda x: x,
    "silu": F.silu,
    "relu": F.relu,
    "sigmoid": torch.sigmoid,
    "softplus": F.softplus,
    "logsigmoid": F.logsigmoid,  # a log-decay in (-inf, 0)
    "l2norm": _l2norm,  # over the vector's entries
    "elu_plus_one": lambda x: F.elu(x) + 1,
}


def default_transforms(spec) -> dict[str, list[str]]:
    """Sensible transforms per input, from the analysis of the spec:
    - keys and queries of a delta rule: silu then l2norm (the recurrence needs |k| <= 1);
    - beta of a delta rule: sigmoid (in (0, 1));
    - an input used as a log-decay (`exp(g_t)` as a decay): logsigmoid (so g <= 0); one used
      as the decay itself (`G_t ⊙ H_{t-1}`): sigmoid (in (0, 1));
    - dt (Mamba-2's step): softplus, after a learnable per-head bias;
    - other vectors: silu on q and k; v and the rest unchanged.
    """
    facts = analyze(spec)
    out: dict[str, list[str]] = {}
    names = {d.name for d in spec.mixer.inputs}
    for s in facts.states:
        tr = s.transition
        for g in tr.gates:
            if _is_plain_input(g.log, names):
                out[str(g.log).removesuffix("_t")] = ["logsigmoid"]
            elif _is_plain_input(g.decay, names):
                out[str(g.decay).removesuffix("_t")] = ["sigmoid"]
        if tr.key is not None and _is_plain_input(tr.key, names):
            key = str(tr.key).removesuffix("_t")
            out[key] = ["silu", "l2norm"]
            for o in facts.outputs:
                for r in o.readouts:
                    if _is_plain_input(r.query, names):
                        out[str(r.query).removesuffix("_t")] = ["silu", "l2norm"]
        if tr.beta is not None and _is_plain_input(tr.beta, names):
            out[str(tr.beta).removesuffix("_t")] = ["sigmoid"]
    for d in spec.mixer.inputs:
        if d.name in out:
            continue
        if d.name == "dt":
            out[d.name] = ["softplus"]
        elif d.name in ("q", "k") and d.shape:
            out[d.name] = ["silu"]
        else:
            out[d.name] = ["identity"]
    return out


def _is_plain_input(expr, names) -> bool:
    from mixc.frontend.ir import Timed

    return isinstance(expr, Timed) and expr.name in names


def _a_log_init(*shape: int) -> torch.Tensor:
    """A_log for A = -exp(A_log): per head, uniform in log(1..16) (Mamba-2's scalar A); for a
    matrix A[P, N], log(1), ..., log(N) along every row (Mamba-1's S4D-real initialisation)."""
    if len(shape) == 3:
        rows = torch.log(torch.arange(1, shape[-1] + 1, dtype=torch.get_default_dtype()))
        return rows.expand(*shape).clone()
    return torch.log(torch.empty(*shape).uniform_(1, 16))


#: Initialisation of learnable per-head parameters, by name: (stored name, init(*shape), to
#: value). A is stored as A_log with A = -exp(A_log) (Mamba-2), so it stays negative. Any other
#: parameter starts at 0, or at 1 where the spec divides by it (a temperature).
PARAM_INITS: dict[
    str, tuple[str, Callable[..., torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]
] = {
    "A": ("A_log", _a_log_init, lambda p: -torch.exp(p)),
    "D": ("D", torch.ones, lambda p: p),
}


def _divisors(mixer) -> set[str]:
    """The parameters the spec divides by (under a `/`, let functions inlined): starting them at
    0 would make the first step divide by 0."""
    params = {p.name for p in mixer.params}
    found = set()
    for eq in mixer.equations:
        for e in walk(inline(mixer, eq.value)):
            if isinstance(e, Binary) and e.op == "/":
                found |= {n.name for n in walk(e.right) if isinstance(n, Name)} & params
    return found


def _count(name: str, value, least: int = 1) -> int:
    """value as an int of at least `least`, or a MixcError naming the argument (a bool or a
    float is refused, not read as a number of things)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        kind = "a positive int" if least == 1 else f"an int >= {least}"
        raise MixcError(f"{name}: expected {kind}, got {value!r}")
    return int(value)


def _names(name: str, value) -> list[str]:
    """A list or tuple of names (a bare string would be read letter by letter)."""
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise MixcError(f"{name}: expected a list of names, got {value!r}")
    return list(value)


@dataclass
class MixerCache:
    """What decoding needs to continue exactly: the mixer's states and each convolution's last
    inputs (`conv_size - 1` tokens per convolved input). `layer` is the id of the layer whose
    call made it, which refuses it elsewhere (layers of one model have caches of one shape); a
    cache built by hand leaves it None and is checked for its shapes only."""

    states: object
    conv: dict[str, torch.Tensor]
    layer: int | None = None


class MixerLayer(nn.Module):
    """A token mixer from a spec: projections in, the compiled recurrence, projection out.

    Args:
        spec: a spec path, a Source or a loaded Spec (for spec text, load_spec(text=...)).
        hidden_size, num_heads: model width and number of heads.
        sizes: the spec's size symbols per head, e.g. {"K": 64, "V": 64}; default
            hidden_size // num_heads for every symbol.
        transforms: input name -> list of TRANSFORMS names, overriding `default_transforms`.
        conv_size: kernel size of a short causal depthwise convolution on `conv_inputs`
            (0 turns it off); default 4.
        conv_inputs: which vector inputs are convolved; default all vector inputs.
        output_gate: multiply by silu(Linear(x)) before the output projection.
        norm: RMSNorm over each head's output.
        chunk_size: chunk size of the chunked form.
    """

    def __init__(
        self,
        spec,
        hidden_size: int,
        num_heads: int,
        *,
        sizes: dict[str, int] | None = None,
        transforms: dict[str, Sequence[str]] | None = None,
        conv_size: int = 4,
        conv_inputs: Sequence[str] | None = None,
        output_gate: bool = True,
        norm: bool = True,
        chunk_size: int = 64,
    ) -> None:
        super().__init__()
        self.spec = (
            spec
            if hasattr(spec, "mixer")
            else load_spec(os.fspath(spec) if isinstance(spec, os.PathLike) else spec)
        )
        self.mixer = load(self.spec.source)
        self.hidden_size = _count("hidden_size", hidden_size)
        self.num_heads = _count("num_heads", num_heads)
        self.chunk_size = _count("chunk_size", chunk_size)
        if self.chunk_size & (self.chunk_size - 1):
            raise MixcError(f"chunk_size: expected a power of two, got {chunk_size}")
        self.sizes = self._sizes_per_head({} if sizes is None else sizes)
        self.transforms = self._transforms({} if transforms is None else transforms)
        self._build_inputs(_count("conv_size", conv_size, least=0), conv_inputs)
        self._build_params()
        self._build_output(output_gate, norm)

    def _sizes_per_head(self, given: Mapping[str, int]) -> dict[str, int]:
        """Every size symbol of the spec: as given, else the head width hidden_size / num_heads
        (which must then be a whole, positive number)."""
        mixer = self.spec.mixer
        symbols = {
            s
            for d in (*mixer.inputs, *mixer.states, *mixer.params)
            for s in d.shape
            if not s.isdigit()
        }
        if not isinstance(given, Mapping):
            raise MixcError(f"sizes: expected a dict of sizes by symbol, got {given!r}")
        unknown = set(given) - symbols
        if unknown:
            raise MixcError(
                f"sizes: {', '.join(sorted(unknown))} not in the spec "
                f"(it has {', '.join(sorted(symbols))})"
            )
        out = {s: _count(f"sizes: {s}", given[s]) for s in sorted(given)}
        defaulted = sorted(symbols - set(given))
        hidden, heads = self.hidden_size, self.num_heads
        if defaulted and hidden % heads:
            what = ", ".join(defaulted)
            problem = (
                f"is smaller than num_heads = {heads}: {what} would be 0"
                if hidden < heads
                else f"is not a multiple of num_heads = {heads}: {what} would be {hidden / heads:g}"
            )
            raise MixcError(f"hidden_size: {hidden} {problem}; pass sizes={{...}} for {what}")
        return {s: out.get(s, hidden // heads) for s in sorted(symbols)}

    def _transforms(self, overrides: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
        """The default transforms of every input, with the user's overrides checked in."""
        out = default_transforms(self.spec)
        if not isinstance(overrides, Mapping):
            raise MixcError(f"transforms: expected a dict of lists by input, got {overrides!r}")
        for name, given in overrides.items():
            if name not in out:
                raise MixcError(f"transforms: {name} is not an input of {self.spec.mixer.name}")
            chain = _names(f"transforms: {name}", given)
            bad = [t for t in chain if t not in TRANSFORMS]
            if bad:
                raise MixcError(
                    f"transforms: unknown {bad[0]!r}; choose from {', '.join(TRANSFORMS)}"
                )
            out[name] = list(chain)
        return out

    def _build_inputs(self, conv_size: int, conv_inputs: Sequence[str] | None) -> None:
        """A projection per input, a short causal convolution per convolved vector input, and
        a per-head bias for dt."""
        mixer, heads = self.spec.mixer, self.num_heads
        self.dims = {d.name: [self._size(s) for s in d.shape] for d in mixer.inputs}
        self.proj = nn.ModuleDict(
            {
                name: nn.Linear(self.hidden_size, heads * math.prod(dims), bias=False)
                for name, dims in self.dims.items()
            }
        )
        vectors = [d.name for d in mixer.inputs if len(d.shape) == 1]
        chosen = vectors if conv_inputs is None else _names("conv_inputs", conv_inputs)
        for name in chosen:
            if name not in vectors:
                what = "a per-token scalar" if name in self.dims else "not an input"
                raise MixcError(
                    f"conv_inputs: {name} is {what} of {mixer.name}; only vector inputs are "
                    f"convolved ({', '.join(vectors) or 'it has none'})"
                )
        self.conv_inputs = list(chosen) if conv_size > 1 else []
        self.conv_size = conv_size
        self.conv = nn.ModuleDict(
            {
                name: nn.Conv1d(
                    heads * self.dims[name][0],
                    heads * self.dims[name][0],
                    conv_size,
                    groups=heads * self.dims[name][0],
                    padding=0,
                    bias=False,
                )
                for name in self.conv_inputs
            }
        )
        scalar_dt = "dt" in self.dims and not self.dims["dt"]
        self.dt_bias = nn.Parameter(torch.zeros(heads)) if scalar_dt else None

    def _build_params(self) -> None:
        """The learnable per-head parameters (those without a default)."""
        mixer = self.spec.mixer
        self.learned = [p.name for p in mixer.params if p.default is None]
        divisors = _divisors(mixer)
        for param in mixer.params:
            if param.default is not None:
                continue
            start = torch.ones if param.name in divisors else torch.zeros
            stored, init, _ = PARAM_INITS.get(param.name, (param.name, start, lambda p: p))
            value = init(self.num_heads, *(self._size(s) for s in param.shape))
            self.register_parameter(stored, nn.Parameter(value))

    def _build_output(self, output_gate: bool, norm: bool) -> None:
        """RMSNorm per head, the output gate and the output projection."""
        mixer = self.spec.mixer
        out_shape = self.spec.shapes[mixer.outputs[0].target]
        self.head_out = 1 if out_shape == ("1", "1") else self._size(out_shape[0])
        width = self.num_heads * self.head_out
        self.norm = nn.RMSNorm(self.head_out, eps=1e-6) if norm else None
        self.gate = nn.Linear(self.hidden_size, width, bias=False) if output_gate else None
        self.out_proj = nn.Linear(width, self.hidden_size, bias=False)

    def _size(self, symbol: str) -> int:
        return int(symbol) if symbol.isdigit() else self.sizes[symbol]

    def _params(self) -> list[torch.Tensor]:
        values = []
        for name in self.learned:
            stored, _, to_value = PARAM_INITS.get(name, (name, None, lambda p: p))
            values.append(to_value(getattr(self, stored)))
        return values

    def forward(self, x: torch.Tensor, state: MixerCache | None = None, use_cache: bool = False):
        """x: [B, T, hidden]. Returns (y [B, T, hidden], cache or None). A cache from an earlier
        call continues that sequence exactly (prefill, then decode token by token)."""
        self._check_x(x)
        B, T, _ = x.shape
        if state is not None:
            self._check_cache(state, B)
        inputs, tails = [], {}
        for name, dims in self.dims.items():
            h = self.proj[name](x)
            if name in self.conv:
                past = (
                    state.conv[name]
                    if state is not None
                    else h.new_zeros(B, self.conv_size - 1, h.shape[-1])
                )
                h_full = torch.cat([past.to(h.dtype), h], 1)
                tails[name] = h_full[:, -(self.conv_size - 1) :]
                h = F.silu(self.conv[name](h_full.transpose(1, 2)).transpose(1, 2))
            h = h.view(B, T, self.num_heads, *dims)
            if name == "dt" and self.dt_bias is not None:
                h = h + self.dt_bias
            for t in self.transforms[name]:
                h = TRANSFORMS[t](h)
            inputs.append(h)
        states = state.states if state is not None else None
        form = self.mixer.chunk if "chunk" in self.mixer.FORMS else self.mixer.recurrent
        kw = {"chunk_size": self.chunk_size} if "chunk" in self.mixer.FORMS else {}
        y, new_states = form(
            *inputs, *self._params(), initial_state=states, output_final_state=use_cache, **kw
        )
        y = y.reshape(B, T, self.num_heads, self.head_out)
        if self.norm is not None:
            y = self.norm(y)
        y = y.reshape(B, T, -1)
        if self.gate is not None:
            y = y * F.silu(self.gate(x))
        y = self.out_proj(y)
        return y, (MixerCache(new_states, tails, id(self)) if use_cache else None)

    def _check_x(self, x) -> None:
        """x is a [B, T, hidden] tensor with T >= 1, in the dtype of the layer's parameters."""
        if not isinstance(x, torch.Tensor):
            raise MixcError(f"x: expected a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 3 or x.shape[-1] != self.hidden_size:
            raise MixcError(f"x: expected [B, T, {self.hidden_size}], got {list(x.shape)}")
        dtype = self.out_proj.weight.dtype
        if x.dtype != dtype:
            raise MixcError(
                f"x: expected {dtype} like the layer's parameters, got {x.dtype} "
                "(convert x, or the layer with .to(dtype))"
            )
        if x.shape[1] == 0:
            raise MixcError("x: the sequence is empty (T = 0); a call needs at least one token")

    def _check_cache(self, cache, batch: int) -> None:
        """cache is a MixerCache of this layer's structure for `batch` sequences."""
        if not isinstance(cache, MixerCache):
            raise MixcError(f"state: expected the MixerCache of an earlier call, got {cache!r}")
        if cache.layer is not None and cache.layer != id(self):
            raise MixcError("state: the cache is another layer's (each layer continues its own)")
        states = cache.states if isinstance(cache.states, tuple) else (cache.states,)
        shapes = [
            (self.num_heads, *(self._size(s) for s in d.shape)) for d in self.spec.mixer.carried
        ]
        tails = {name: self.conv_size - 1 for name in self.conv_inputs}
        fits = (
            len(states) == len(shapes)
            and all(isinstance(x, torch.Tensor) and x.dim() >= 1 for x in states)
            and set(cache.conv) == set(tails)
            and all(isinstance(x, torch.Tensor) and x.dim() == 3 for x in cache.conv.values())
        )
        if fits:
            fits = all(tuple(x.shape[1:]) == shape for x, shape in zip(states, shapes)) and all(
                tuple(cache.conv[n].shape[1:]) == (tails[n], self.proj[n].out_features)
                for n in tails
            )
        if not fits:
            raise MixcError(
                f"state: the cache is not one of this layer's ({self.spec.mixer.name} with "
                f"{self.num_heads} heads, sizes {self.sizes}, conv_size {self.conv_size})"
            )
        held = {x.shape[0] for x in (*states, *cache.conv.values())}
        if held != {batch}:
            raise MixcError(
                f"state: the cache holds {', '.join(map(str, sorted(held)))} sequences, "
                f"x has B = {batch}"
            )
