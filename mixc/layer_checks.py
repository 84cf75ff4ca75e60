"""What the layers check of their arguments before building anything: a count, the spec, its
sizes per head, the transforms and convolved inputs asked for, the names torch's containers
refuse, and the memory the parameters would take; at each call, the input x. A wrong argument is
a one-line MixcError naming it, not an error from deep inside torch (or an allocation of
terabytes). `mixc.nn.MixerLayer` checks all of these; the attention layer and the model use
`count` too.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from mixc.driver import plan
from mixc.errors import MixcError
from mixc.frontend.spec import Spec
from mixc.layer_roles import TRANSFORMS, Roles, layer_spec  # layer_spec: exported here too
from mixc.resources import check_bytes

__all__ = [
    "angle_sizes",
    "check_container_names",
    "check_memory",
    "check_no_cache",
    "check_x",
    "chosen_conv_inputs",
    "chosen_mode",
    "chosen_transforms",
    "count",
    "expanded_sizes",
    "layer_spec",
    "size_of",
    "sizes_per_head",
    "value_heads",
    "value_symbols",
]

#: The layer's modes: the compiled form each runs ("auto" picks one).
MODES = ("auto", "chunk", "recurrent")

#: The specs (by their text) whose fall-back to the token loop was warned about in this
#: process: once each, however many layers use them.
_WARNED: set[str] = set()


def count(name: str, value, least: int = 1) -> int:
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


def check_container_names(spec: Spec) -> None:
    """The layer keeps a projection per input and a value per parameter in torch containers
    (nn.ModuleDict, nn.ParameterDict) by the spec's names, which torch refuses for the
    names of their own attributes (`keys`, `update`, `training`, ...)."""
    mixer = spec.mixer
    containers = (nn.ModuleDict(), nn.ParameterDict())
    for decl in (*mixer.inputs, *mixer.params):
        if any(hasattr(c, decl.name) for c in containers):
            raise MixcError(
                f"{spec.source.filename}: MixerLayer cannot hold {decl.name!r}, a name "
                "torch's containers keep for themselves; rename it in the spec "
                f"(e.g. {decl.name}1)"
            )


def sizes_per_head(spec: Spec, hidden: int, heads: int, given: Mapping[str, int]) -> dict[str, int]:
    """Every size symbol of the spec: as given, else the head width hidden / heads (which must
    then be a whole, positive number)."""
    mixer = spec.mixer
    symbols = {
        s for d in (*mixer.inputs, *mixer.states, *mixer.params) for s in d.shape if not s.isdigit()
    }
    if not isinstance(given, Mapping):
        raise MixcError(f"sizes: expected a dict of sizes by symbol, got {given!r}")
    unknown = set(given) - symbols
    if unknown:
        raise MixcError(
            f"sizes: {', '.join(sorted(unknown))} not in the spec "
            f"(it has {', '.join(sorted(symbols))})"
        )
    out = {s: count(f"sizes: {s}", given[s]) for s in sorted(given)}
    defaulted = sorted(symbols - set(given))
    if defaulted and hidden % heads:
        what = ", ".join(defaulted)
        problem = (
            f"is smaller than num_heads = {heads}: {what} would be 0"
            if hidden < heads
            else f"is not a multiple of num_heads = {heads}: {what} would be {hidden / heads:g}"
        )
        raise MixcError(f"hidden_size: {hidden} {problem}; pass sizes={{...}} for {what}")
    return {s: out.get(s, hidden // heads) for s in sorted(symbols)}


def angle_sizes(sizes: dict[str, int], rotated, given: Mapping[str, int]) -> dict[str, int]:
    """`sizes` with the angle count p of each rotation of a vector [d] (`Roles.rotated`) not in
    `given` set to d / 4: the leading half of the pairs turn (Mamba-3's rope_fraction 0.5)."""
    out = dict(sizes)
    for d, p in rotated:
        out[p] = given.get(p, max(1, out[d] // 4))
    return out


def value_symbols(spec: Spec) -> list[str]:
    """The size symbols of the mixer's output per head (V in y[V]): what `expand_v` widens."""
    shape = spec.shapes[spec.mixer.outputs[0].target]
    return [s for s in shape if not s.isdigit()]


def expanded_sizes(spec: Spec, sizes: dict[str, int], given, expand_v) -> dict[str, int]:
    """`sizes` with each value symbol not in `given` times `expand_v` (fla's value expansion:
    a value head expand_v times as wide as a key head), a whole number."""
    if isinstance(expand_v, bool) or not isinstance(expand_v, numbers.Real) or expand_v <= 0:
        raise MixcError(f"expand_v: expected a positive number, got {expand_v!r}")
    if expand_v == 1:
        return sizes
    symbols = [s for s in value_symbols(spec) if s not in given]
    if not symbols:
        what = ", ".join(value_symbols(spec)) or "none: its output is a scalar"
        raise MixcError(
            f"expand_v: {spec.mixer.name}'s value sizes ({what}) are all given in sizes; "
            "give their widths there, or drop expand_v"
        )
    out = dict(sizes)
    for s in symbols:
        wide = sizes[s] * expand_v
        if wide != int(wide):
            raise MixcError(
                f"expand_v: {s} = {sizes[s]} x {expand_v:g} = {wide:g} is not a whole number"
            )
        out[s] = int(wide)
    return out


def size_of(symbol: str, sizes: Mapping[str, int]) -> int:
    """A size of the spec per head: a number as written, a symbol from `sizes`."""
    return int(symbol) if symbol.isdigit() else sizes[symbol]


def chosen_transforms(
    spec: Spec, defaults: Mapping[str, list[str]], overrides: Mapping[str, Sequence[str]]
) -> dict[str, list[str]]:
    """The default transforms of every input, with the user's overrides checked in."""
    out = {name: list(chain) for name, chain in defaults.items()}
    if not isinstance(overrides, Mapping):
        raise MixcError(f"transforms: expected a dict of lists by input, got {overrides!r}")
    for name, given in overrides.items():
        if name not in out:
            raise MixcError(f"transforms: {name} is not an input of {spec.mixer.name}")
        chain = _names(f"transforms: {name}", given)
        bad = [t for t in chain if t not in TRANSFORMS]
        if bad:
            raise MixcError(f"transforms: unknown {bad[0]!r}; choose from {', '.join(TRANSFORMS)}")
        out[name] = list(chain)
    return out


def chosen_conv_inputs(spec: Spec, roles: Roles, given: Sequence[str] | None) -> list[str]:
    """The inputs a layer convolves: as given (vector inputs only), else every vector input
    that no stability condition bounds (keys, queries and values, as in fla's layers)."""
    mixer = spec.mixer
    vectors = [d.name for d in mixer.inputs if len(d.shape) == 1]
    free = [n for n in vectors if n not in roles.conditioned]
    chosen = free if given is None else _names("conv_inputs", given)
    for name in chosen:
        if name not in vectors:
            inputs = {d.name for d in mixer.inputs}
            what = "a per-token scalar" if name in inputs else "not an input"
            raise MixcError(
                f"conv_inputs: {name} is {what} of {mixer.name}; only vector inputs are "
                f"convolved ({', '.join(vectors) or 'it has none'})"
            )
    return list(chosen)


def check_memory(
    spec: Spec,
    heads: Mapping[str, int],
    hidden: int,
    sizes: Mapping[str, int],
    conv_size: int,
    sized: bool,
) -> None:
    """A layer's parameters (projections, convolutions, gate and output) fit in this machine's
    memory: checked before any is allocated, naming the option that asks most (`sizes` where
    the user gave them, `sized`, else hidden_size, or conv_size). `heads`: the heads of each
    input, and of the output under the mixer's output name."""
    mixer = spec.mixer
    widths = {
        d.name: heads[d.name] * math.prod(size_of(s, sizes) for s in d.shape) for d in mixer.inputs
    }
    out = mixer.outputs[0].target
    out_shape = spec.shapes[out]
    out_width = heads[out] * (1 if out_shape == ("1", "1") else size_of(out_shape[0], sizes))
    linear = hidden * (sum(widths.values()) + 2 * out_width)
    conv = conv_size * sum(widths[d.name] for d in mixer.inputs if len(d.shape) == 1)
    params = {"hidden_size": linear, "conv_size": conv}
    if sized:
        params["sizes"] = params.pop("hidden_size")
    option = max(params, key=params.get)
    value = {"hidden_size": hidden, "conv_size": conv_size, "sizes": sizes}[option]
    size = torch.get_default_dtype().itemsize
    check_bytes(option, value, (linear + conv) * size, "the layer's parameters")


def check_x(x, hidden: int, dtype: torch.dtype) -> None:
    """x is a [B, T, hidden] tensor with T >= 1, in the dtype of the layer's parameters."""
    if not isinstance(x, torch.Tensor):
        raise MixcError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 3 or x.shape[-1] != hidden:
        raise MixcError(f"x: expected [B, T, {hidden}], got {list(x.shape)}")
    if x.dtype != dtype:
        raise MixcError(
            f"x: expected {dtype} like the layer's parameters, got {x.dtype} "
            "(convert x, or the layer with .to(dtype))"
        )
    if x.shape[1] == 0:
        raise MixcError("x: the sequence is empty (T = 0); a call needs at least one token")


def value_heads(num_heads: int, num_v_heads) -> int:
    """The number of value heads: num_heads by default, else a multiple of it (each query and
    key head shared by a group of consecutive value heads)."""
    if num_v_heads is None:
        return num_heads
    num_v_heads = count("num_v_heads", num_v_heads)
    if num_v_heads % num_heads:
        raise MixcError(
            f"num_v_heads: expected a multiple of num_heads = {num_heads} (each query and key "
            f"head is shared by a group of value heads), got {num_v_heads}"
        )
    return num_v_heads


def chosen_mode(spec: Spec, module, mode) -> str:
    """The compiled form a layer runs: "chunk" or "recurrent" as asked ("chunk" refused, with
    the analysis's reason, for a spec without a chunked form); "auto": the chunked form where
    there is one, else the token loop, with a warning (once per spec in a process)."""
    if mode not in MODES:
        raise MixcError(f"mode: expected one of {', '.join(map(repr, MODES))}, got {mode!r}")
    if mode == "recurrent":
        return mode
    if "chunk" in module.FORMS:
        return "chunk"
    reason = plan(spec).reason  # the analysis's, which `mixc explain` prints
    where = f"{spec.source.filename}: {spec.mixer.name} has no chunked form ({reason})"
    if mode == "chunk":
        raise MixcError(
            f"mode='chunk': {where}; use mode='recurrent' (the token loop), or see "
            "`mixc explain` on the spec"
        )
    if spec.source.text not in _WARNED:
        _WARNED.add(spec.source.text)
        warnings.warn(
            f"{where}: MixerLayer runs the token loop, much slower to train; pass "
            "mode='recurrent' to say so and silence this, or see `mixc explain` on the spec",
            stacklevel=3,  # the caller of MixerLayer(...)
        )
    return "recurrent"


def check_no_cache(mixer, use_cache: bool, state) -> None:
    """A layer of a non-causal mixer (a backward state, which starts at the sequence's end)
    is called on whole sequences: no cache to return or continue from."""
    if (use_cache or state is not None) and not mixer.causal:  # a walk of the equations
        raise MixcError(
            f"{mixer.name} is non-causal (its state {mixer.backward[0]} runs backward in time, "
            "from the end of the sequence): the layer has no cache; call it on whole "
            "sequences with use_cache=False and no state"
        )
