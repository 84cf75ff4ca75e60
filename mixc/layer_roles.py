"""The defaults of `mixc.nn.MixerLayer`, from what the analysis says each input and parameter of
a spec is for (`roles`), never from their names: the transforms each projected input goes through,
the domain each learnable parameter is stored in, the role it starts by, and the decays of every
state, which start near 1 (`DECAY_INIT`). docs/layers.md compares them with flash-linear-attention's
layers.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mixc.algebra.expand import inline
from mixc.errors import MixcError, Source
from mixc.frontend.ir import Binary, Call, Expr, Name, Timed, angle_reads, children, walk
from mixc.frontend.spec import Spec, load_spec

__all__ = [
    "DECAY_INIT",
    "DOMAIN_TRANSFORMS",
    "ERASE_INIT",
    "PARAM_DOMAINS",
    "PARAM_INITS",
    "TRANSFORMS",
    "Decay",
    "Roles",
    "default_transforms",
    "layer_spec",
    "reads",
    "roles",
    "stored_as",
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


def stored_as(domain: str) -> tuple[str, Callable, Callable]:
    """How a learnable parameter of `domain` is stored (PARAM_DOMAINS), or as it is where any
    value will do."""
    return PARAM_DOMAINS.get(domain, _PLAIN)


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


def _matrix_init(*shape: int) -> torch.Tensor:
    """A "matrix" parameter [NH, rows, cols] (a projection, a codebook): random rows of norm
    about 1, N(0, 1/cols), so that its rows differ (equal rows would get equal gradients and
    never part)."""
    return torch.randn(*shape) / math.sqrt(shape[-1])


PARAM_INITS: dict[str, Callable[..., torch.Tensor]] = {
    "rate": _rate_init,
    "matrix": _matrix_init,
    "multiplier": torch.ones,
    "offset": torch.zeros,
}

#: Per-token decays at initialisation: each state's log-decay -w starts with w log-uniform in
#: this range, drawn per head and channel, so memories span 16 to 512 tokens (half-lives of 11
#: to 355) before training; a state with several decays (an outer-product gate) splits w
#: between them.
DECAY_INIT = (2.0**-9, 2.0**-4)

#: An erase strength at initialisation (the beta of a delta rule, whatever the spec scales it
#: by): 0.5, gated DeltaNet's sigmoid(0), so that a token's erase leaves half of what the state
#: holds along its key; DeltaProduct's 2 sigmoid(b) at b = 0 would erase all of it, twice a
#: token.
ERASE_INIT = 0.5


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
    - `erases`: every erase strength of every state (a delta rule's beta, let functions
      inlined), started at ERASE_INIT the same way (the inputs in it get a learnable bias);
    - `conditioned`: the inputs a stability condition bounds (decays and beta), and the angles
      (inputs read only inside cos, sin and the rotations' angles), which are not convolved by
      default;
    - `keys`: the inputs read only as queries of a readout or keys of a write (no value, no
      decay), which a group of value heads may share (`MixerLayer(num_v_heads=...)`).
    """

    transforms: dict[str, list[str]]
    domains: dict[str, str]
    inits: dict[str, str]
    decays: tuple[Decay, ...]
    conditioned: frozenset[str]  # inputs a stability condition bounds (decays, beta)
    keys: frozenset[str] = frozenset()  # queries and keys a group of value heads may share
    erases: tuple[Expr, ...] = ()
    #: (d, p): a vector [d] turned by [p] angles (p <= d / 2): p defaults to d / 4, the leading
    #: half of the pairs (Mamba-3's rope_fraction 0.5)
    rotated: tuple[tuple[str, str], ...] = ()

    def biased(self, mixer) -> list[str]:
        """The inputs that get a learnable bias: every input read by a decay or an erase
        strength."""
        inputs = {d.name for d in mixer.inputs}
        starts = [x.log for x in self.decays] + list(self.erases)
        return [d.name for d in mixer.inputs if any(d.name in reads(e, inputs) for e in starts)]


