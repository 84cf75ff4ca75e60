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
gives each input and parameter (`roles`): the domains the transition classes need for
stability, and the decays of every state, which start near 1 (`DECAY_INIT`).
docs/layers.md compares them with flash-linear-attention's layers.
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
from mixc.driver import load
from mixc.errors import MixcError, Source
from mixc.frontend.builtins import BUILTINS
from mixc.frontend.ir import Binary, Call, Expr, Name, Neg, Number, Timed, Transpose, walk
from mixc.frontend.spec import Spec, load_spec
from mixc.resources import check_bytes

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


#: The transform that puts a projected input in the domain a stability condition needs, by the
#: domain `mixc.check.ranges` derives for it ("unit ball": a delta-rule key of norm <= 1).
DOMAIN_TRANSFORMS: dict[str, list[str]] = {
    "positive": ["softplus"],
    "negative": ["logsigmoid"],
    "unit interval": ["sigmoid"],
    "unit ball": ["silu", "l2norm"],
}

#: How a learnable parameter is stored so that training keeps it in its domain: (suffix of the
#: stored name, stored -> value, value -> stored). A is stored as A_log with A = -exp(A_log).
PARAM_DOMAINS: dict[str, tuple[str, Callable, Callable]] = {
    "negative": ("_log", lambda s: -torch.exp(s), lambda p: torch.log(-p)),
    "positive": ("_log", torch.exp, torch.log),
    "unit interval": ("_logit", torch.sigmoid, torch.logit),
}
_PLAIN = ("", lambda s: s, lambda p: p)  # a parameter of any value, stored as it is


#: Initial values of learnable parameters by role, as functions of the shape [NH, *shape]:
#: - "rate": the magnitude of a parameter that multiplies an input inside a decay (Mamba-2's A
#:   in exp(dt_t A)): U(1, 16) as Mamba-2 draws it, or for a matrix [P, N] 1, 2, ..., N along
#:   every row (Mamba-1's S4D-real start, its N channels decaying at N rates); the input's bias
#:   then sets the decay;
#: - "multiplier": a parameter that only multiplies or divides (a write scale, a skip D, a
#:   temperature): 1, which neither silences the state nor divides by 0;
#: - "offset": a parameter that is added somewhere: 0.
def _rate_init(*shape: int) -> torch.Tensor:
    """A "rate" parameter [NH, *shape]: S4D-real rows for a matrix, else U(1, 16)."""
    if len(shape) == 3:
        return (
            torch.arange(1, shape[-1] + 1, dtype=torch.get_default_dtype()).expand(*shape).clone()
        )
    return torch.empty(*shape).uniform_(1, 16)


PARAM_INITS: dict[str, Callable[..., torch.Tensor]] = {
    "rate": _rate_init,
    "multiplier": torch.ones,
    "offset": torch.zeros,
}

#: Per-token decays at initialisation: each state's log-decay -w starts with w log-uniform in
#: this range, drawn per head and channel, so memories span 16 to 512 tokens (half-lives of 11
#: to 355) before training; a state with several decays (an outer-product gate) splits w
#: between them.
DECAY_INIT = (2.0**-9, 2.0**-4)


@dataclass(frozen=True)
class Decay:
    """One decay of a state, as the log it starts at: `log` (an expression of inputs and
    parameters, let functions inlined, <= 0 for a stable state) and the share of the state's
    log-decay it carries."""

    state: str
    log: Expr
    share: float


@dataclass(frozen=True)
class Roles:
    """What the analysis says each input and parameter of a spec is for, which is all the
    layer's defaults depend on (never a name):

    - `transforms`: the chain each projected input goes through;
    - `domains`: the domain each learnable parameter must stay in (stored per PARAM_DOMAINS);
    - `inits`: the role each learnable parameter starts by (PARAM_INITS), or "decay" for one
      solved to start a decay at its target;
    - `decays`: every decay of every state, solved at initialisation (`MixerLayer`): the inputs
      in it get a learnable bias, set so the decay starts near 1 (DECAY_INIT); a decay of
      parameters only sets those parameters instead;
    - `conditioned`: the inputs a stability condition bounds (decays and beta), which are not
      convolved by default.
    """

    transforms: dict[str, list[str]]
    domains: dict[str, str]
    inits: dict[str, str]
    decays: tuple[Decay, ...]
    conditioned: frozenset[str]  # inputs a stability condition bounds (decays, beta)

    def biased(self, mixer) -> list[str]:
        """The inputs that get a learnable bias: every input read by a decay."""
        inputs = {d.name for d in mixer.inputs}
        return [
            d.name
            for d in mixer.inputs
            if any(d.name in _reads(x.log, inputs) for x in self.decays)
        ]


