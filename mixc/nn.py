"""`MixerLayer`: a compiled mixer as a drop-in torch.nn.Module.

    layer = MixerLayer("specs/gated_deltanet.mix", hidden_size=256, num_heads=4)
    y, cache = layer(x, use_cache=True)           # x: [B, T, hidden]
    y_next, cache = layer(x_next, state=cache, use_cache=True)

Each spec input gets a projection from the hidden state (vectors `Linear(hidden, NH * d)`,
per-token scalars `Linear(hidden, NH)`), optionally a short causal depthwise convolution, a
learnable bias where a decay or an erase strength reads it, then a chain of transforms (`TRANSFORMS`). Per-head
parameters without a default are learnable. The mixer's output per head goes through an
optional RMSNorm and an optional output gate, then an output projection.

Nothing here depends on which mixer the spec is or what its inputs are called: the defaults
(transforms, biases, how parameters are stored and start) come from the roles the analysis
gives each input and parameter (`roles`, in `mixc.layer_roles`): the domains the transition
classes need for stability, and the decays of every state, which start near 1 (`DECAY_INIT`,
solved in `mixc.layer_init`), and its erase strengths, which start at 0.5 (`ERASE_INIT`). docs/layers.md compares them with flash-linear-attention's layers.
What the layer checks of its arguments is in `mixc.layer_checks`, its decoding cache in
`mixc.layer_cache`, how it runs a padded batch in `mixc.layer_padding`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from mixc.driver import load
from mixc.errors import MixcError, Source
from mixc.frontend.ir import angle_states
from mixc.frontend.spec import load_spec
from mixc.layer_cache import MixerCache, check_cache
from mixc.layer_checks import (
    angle_sizes,
    check_container_names,
    check_memory,
    check_no_cache,
    check_x,
    chosen_conv_inputs,
    chosen_mode,
    chosen_transforms,
    count,
    expanded_sizes,
    layer_spec,
    size_of,
    sizes_per_head,
    value_heads,
)
from mixc.layer_init import check_defaults, start_biases
from mixc.layer_padding import Packing, check_mask, packing
from mixc.layer_roles import (
    DECAY_INIT,
    DOMAIN_TRANSFORMS,
    PARAM_DOMAINS,
    PARAM_INITS,
    TRANSFORMS,
    Roles,
    default_transforms,
    roles,
    stored_as,
)

#: The layer's defaults (`mixc.layer_roles`) and its cache (`mixc.layer_cache`) are exported
#: here too, where the layer's users find them.
__all__ = [
    "DECAY_INIT",
    "DOMAIN_TRANSFORMS",
    "PARAM_DOMAINS",
    "PARAM_INITS",
    "TRANSFORMS",
    "MixerCache",
    "MixerLayer",
    "Roles",
    "default_transforms",
    "roles",
]


class MixerLayer(nn.Module):
    """A token mixer from a spec: projections in, the compiled recurrence, projection out.

    Args:
        spec: a spec path, a Source or a loaded Spec (for spec text, load_spec(text=...)).
        hidden_size, num_heads: model width and number of (query and key) heads.
        num_v_heads: number of value heads, each with its own state, a multiple of num_heads:
            each query and key head (the inputs `roles` finds read only as queries or keys) is
            shared by num_v_heads / num_heads consecutive value heads; default num_heads.
        expand_v: the value sizes (the output's, V in y[V]) are expand_v times the default.
        sizes: the spec's size symbols per head, e.g. {"K": 64, "V": 64}; default
            hidden_size // num_heads for every symbol.
        transforms: input name -> list of TRANSFORMS names, overriding `default_transforms`.
        conv_size: kernel size of a short causal depthwise convolution on `conv_inputs`
            (0 turns it off); default 4. For a non-causal spec (one with a backward state) the
            convolution is centred: (conv_size - 1) // 2 tokens before, conv_size // 2 after.
        conv_inputs: which vector inputs are convolved; default every vector input that no
            decay or beta reads (keys, queries and values, as in fla's layers).
        output_gate: multiply by silu(Linear(x)) before the output projection.
        norm: RMSNorm over each head's output.
        chunk_size: chunk size of the chunked form.
        mode: "chunk" (the chunked form; refused for a spec that has none), "recurrent" (the
            token loop) or "auto" (the chunked form where there is one, else the token loop,
            with a warning).
    """

    def __init__(
        self,
        spec,
        hidden_size: int,
        num_heads: int,
        *,
        num_v_heads: int | None = None,
        expand_v: float = 1,
        sizes: dict[str, int] | None = None,
        transforms: dict[str, Sequence[str]] | None = None,
        conv_size: int = 4,
        conv_inputs: Sequence[str] | None = None,
        output_gate: bool = True,
        norm: bool = True,
        chunk_size: int = 64,
        mode: str = "auto",
    ) -> None:
        super().__init__()
        self._derive(layer_spec(spec))
        self.hidden_size = count("hidden_size", hidden_size)
        self.num_heads = count("num_heads", num_heads)
        self.num_v_heads = value_heads(self.num_heads, num_v_heads)
        self.chunk_size = count("chunk_size", chunk_size)
        if self.chunk_size & (self.chunk_size - 1):
            raise MixcError(f"chunk_size: expected a power of two, got {chunk_size}")
        self.mode = chosen_mode(self.spec, self.mixer, mode)
        check_container_names(self.spec)
        given = {} if sizes is None else sizes
        self.sizes = sizes_per_head(self.spec, self.hidden_size, self.num_heads, given)
        self.sizes = expanded_sizes(self.spec, self.sizes, given, expand_v)
        self.sizes = angle_sizes(self.sizes, self.roles.rotated, given)
        self.heads = {
            d.name: self.num_heads if d.name in self.roles.keys else self.num_v_heads
            for d in self.spec.mixer.inputs
        }
        overrides = {} if transforms is None else transforms
        self.transforms = chosen_transforms(self.spec, self.roles.transforms, overrides)
        conv_size = count("conv_size", conv_size, least=0)
        out_heads = {self.spec.mixer.outputs[0].target: self.num_v_heads}
        check_memory(
            self.spec,
            self.heads | out_heads,
            self.hidden_size,
            self.sizes,
            conv_size,
            sizes is not None,
        )
        self._build_inputs(conv_size, conv_inputs)
        self._build_params()
        self._build_output(output_gate, norm)
        with torch.no_grad():
            start_biases(self)

    def _build_inputs(self, conv_size: int, conv_inputs: Sequence[str] | None) -> None:
        """A projection per input, a short causal convolution per convolved vector input, and
        a learnable bias (per head and entry) for every input a decay or an erase reads."""
        mixer, heads = self.spec.mixer, self.heads
        self.dims = {d.name: [self._size(s) for s in d.shape] for d in mixer.inputs}
        self.proj = nn.ModuleDict(
            {
                name: nn.Linear(self.hidden_size, heads[name] * math.prod(dims), bias=False)
                for name, dims in self.dims.items()
            }
        )
        chosen = chosen_conv_inputs(self.spec, self.roles, conv_inputs)
        self.conv_inputs = chosen if conv_size > 1 else []
        self.conv_size = conv_size
        self.conv = nn.ModuleDict(
            {
                name: nn.Conv1d(
                    heads[name] * self.dims[name][0],
                    heads[name] * self.dims[name][0],
                    conv_size,
                    groups=heads[name] * self.dims[name][0],
                    padding=0,
                    bias=False,
                )
                for name in self.conv_inputs
            }
        )
        self.bias = nn.ParameterDict(
            {
                name: nn.Parameter(torch.zeros(heads[name], *self.dims[name]))
                for name in self.roles.biased(mixer)
            }
        )

    def _build_params(self) -> None:
        """The learnable per-head parameters (those without a default), stored so that they
        stay in their domain (`PARAM_DOMAINS`), starting by their role (`PARAM_INITS`; a
        parameter that sets a decay alone is solved by `start_decays`)."""
        mixer, roles = self.spec.mixer, self.roles
        check_defaults(self.spec, self.num_v_heads)
        self.learned = [p.name for p in mixer.params if p.default is None]
        self.stored = self._stored_names()
        self.params = nn.ParameterDict()
        for param in mixer.params:
            if param.default is not None:
                continue
            _, _, to_stored = stored_as(roles.domains[param.name])
            shape = (self.num_v_heads, *(self._size(s) for s in param.shape))
            domain, role = roles.domains[param.name], roles.inits[param.name]
            if role == "decay" or domain == "unit interval":
                start = torch.zeros(shape)  # solved, or 1/2 in the unit interval (as beta)
            else:
                sign = -1 if domain == "negative" else 1
                start = to_stored(sign * PARAM_INITS[role](*shape))
            self.params[self.stored[param.name][0]] = nn.Parameter(start)

    def _stored_names(self) -> dict[str, tuple[str, Callable]]:
        """Each learnable parameter's stored name and its stored -> value map (PARAM_DOMAINS)."""
        out = {}
        for name in self.learned:
            suffix, to_value, _ = stored_as(self.roles.domains[name])
            out[name] = (name + suffix, to_value)
        return out

    def __getstate__(self) -> dict:
        """What pickling (and copy.deepcopy, torch.save, AveragedModel, DataLoader workers)
        keeps: everything but the compiled module and what is derived from the spec, which
        `__setstate__` rebuilds from the spec's text; so a checkpoint holds no compiled code."""
        state = dict(super().__getstate__())
        for derived in ("spec", "mixer", "roles", "causal", "stored"):
            state.pop(derived, None)
        state["_spec_source"] = (self.spec.source.text, self.spec.source.filename)
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        text, filename = state.pop("_spec_source")
        super().__setstate__(state)
        self._derive(load_spec(Source(text, filename)))
        self.stored = self._stored_names()

    def _derive(self, spec) -> None:
        """What the layer keeps of its spec: the spec, its compiled module, the inputs' roles
        and whether it is causal (a walk of the equations: kept, so not traced on each call)."""
        self.spec = spec
        self.mixer = load(spec.source)
        self.roles = roles(spec)
        self.causal = spec.mixer.causal

    def _stored(self, name: str) -> torch.Tensor:
        return self.params[self.stored[name][0]]

    def _transformed(self, name: str, x: torch.Tensor) -> torch.Tensor:
        for t in self.transforms[name]:
            x = TRANSFORMS[t](x)
        return x

    def _build_output(self, output_gate: bool, norm: bool) -> None:
        """RMSNorm per head, the output gate and the output projection."""
        mixer = self.spec.mixer
        out_shape = self.spec.shapes[mixer.outputs[0].target]
        self.head_out = 1 if out_shape == ("1", "1") else self._size(out_shape[0])
        width = self.num_v_heads * self.head_out
        self.norm = nn.RMSNorm(self.head_out, eps=1e-6) if norm else None
        self.gate = nn.Linear(self.hidden_size, width, bias=False) if output_gate else None
        self.out_proj = nn.Linear(width, self.hidden_size, bias=False)

    def _size(self, symbol: str) -> int:
        return size_of(symbol, self.sizes)

    def param_values(self) -> dict[str, torch.Tensor]:
        """Every learnable parameter's value (from what is stored), by its name in the spec."""
        return {
            name: to_value(self.params[stored]) for name, (stored, to_value) in self.stored.items()
        }

    def _params(self) -> list[torch.Tensor]:
        values = self.param_values()
        return [values[name] for name in self.learned]

    def state_size(self, seq_len: int | None = None) -> int:
        """Numbers per sequence the mixer's states hold (whatever the sequence's length), the last
        token of each input read at t-1 included; the convolution's last inputs not counted."""
        return sum(
            self.num_v_heads * math.prod(self._size(s) for s in d.shape)
            for d in self.spec.mixer.carried
        )

    def forward(
        self,
        x: torch.Tensor,
        state: MixerCache | None = None,
        use_cache: bool = False,
        attention_mask: torch.Tensor | None = None,
    ):
        """x: [B, T, hidden]. Returns (y [B, T, hidden], cache or None). A cache from an earlier
        call continues that sequence exactly (prefill, then decode token by token).
        attention_mask [B, T] (1: a token, 0: padding, anywhere in a row): each row is computed
        as the sequence of its tokens alone (continuing the cache), y is 0 at padding."""
        check_x(x, self.hidden_size, self.out_proj.weight.dtype)
        if not isinstance(use_cache, bool):
            raise MixcError(f"use_cache: expected True or False, got {type(use_cache).__name__}")
        B, T, _ = x.shape
        check_no_cache(self.spec.mixer, use_cache, state)
        if state is not None:
            check_cache(state, B, self)
        mask = check_mask(attention_mask, B, T, x.device)
        packed = None if mask is None else packing(mask)
        # Packed into sequences (cu_seqlens) for a cache or a backward state; else each
        # compacted row runs as it is, its padding after its tokens (the forms are causal), to
        # the end (`expand`): no size depends on the mask, so torch.compile makes one graph.
        split = packed if use_cache or not self.causal else None
        if packed is not None:
            x = packed.compact(x)  # each row's tokens first: the convolution sees only them
        inputs, tails, gate = _inputs(self, x, state, split)
        if split is not None and split.total == 0:  # padding only: nothing changes
            y, states = x.new_zeros(1, 0, self.num_v_heads, self.head_out), self._states(state, x)
        else:
            y, states = self._mix(inputs, state, use_cache, split)
        y = y.reshape(*y.shape[:2], self.num_v_heads, self.head_out)
        if self.norm is not None:
            y = self.norm(y)
        y = y.reshape(*y.shape[:2], self.num_v_heads * self.head_out)
        if gate is not None:
            y = y * F.silu(gate)
        y = self.out_proj(y)
        if packed is not None:
            y = packed.expand(y) if split is None else split.unpack(y)
        return y, (MixerCache(states, tails, id(self)) if use_cache else None)

    def _mix(self, inputs, state: MixerCache | None, use_cache: bool, packed: Packing | None):
        """The compiled mixer's form (`mode`) on the inputs, from the cache's states; one token
        of every row (decoding) runs the step form (a non-causal mixer has none)."""
        states = state.states if state is not None else None
        if packed is None and inputs[0].shape[1] == 1 and self.causal:
            y, states = self.mixer.step(*(x[:, 0] for x in inputs), *self._params(), state=states)
            return y[:, None], (states if use_cache else None)
        kw = {"chunk_size": self.chunk_size} if self.mode == "chunk" else {}
        if packed is not None:
            kw["cu_seqlens"] = packed.cu_seqlens
        form = getattr(self.mixer, self.mode)
        return form(
            *inputs, *self._params(), initial_state=states, output_final_state=use_cache, **kw
        )

    def _states(self, state: MixerCache | None, x: torch.Tensor):
        """The states a call of padding only leaves: the cache's, else zeros (in the compiled
        module's compute dtype: float64 for float64, else float32; a state of angles float64)."""
        if state is not None:
            return state.states
        wide, dtype = angle_states(self.spec.mixer), torch.promote_types(x.dtype, torch.float32)
        zeros = tuple(
            x.new_zeros(
                x.shape[0], self.num_v_heads, *(self._size(s) for s in d.shape), dtype=dtype
            ).to(torch.float64 if d.name in wide else dtype)
            for d in self.spec.mixer.carried
        )
        return zeros[0] if len(zeros) == 1 else zeros


def _inputs(layer: MixerLayer, x: torch.Tensor, state: MixerCache | None, packed: Packing | None):
    """Each input of the layer's spec from x [B, T, hidden]: projected, convolved with the
    cache's last inputs before it, biased and transformed ([B, T, heads, *dims], or the real
    tokens packed [1, total, ...] when `packed`, x then compacted); each convolution's last
    conv_size - 1 inputs, for the cache; and the output gate's projection (packed too).

    Every input's projection and the output gate's are one matmul (their weights side by side,
    the convolved inputs first, the gate last) and every convolution one depthwise convolution
    over the convolved inputs side by side: under torch.compile a kernel for all of them, not
    one for each input."""
    B, T, _ = x.shape
    convolved = [name for name in layer.dims if name in layer.conv]
    names = convolved + [name for name in layer.dims if name not in layer.conv]
    widths = [layer.proj[name].out_features for name in names]
    weights = [layer.proj[name].weight for name in names]
    h = F.linear(x, torch.cat(weights + ([] if layer.gate is None else [layer.gate.weight])))
    gate = None if layer.gate is None else h[..., sum(widths) :]
    if gate is not None and packed is not None:
        gate = packed.pack_compacted(gate)
    width, tails = sum(widths[: len(convolved)]), {}
    parts = list(h[..., width : sum(widths)].split(widths[len(convolved) :], -1))
    if convolved:
        h_conv, last = _convolved(layer, h[..., :width], state, packed, convolved)
        parts[:0] = h_conv.split(widths[: len(convolved)], -1)
        if last is not None:
            tails = dict(zip(convolved, last.split(widths[: len(convolved)], -1), strict=True))
    inputs = {}
    for name, h_name in zip(names, parts, strict=True):
        h_name = h_name.view(B, T, layer.heads[name], *layer.dims[name])
        if packed is not None:
            h_name = packed.pack_compacted(h_name)
        if name in layer.bias:
            h_name = h_name + layer.bias[name]
        inputs[name] = layer._transformed(name, h_name)
    return [inputs[name] for name in layer.dims], tails, gate


def _convolved(layer: MixerLayer, h, state: MixerCache | None, packed: Packing | None, names):
    """The convolved inputs' projections h [B, T, width] (side by side, in the order `names`)
    through the layer's depthwise convolutions as one, then silu; and, for a causal layer, their
    last conv_size - 1 inputs [B, conv_size - 1, width] (after the cache's, else zeros)."""
    weight = torch.cat([layer.conv[name].weight for name in names])
    if not layer.causal:  # centred: no cache to keep
        pad = ((layer.conv_size - 1) // 2, layer.conv_size // 2)
        h_full, last = F.pad(h.transpose(1, 2), pad), None
    else:
        n = layer.conv_size - 1
        if state is None:
            h_full = F.pad(h, (0, 0, n, 0))
        else:
            past = torch.cat([state.conv[name] for name in names], -1)
            h_full = torch.cat([past.to(h.dtype), h], 1)
        last = h_full[:, -n:] if packed is None else packed.last(h_full, n)
        h_full = h_full.transpose(1, 2)
    return F.silu(F.conv1d(h_full, weight, groups=h.shape[-1]).transpose(1, 2)), last