def layer_spec(spec) -> Spec:
    """The spec a layer is given as a path (str or os.PathLike), a Source or a loaded Spec."""
    if not isinstance(spec, str | os.PathLike | Source | Spec):
        raise MixcError(
            f"spec: expected a spec path, a Source or a loaded Spec, got {type(spec).__name__}"
        )
    if isinstance(spec, Spec):
        return spec
    return load_spec(os.fspath(spec) if isinstance(spec, os.PathLike) else spec)


def roles(spec) -> Roles:
    """The roles of a spec's inputs and parameters (a spec path, str or os.PathLike, a Source or
    a loaded Spec), from its plan and the input ranges the transition classes declare
    (`TransitionClass.conditions`, `unit_key`): see `Roles`."""
    from mixc.check.ranges import input_ranges

    spec = layer_spec(spec)
    ranges = input_ranges(spec)
    plan, mixer = ranges.plan, spec.mixer
    inputs = {d.name for d in mixer.inputs}
    learned = [p.name for p in mixer.params if p.default is None]
    domain = {r.name: r.domain for r in ranges.ranges}

    transforms, keys = _transforms_and_keys(plan, mixer, domain)
    angles = _angle_inputs(mixer)  # an angle is used as given: no silu, no convolution
    transforms = {n: ["identity"] if n in angles else chain for n, chain in transforms.items()}

    decays = []
    for s in plan.states:
        logs = [
            _as_log(c) for c in s.transition.transition_class.decay_conditions(s.name, s.transition)
        ]
        logs = [inline(mixer, lg) for lg in logs if lg is not None]
        decays += [Decay(s.name, lg, 1 / len(logs)) for lg in logs]

    erases = _erase_strengths(plan, mixer)
    divisors = _divisors(mixer)
    domains = {p: domain[p] for p in learned}  # "plain" or "real": any value
    domains.update(
        {p: "positive" for p in divisors & set(learned) if domains[p] in ("plain", "real")}
    )
    inits = {p: _param_role(mixer, p) for p in learned}
    for d in decays:
        params = reads(d.log, set(learned))
        for p in params:
            if reads(d.log, inputs):
                inits[p] = "rate" if domains[p] in ("negative", "positive") else "offset"
            else:
                inits[p] = "decay"
    bounded = {"positive", "negative", "unit interval", "real"}
    conditioned = frozenset(n for n in inputs if domain[n] in bounded or n in angles)
    keys -= conditioned | {n for d in decays for n in reads(d.log, inputs)}
    return Roles(
        transforms,
        domains,
        inits,
        tuple(decays),
        conditioned,
        frozenset(keys),
        erases,
        ranges.halved,
    )


def _erase_strengths(plan, mixer) -> tuple[Expr, ...]:
    """Every erase strength of every state (each step a token applies), let functions inlined:
    what the transition classes bound beside the decays (`TransitionClass.conditions`: a
    delta rule's beta in [0, 2])."""
    out: list[Expr] = []
    for s in plan.states:
        for tr in s.transition.acting:
            cls = tr.transition_class
            decays = {str(c.expr) for c in cls.decay_conditions(s.name, tr)}
            for c in cls.conditions(s.name, tr):
                erase = inline(mixer, c.expr)
                if str(c.expr) not in decays and c.lo == 0 and erase not in out:
                    out.append(erase)
    return tuple(out)