def roles(spec) -> Roles:
    """The roles of a spec's inputs and parameters, from its plan and the input ranges the
    transition classes declare (`TransitionClass.conditions`, `unit_key`): see `Roles`."""
    from mixc.check.ranges import input_ranges

    ranges = input_ranges(spec)
    facts, mixer = ranges.facts, spec.mixer
    inputs = {d.name for d in mixer.inputs}
    learned = [p.name for p in mixer.params if p.default is None]
    domain = {r.name: r.domain for r in ranges.ranges}

    transforms: dict[str, list[str]] = {}
    unit_states = {
        s.name
        for s in facts.states
        for part in s.transition.parts  # each step a token applies
        if part.transition_class.unit_key(s.name, part) is not None
    }
    for o in facts.outputs:  # queries: silu, and l2norm where they read a state of unit keys
        for r in o.readouts:
            chain = ["silu", "l2norm"] if r.state in unit_states else ["silu"]
            for name in _reads(r.query, inputs):
                transforms.setdefault(name, chain)
    for s in facts.states:  # write keys: silu
        for w in s.writes:
            for name in _reads(w.key, inputs):
                transforms.setdefault(name, ["silu"])
    for name in inputs:
        if domain[name] in DOMAIN_TRANSFORMS:
            transforms[name] = list(DOMAIN_TRANSFORMS[domain[name]])
    transforms = {d.name: transforms.get(d.name, ["identity"]) for d in mixer.inputs}

    decays = []
    for s in facts.states:
        logs = [
            _as_log(c) for c in s.transition.transition_class.decay_conditions(s.name, s.transition)
        ]
        logs = [inline(mixer, lg) for lg in logs if lg is not None]
        decays += [Decay(s.name, lg, 1 / len(logs)) for lg in logs]

    divisors = _divisors(mixer)
    domains = {p: domain[p] for p in learned}  # "plain" or "real": any value
    domains.update(
        {p: "positive" for p in divisors & set(learned) if domains[p] in ("plain", "real")}
    )
    inits = {p: _param_role(mixer, p) for p in learned}
    for d in decays:
        params = _reads(d.log, set(learned))
        for p in params:
            if _reads(d.log, inputs):
                inits[p] = "rate" if domains[p] in ("negative", "positive") else "offset"
            else:
                inits[p] = "decay"
    bounded = {"positive", "negative", "unit interval", "real"}
    conditioned = frozenset(n for n in inputs if domain[n] in bounded)
    return Roles(transforms, domains, inits, tuple(decays), conditioned)


def default_transforms(spec) -> dict[str, list[str]]:
    """The transforms of every input, from the analysis of the spec (`roles`), never its names:
    - an input a decay or beta needs in a domain gets the transform into it (`DOMAIN_TRANSFORMS`:
      softplus for a positive dt_t in exp(dt_t A), logsigmoid for a g_t in exp(g_t), sigmoid for
      a beta in (0, 1); an input that may be any real, as a_t in sigmoid(a_t), stays as it is);
    - a delta-rule key that is a plain input, and every query reading its state: silu then
      l2norm (the recurrence needs |k| <= 1);
    - other write keys and readout queries: silu; everything else unchanged.
    """
    return roles(spec).transforms


def _as_log(c) -> Expr | None:
    """The log-decay a decay condition bounds: its expression for a log-gate (<= 0), the log of
    it for a decay in [0, 1] (a full elementwise gate); None for any other condition."""
    if c.lo == -math.inf and c.hi == 0:
        return c.expr
    if c.lo == 0 and c.hi == 1:
        return Call("log", (c.expr,))
    return None


def _reads(e: Expr, names: set[str]) -> list[str]:
    """The names of `names` that `e` reads (inputs as `x_t`, parameters as `x`), in order."""
    out = []
    for n in walk(e):
        if isinstance(n, Timed | Name) and n.name in names and n.name not in out:
            out.append(n.name)
    return out


def _param_role(mixer, name: str) -> str:
    """How a parameter outside decays starts (PARAM_INITS): as an "offset" where the spec adds
    it to something, else as a "multiplier"."""
    for eq in mixer.equations:
        for e in walk(inline(mixer, eq.value)):
            if isinstance(e, Binary) and e.op in ("+", "-"):
                sides = (e.left, e.right)
                if any(isinstance(x, Name) and x.name == name for x in sides):
                    return "offset"
    return "multiplier"


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


class _UnsolvableError(Exception):
    """A decay whose log is not an elementwise expression (a dot product, an l2norm)."""


