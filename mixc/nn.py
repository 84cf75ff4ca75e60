"""`MixerLayer`: a compiled mixer as a drop-in torch.nn.Module.

    layer = MixerLayer("specs/gated_deltanet.mix", hidden_size=256, num_heads=4)
    y, cache = layer(x, use_cache=True)           # x: [B, T, hidden]
    y_next, cache = layer(x_next, state=cache, use_cache=True)

Each spec input gets a projection from the hidden state (vectors `Linear(hidden, NH * d)`,
per-token scalars `Linear(hidden, NH)`), optionally a short causal depthwise convolution, a
learnable bias where a decay reads it, then a chain of transforms (`TRANSFORMS`). Per-head
parameters without a default are learnable. The mixer's output per head goes through an
optional RMSNorm and an optional output gate, then an output projection.

Nothing here depends on which mixer the spec is or what its inputs are called: the defaults
(transforms, biases, how parameters are stored and start) come from the roles the analysis
gives each input and parameter (`roles`, in `mixc.layer_roles`): the domains the transition
classes need for stability, and the decays of every state, which start near 1 (`DECAY_INIT`,
solved here). docs/layers.md compares them with flash-linear-attention's layers. What the layer
checks of its arguments is in `mixc.layer_checks`, its decoding cache in `mixc.layer_cache`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from mixc.algebra.expand import inline
from mixc.driver import load
from mixc.errors import MixcError, Source
from mixc.frontend.builtins import BUILTINS
from mixc.frontend.constants import Folder
from mixc.frontend.ir import Binary, Call, Expr, Number
from mixc.frontend.spec import load_spec
from mixc.layer_cache import MixerCache, check_cache
from mixc.layer_checks import (
    check_container_names,
    check_memory,
    check_no_cache,
    check_x,
    chosen_conv_inputs,
    chosen_transforms,
    count,
    layer_spec,
    size_of,
    sizes_per_head,
)
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
from mixc.layer_roles import reads as _reads  # a helper here, not one of the exports below

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


class _UnsolvableError(Exception):
    """A decay whose log is not an elementwise expression (a dot product, an l2norm)."""


def _evaluate(e: Expr, values: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """An elementwise expression (let functions inlined) on tensors that broadcast, `values`
    giving the inputs, parameters and h it reads: enough for the log of a decay (`dt_t A`,
    `logsigmoid(a_t)`, `log(sigmoid(w_t) sigmoid(f_t))`). Raises _UnsolvableError where it
    reads anything else or is not elementwise."""
    value = Folder(_TENSORS).value(e, values)
    if value is None:
        raise _UnsolvableError(str(e))
    return value


class _Tensors:
    """The constant folder's arithmetic (`mixc.frontend.constants.Folder`) on float64 tensors:
    elementwise built-ins and operations, diag(x) read as its diagonal x. Nothing is refused:
    a value that is not finite stays in the tensor, where the caller looks for it."""

    def number(self, e: Number) -> torch.Tensor:
        return torch.tensor(float(e.text), dtype=torch.float64)

    def call(self, e: Call, args: tuple[torch.Tensor | None, ...]) -> torch.Tensor | None:
        builtin = BUILTINS.get(e.func)
        if builtin is None or any(a is None for a in args):
            return None
        if e.func == "diag":
            return args[0]
        return builtin.tensor(*args) if builtin.elementwise else None

    def binary(
        self, e: Binary, left: torch.Tensor | None, right: torch.Tensor | None
    ) -> torch.Tensor | None:
        if left is None or right is None or e.op not in _ELEMENTWISE:
            return None
        return _ELEMENTWISE[e.op](left, right)


_TENSORS = _Tensors()

_ELEMENTWISE = {
    "+": torch.add,
    "-": torch.sub,
    "*": torch.mul,
    "@": torch.mul,  # a product of scalars and diagonals, entry by entry
    "/": torch.div,
    "^": torch.pow,
}


#: The grid a decay's bias (or parameter) is chosen from: the value whose decay is nearest its
#: target wins.
_GRID = torch.linspace(-24, 24, 1921, dtype=torch.float64)


def _solve(f: Callable[[torch.Tensor], torch.Tensor], target: torch.Tensor) -> torch.Tensor:
    """For each head h (the first dim of `target`), the grid value b whose f(b)[h] (a [NH, G]
    tensor) is nearest each entry of target[h]: the decay needs no monotone or invertible form."""
    got = f(_GRID).nan_to_num(nan=math.inf)  # [NH, G]
    flat = target.reshape(target.shape[0], -1, 1)  # [NH, E, 1]
    best = (got[:, None, :] - flat).abs().argmin(-1)  # [NH, E]
    return _GRID[best].reshape(target.shape).to(torch.float32)


class MixerLayer(nn.Module):
    """A token mixer from a spec: projections in, the compiled recurrence, projection out.

    Args:
        spec: a spec path, a Source or a loaded Spec (for spec text, load_spec(text=...)).
        hidden_size, num_heads: model width and number of heads.
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
        self.spec = layer_spec(spec)
        self.mixer = load(self.spec.source)
        self.hidden_size = count("hidden_size", hidden_size)
        self.num_heads = count("num_heads", num_heads)
        self.chunk_size = count("chunk_size", chunk_size)
        if self.chunk_size & (self.chunk_size - 1):
            raise MixcError(f"chunk_size: expected a power of two, got {chunk_size}")
        check_container_names(self.spec)
        given = {} if sizes is None else sizes
        self.sizes = sizes_per_head(self.spec, self.hidden_size, self.num_heads, given)
        self.roles = roles(self.spec)
        overrides = {} if transforms is None else transforms
        self.transforms = chosen_transforms(self.spec, self.roles.transforms, overrides)
        conv_size = count("conv_size", conv_size, least=0)
        check_memory(
            self.spec, self.num_heads, self.hidden_size, self.sizes, conv_size, sizes is not None
        )
        self._build_inputs(conv_size, conv_inputs)
        self._build_params()
        self._build_output(output_gate, norm)
        with torch.no_grad():
            self._start_decays()

    def _build_inputs(self, conv_size: int, conv_inputs: Sequence[str] | None) -> None:
        """A projection per input, a short causal convolution per convolved vector input, and
        a learnable bias (per head and entry) for every input a decay reads."""
        mixer, heads = self.spec.mixer, self.num_heads
        self.dims = {d.name: [self._size(s) for s in d.shape] for d in mixer.inputs}
        self.proj = nn.ModuleDict(
            {
                name: nn.Linear(self.hidden_size, heads * math.prod(dims), bias=False)
                for name, dims in self.dims.items()
            }
        )
        chosen = chosen_conv_inputs(self.spec, self.roles, conv_inputs)
        self.conv_inputs = chosen if conv_size > 1 else []
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
        self.bias = nn.ParameterDict(
            {
                name: nn.Parameter(torch.zeros(heads, *self.dims[name]))
                for name in self.roles.biased(mixer)
            }
        )

    def _check_defaults(self) -> None:
        """Each default that reads the head index h is finite at every head of this layer
        (`check` proves it for the first HEADS_CHECKED heads; a layer may have more)."""
        h = torch.arange(self.num_heads, dtype=torch.float64)
        for p in self.spec.mixer.params:
            if p.default is None or "h" not in _reads(p.default, {"h"}):
                continue
            try:
                value = _evaluate(inline(self.spec.mixer, p.default), {"h": h})
            except _UnsolvableError:
                continue
            bad = (~torch.isfinite(value.expand_as(h))).nonzero()
            if len(bad):
                raise MixcError(
                    f"param {p.name}: its default {p.default} is not finite at head "
                    f"h = {bad[0].item()} (of num_heads = {self.num_heads})"
                )

    def _build_params(self) -> None:
        """The learnable per-head parameters (those without a default), stored so that they
        stay in their domain (`PARAM_DOMAINS`), starting by their role (`PARAM_INITS`; a
        parameter that sets a decay alone is solved by `_start_decays`)."""
        mixer, roles = self.spec.mixer, self.roles
        self._check_defaults()
        self.learned = [p.name for p in mixer.params if p.default is None]
        self.stored = self._stored_names()
        self.params = nn.ParameterDict()
        for param in mixer.params:
            if param.default is not None:
                continue
            _, _, to_stored = stored_as(roles.domains[param.name])
            shape = (self.num_heads, *(self._size(s) for s in param.shape))
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
        for derived in ("spec", "mixer", "roles", "stored"):
            state.pop(derived, None)
        state["_spec_source"] = (self.spec.source.text, self.spec.source.filename)
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        text, filename = state.pop("_spec_source")
        super().__setstate__(state)
        self.spec = load_spec(Source(text, filename))
        self.mixer = load(self.spec.source)
        self.roles = roles(self.spec)
        self.stored = self._stored_names()

    def _start_decays(self) -> None:
        """Set every decay to start near 1 (`DECAY_INIT`): the bias of the inputs a decay reads
        (one value shared by them), or the parameters of a decay that reads no input, is the
        grid value whose log-decay is nearest -w, w drawn per head and entry. The parameters
        beside an input (A in exp(dt_t A)) keep their start, and each head is solved with their
        mean there. A decay whose log is not elementwise keeps bias 0."""
        heads = self.num_heads
        lo, hi = (math.log(x) for x in DECAY_INIT)
        solved_alone = {p for p in self.learned if self.roles.inits[p] == "decay"}
        done: set[str] = set()
        for d in self.roles.decays:
            solving = [n for n in _reads(d.log, set(self.bias)) if n not in done]
            solving = solving or [n for n in _reads(d.log, solved_alone) if n not in done]
            if not solving:
                continue
            tensors = [self.bias[n] if n in self.bias else self._stored(n) for n in solving]
            shapes = {tuple(t.shape) for t in tensors}
            shape = shapes.pop() if len(shapes) == 1 else (heads,)
            w = torch.exp(lo + (hi - lo) * torch.rand(shape, dtype=torch.float64)) * d.share
            fixed = self._per_head_values(d.log, exclude=set(solving))

            def log_decay(grid: torch.Tensor, d=d, solving=solving, fixed=fixed) -> torch.Tensor:
                row, values = grid.expand(heads, -1), dict(fixed)
                for name in solving:
                    biased = name in self.bias
                    values[name] = (
                        self._transformed(name, row) if biased else self.stored[name][1](row)
                    )
                return _evaluate(d.log, values).expand(heads, -1)

            try:
                start = _solve(log_decay, -w)
            except _UnsolvableError:
                continue
            for t in tensors:
                t.copy_(
                    start if start.shape == t.shape else start.view(heads, *[1] * (t.dim() - 1))
                )
            done |= set(solving)

    def _per_head_values(self, e: Expr, exclude: set[str]) -> dict[str, torch.Tensor]:
        """The value per head ([NH, 1], the mean over a head's entries) of every parameter and
        transformed bias `e` reads outside `exclude`, and the head index h."""
        heads = self.num_heads
        h = torch.arange(heads, dtype=torch.float64)[:, None]
        out = {"h": h}
        for p in self.spec.mixer.params:
            if p.default is not None and p.name in _reads(e, {p.name}):
                out[p.name] = _evaluate(inline(self.spec.mixer, p.default), {"h": h}).expand(
                    heads, 1
                )
        params = self.param_values()
        for name in _reads(e, set(self.learned) - exclude):
            out[name] = params[name].double().reshape(heads, -1).mean(-1, keepdim=True)
        for name in _reads(e, set(self.bias) - exclude):
            biased = self._transformed(name, self.bias[name].double())
            out[name] = biased.reshape(heads, -1).mean(-1, keepdim=True)
        return out

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
        width = self.num_heads * self.head_out
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
            self.num_heads * math.prod(self._size(s) for s in d.shape)
            for d in self.spec.mixer.carried
        )

    def forward(self, x: torch.Tensor, state: MixerCache | None = None, use_cache: bool = False):
        """x: [B, T, hidden]. Returns (y [B, T, hidden], cache or None). A cache from an earlier
        call continues that sequence exactly (prefill, then decode token by token)."""
        check_x(x, self.hidden_size, self.out_proj.weight.dtype)
        if not isinstance(use_cache, bool):
            raise MixcError(f"use_cache: expected True or False, got {type(use_cache).__name__}")
        B, T, _ = x.shape
        check_no_cache(self.spec.mixer, use_cache, state)
        if state is not None:
            check_cache(state, B, self)
        inputs, tails = [], {}
        for name, dims in self.dims.items():
            h = self.proj[name](x)
            if name in self.conv and not self.spec.mixer.causal:  # centred: no cache to keep
                pad = ((self.conv_size - 1) // 2, self.conv_size // 2)
                h = F.silu(self.conv[name](F.pad(h.transpose(1, 2), pad)).transpose(1, 2))
            elif name in self.conv:
                past = (
                    state.conv[name]
                    if state is not None
                    else h.new_zeros(B, self.conv_size - 1, h.shape[-1])
                )
                h_full = torch.cat([past.to(h.dtype), h], 1)
                tails[name] = h_full[:, -(self.conv_size - 1) :]
                h = F.silu(self.conv[name](h_full.transpose(1, 2)).transpose(1, 2))
            h = h.view(B, T, self.num_heads, *dims)
            if name in self.bias:
                h = h + self.bias[name]
            inputs.append(self._transformed(name, h))
        states = state.states if state is not None else None
        form = self.mixer.chunk if "chunk" in self.mixer.FORMS else self.mixer.recurrent
        kw = {"chunk_size": self.chunk_size} if "chunk" in self.mixer.FORMS else {}
        y, new_states = form(
            *inputs, *self._params(), initial_state=states, output_final_state=use_cache, **kw
        )
        y = y.reshape(B, T, self.num_heads, self.head_out)
        if self.norm is not None:
            y = self.norm(y)
        y = y.reshape(B, T, self.num_heads * self.head_out)
        if self.gate is not None:
            y = y * F.silu(self.gate(x))
        y = self.out_proj(y)
        return y, (MixerCache(new_states, tails, id(self)) if use_cache else None)