def _transforms_and_keys(plan, mixer, domain: dict[str, str]) -> tuple[dict, set[str]]:
    """Each input's transforms (see `default_transforms`), and the inputs read as queries or
    write keys and never as a write's value."""
    inputs = {d.name for d in mixer.inputs}
    transforms: dict[str, list[str]] = {}
    keys, values = set(), set()
    unit_states = {
        s.name
        for s in plan.states
        for part in s.transition.acting  # each step a token applies (not those that only write)
        if part.transition_class.unit_key(s.name, part) is not None
    }
    for o in plan.outputs:  # queries: silu, and l2norm where they read a state of unit keys
        for r in o.readouts:
            chain = ["silu", "l2norm"] if r.state in unit_states else ["silu"]
            for name in reads(r.query, inputs):
                transforms.setdefault(name, chain)
                keys.add(name)
    for s in plan.states:  # write keys: silu
        for w in s.writes:
            for name in reads(w.key, inputs):
                transforms.setdefault(name, ["silu"])
                keys.add(name)
            values.update(reads(w.value, inputs))
    for name in inputs:
        if domain[name] in DOMAIN_TRANSFORMS:
            transforms[name] = list(DOMAIN_TRANSFORMS[domain[name]])
    transforms = {d.name: transforms.get(d.name, ["identity"]) for d in mixer.inputs}
    return transforms, keys - values


def _angle_inputs(mixer) -> set[str]:
    """The inputs every read of which lies inside an angle (`angle_only`), or in the update of
    a state of angles (a state read only inside angles: Mamba-3's summed angles, whose rate w_t
    is such an input): they pass as given, neither convolved nor put through silu."""
    reads = [(eq.target, *angle_reads(mixer, eq.value)) for eq in mixer.equations]
    states = {s.name for s in mixer.states}
    # a state of angles: read inside angles only, but in its own update (Th_{t-1})
    angle_states = {
        s
        for s in states
        if any(s in i for _, i, _ in reads) and not any(s in o for t, _, o in reads if t != s)
    }
    inside: set[str] = set()
    outside: set[str] = set()
    for target, i, o in reads:
        inside |= i
        (inside if target in angle_states else outside).update(o)
    return {d.name for d in mixer.inputs} & (inside - outside)


def default_transforms(spec) -> dict[str, list[str]]:
    """The transforms of every input (of a spec as `roles` takes it), from the analysis of the spec (`roles`), never its names:
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


def reads(e: Expr, names: set[str]) -> list[str]:
    """The names of `names` that `e` reads (inputs as `x_t`, parameters as `x`), in order."""
    out = []
    for n in walk(e):
        if isinstance(n, Timed | Name) and n.name in names and n.name not in out:
            out.append(n.name)
    return out


def _param_role(mixer, name: str) -> str:
    """How a parameter outside decays starts (PARAM_INITS): as a "matrix" where it has two
    dimensions (a projection, a codebook), as an "offset" where the spec adds it to something,
    else as a "multiplier"."""
    if len(next(p for p in mixer.params if p.name == name).shape) >= 2:
        return "matrix"
    for eq in mixer.equations:
        for e in walk(inline(mixer, eq.value)):
            if isinstance(e, Binary) and e.op in ("+", "-"):
                sides = (e.left, e.right)
                if any(isinstance(x, Name) and x.name == name for x in sides):
                    return "offset"
    return "multiplier"


#: Built-ins whose value is positive whatever their argument: a parameter read only inside one
#: of them cannot make a divisor 0, and needs no positive start.
POSITIVE_CALLS = frozenset({"exp", "softmax", "sigmoid", "softplus"})


def _divisors(mixer) -> set[str]:
    """The parameters the spec divides by (under a `/`, let functions inlined, outside a
    positive built-in such as `softmax`): starting them at 0 would make the first step divide
    by 0."""
    params = {p.name for p in mixer.params}
    found = set()
    for eq in mixer.equations:
        for e in walk(inline(mixer, eq.value)):
            if isinstance(e, Binary) and e.op == "/":
                found |= _names_outside_positive_calls(e.right) & params
    return found


def _names_outside_positive_calls(expr: Expr) -> set[str]:
    """The names in `expr` that are not inside a call of POSITIVE_CALLS (iterative, as walk)."""
    found, stack = set(), [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, Name):
            found.add(e.name)
        elif not (isinstance(e, Call) and e.func in POSITIVE_CALLS):
            stack.extend(children(e))
    return found