def _evaluate(e: Expr, values: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """An elementwise expression (let functions inlined) on tensors that broadcast: enough for
    the log of a decay (`dt_t A`, `logsigmoid(a_t)`, `log(sigmoid(w_t) sigmoid(f_t))`)."""
    if isinstance(e, Number):
        return torch.tensor(float(e.text), dtype=torch.float64)
    if isinstance(e, Timed | Name):
        if e.name not in values:
            raise _UnsolvableError(e.name)
        return values[e.name]
    if isinstance(e, Neg):
        return -_evaluate(e.operand, values)
    if isinstance(e, Transpose):
        return _evaluate(e.operand, values)
    if isinstance(e, Call) and (e.func == "diag" or BUILTINS[e.func].elementwise):
        x = _evaluate(e.args[0], values)
        return x if e.func == "diag" else BUILTINS[e.func].tensor(x)
    if isinstance(e, Binary) and e.op in _ELEMENTWISE:
        return _ELEMENTWISE[e.op](_evaluate(e.left, values), _evaluate(e.right, values))
    raise _UnsolvableError(str(e))


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
        if not isinstance(spec, str | os.PathLike | Source | Spec):
            raise MixcError(
                f"spec: expected a spec path, a Source or a loaded Spec, got {type(spec).__name__}"
            )
        self.spec = (
            spec
            if isinstance(spec, Spec)
            else load_spec(os.fspath(spec) if isinstance(spec, os.PathLike) else spec)
        )
        self.mixer = load(self.spec.source)
        self.hidden_size = _count("hidden_size", hidden_size)
        self.num_heads = _count("num_heads", num_heads)
        self.chunk_size = _count("chunk_size", chunk_size)
        if self.chunk_size & (self.chunk_size - 1):
            raise MixcError(f"chunk_size: expected a power of two, got {chunk_size}")
        self._check_names()
        self.sizes = self._sizes_per_head({} if sizes is None else sizes)
        self.roles = roles(self.spec)
        self.transforms = self._transforms({} if transforms is None else transforms)
        conv_size = _count("conv_size", conv_size, least=0)
        self._check_memory(conv_size, sizes is not None)
        self._build_inputs(conv_size, conv_inputs)
        self._build_params()
        self._build_output(output_gate, norm)
        with torch.no_grad():
            self._start_decays()

    def _check_memory(self, conv_size: int, sized: bool) -> None:
        """The layer's parameters (projections, convolutions, gate and output) fit in this
        machine's memory: checked before any is allocated, naming the option that asks most."""
        mixer, heads, hidden = self.spec.mixer, self.num_heads, self.hidden_size
        widths = {d.name: heads * math.prod(self._size(s) for s in d.shape) for d in mixer.inputs}
        out_shape = self.spec.shapes[mixer.outputs[0].target]
        out_width = heads * (1 if out_shape == ("1", "1") else self._size(out_shape[0]))
        linear = hidden * (sum(widths.values()) + 2 * out_width)
        conv = conv_size * sum(widths[d.name] for d in mixer.inputs if len(d.shape) == 1)
        params = {"hidden_size": linear, "conv_size": conv}
        if sized:
            params["sizes"] = params.pop("hidden_size")
        option = max(params, key=params.get)
        value = {"hidden_size": hidden, "conv_size": conv_size, "sizes": self.sizes}[option]
        size = torch.get_default_dtype().itemsize
        check_bytes(option, value, (linear + conv) * size, "the layer's parameters")

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
        out = {name: list(chain) for name, chain in self.roles.transforms.items()}
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

    def _check_names(self) -> None:
        """The layer keeps a projection per input and a value per parameter in torch containers
        (nn.ModuleDict, nn.ParameterDict) by the spec's names, which torch refuses for the
        names of their own attributes (`keys`, `update`, `training`, ...)."""
        mixer = self.spec.mixer
        containers = (nn.ModuleDict(), nn.ParameterDict())
        for decl in (*mixer.inputs, *mixer.params):
            if any(hasattr(c, decl.name) for c in containers):
                raise MixcError(
                    f"{self.spec.source.filename}: MixerLayer cannot hold {decl.name!r}, a name "
                    "torch's containers keep for themselves; rename it in the spec "
                    f"(e.g. {decl.name}1)"
                )

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
        vectors = [d.name for d in mixer.inputs if len(d.shape) == 1]
        free = [n for n in vectors if n not in self.roles.conditioned]
        chosen = free if conv_inputs is None else _names("conv_inputs", conv_inputs)
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
            _, _, to_stored = PARAM_DOMAINS.get(roles.domains[param.name], _PLAIN)
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
            suffix, to_value, _ = PARAM_DOMAINS.get(self.roles.domains[name], _PLAIN)
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
        return int(symbol) if symbol.isdigit() else self.sizes[symbol]

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
        self._check_x(x)
        if not isinstance(use_cache, bool):
            raise MixcError(f"use_cache: expected True or False, got {type(use_cache).__name__}")
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
        if held and held != {batch}:  # a stateless mixer without a convolution holds nothing
            raise MixcError(
                f"state: the cache holds {', '.join(map(str, sorted(held)))} sequences, "
                f"x has B = {batch}"
            )
