"""What inputs to draw: input ranges derived from the analysis facts, and examples built on them.

Input ranges (`input_ranges`) are derived from the analysis facts, not from input names, so that
every drawn example is one the spec is meant to handle:

- a decay must be in (0, 1]: for every log-gate that the analysis cannot prove <= 0 (`g_t`,
  `dt_t A`, `log(gamma)`), each input or parameter it reads gets one of the domains
  real, positive, negative or unit interval, the most general assignment for which interval
  arithmetic proves the log-gate <= 0 (`g_t`: non-positive; `dt_t A`: dt > 0, A < 0);
- the delta rule's beta must be in [0, 2] (same search; a plain `beta_t` is drawn in (0, 1)), and
  a full elementwise gate in [0, 1];
- a delta-rule key that is a plain input is drawn with norm <= 1 (unit, shorter, or tiny); one
  written `l2norm(k_t)` may have any norm;
- a state read in the denominator of a ratio (the normaliser z) starts positive.

- a size that an l2norm runs over is at least 2 (the l2norm of one entry is its sign, and its
  gradient is pure cancellation).

Stress modes: a real input in a gate or beta is N(0, 1), N(5, 1), N(-5, 1) or N(0, 36) (decays
near 1 and near 0 whichever way the gate is written); a positive/negative one is softplus-sized,
tiny (|x| < 1e-3) or large (5..20); a unit-interval one is uniform, near 0 or near 1; a key that
is an input (or the l2norm of one) has its norm scaled by 1, 1e-3 or 10. Everything else is
N(0, 1), initial states 0.5 N(0, 1). `input_ranges(spec).describe()` lists what a spec gets.

What the fuzzer draws (`examples`): batch 1-3, heads 1-4, T in 1..max_T with a bias towards 1,
primes and lengths that are not multiples of a chunk size, a distinct size for every size symbol
(so K != V and a transposed state cannot pass by accident), 1-3 power-of-two chunk sizes, with or
without initial states, inputs given with 1 head or a divisor of the heads (shared, as Mamba-2
shares B and C), parameter defaults overridden by explicit tensors (to get their gradients), a
torch seed, and a stress mode for every input whose range matters. `draws` turns an example into
torch expressions (what a reproducer prints) and `make_case` into tensors.

Benchmarks, tests and examples draw from the same ranges at any size with `sample_inputs` and
`sample_states`; `decays_near_one` picks the stress modes that keep every decay near 1, as in a
trained model run over a long sequence.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from mixc.algebra.intervals import bounds
from mixc.analysis.plan import Plan, analyze
from mixc.frontend.ir import Binary, Call, Expr, Name, Timed, walk
from mixc.frontend.spec import Spec, load_spec
from mixc.transitions.base import Condition

__all__ = [
    "CHUNK_SIZES",
    "SAMPLERS",
    "SPECIAL_T",
    "Case",
    "Condition",
    "Draw",
    "Example",
    "InputRanges",
    "Range",
    "decays_near_one",
    "draws",
    "examples",
    "input_ranges",
    "make_case",
    "sample_inputs",
    "sample_states",
]

CHUNK_SIZES = (4, 16, 1, 2, 8, 32, 64)  # the first is what a shrunk example uses
SPECIAL_T = (1, 2, 3, 5, 7, 13, 17, 31, 37, 61, 64, 65, 97, 100, 127, 128, 129)

# ----------------------------------------------------------------------------- input ranges

_INF = math.inf
_REAL, _POS, _NEG, _UNIT = "real", "positive", "negative", "unit interval"
_DOMAINS = {_REAL: (-_INF, _INF), _POS: (0.0, _INF), _NEG: (-_INF, 0.0), _UNIT: (0.0, 1.0)}

_RANDN = "torch.randn({shape}, generator=gen, dtype=torch.float64)"
_RAND = "torch.rand({shape}, generator=gen, dtype=torch.float64)"
_ROWS = "torch.rand({rows}, generator=gen, dtype=torch.float64)"

#: Stress modes per domain, as torch expressions (the first mode is the plain one). These strings
#: are both what the fuzzer evaluates and what a reproducer prints.
SAMPLERS: dict[str, dict[str, str]] = {
    "plain": {"normal": _RANDN},
    _REAL: {
        "normal": _RANDN,
        "high": f"{_RANDN} + 5",
        "low": f"{_RANDN} - 5",
        "wide": f"6 * {_RANDN}",
    },
    "key": {"normal": _RANDN, "tiny": f"1e-3 * {_RANDN}", "large": f"10 * {_RANDN}"},
    _POS: {
        "normal": f"F.softplus({_RANDN})",
        "tiny": f"1e-3 * {_RAND}",
        "large": f"5 + 15 * {_RAND}",
    },
    _NEG: {
        "normal": f"-F.softplus({_RANDN})",
        "tiny": f"-1e-3 * {_RAND}",
        "large": f"-5 - 15 * {_RAND}",
    },
    _UNIT: {"uniform": _RAND, "near 0": f"1e-3 * {_RAND}", "near 1": f"1 - 1e-3 * {_RAND}"},
    "unit ball": {
        "unit": f"F.normalize({_RANDN}, dim=-1)",
        "short": f"F.normalize({_RANDN}, dim=-1) * {_ROWS}",
        "tiny": f"1e-3 * F.normalize({_RANDN}, dim=-1)",
    },
    "state": {"normal": f"0.5 * {_RANDN}"},
    "positive state": {"normal": f"0.5 * {_RANDN}.abs()"},
}

#: Where the bounded stress modes of SAMPLERS draw (a normal draw within 4 standard deviations);
#: any other mode may draw anywhere in its domain. `decays_near_one` chooses modes by these.
_SUPPORT = {
    (_REAL, "high"): (1.0, 9.0),
    (_REAL, "low"): (-9.0, -1.0),
    (_POS, "tiny"): (0.0, 1e-3),
    (_POS, "large"): (5.0, 20.0),
    (_NEG, "tiny"): (-1e-3, 0.0),
    (_NEG, "large"): (-20.0, -5.0),
    (_UNIT, "near 0"): (0.0, 1e-3),
    (_UNIT, "near 1"): (1 - 1e-3, 1.0),
}


@dataclass(frozen=True)
class Range:
    """How one input, parameter or initial state is drawn, and why."""

    name: str
    kind: str  # "input" | "param" | "state"
    domain: str  # a key of SAMPLERS
    why: str

    @property
    def modes(self) -> tuple[str, ...]:
        return tuple(SAMPLERS[self.domain])


@dataclass(frozen=True)
class InputRanges:
    """What the fuzzer needs to know about a spec: its facts and how to draw each argument."""

    spec: Spec
    facts: Plan
    ranges: tuple[Range, ...]
    notes: tuple[str, ...]
    wide: frozenset[str] = frozenset()  # size symbols drawn >= 2 (l2norm over one entry is a sign)

    @property
    def mixer(self):
        return self.spec.mixer

    def range(self, name: str) -> Range:
        return next(r for r in self.ranges if r.name == name)

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.mixer.inputs)

    @property
    def params(self) -> tuple[str, ...]:
        """Parameters without a default (positional arguments of every form)."""
        return tuple(p.name for p in self.mixer.params if p.default is None)

    @property
    def defaults(self) -> tuple[str, ...]:
        """Parameters with a default (keyword-only overrides)."""
        return tuple(p.name for p in self.mixer.params if p.default is not None)

    @property
    def states(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.mixer.states)

    @property
    def output(self) -> str:
        return self.mixer.outputs[0].target

    @property
    def symbols(self) -> tuple[str, ...]:
        """Size symbols (K, V, ...) in order of first use."""
        out: list[str] = []
        for d in (*self.mixer.inputs, *self.mixer.params, *self.mixer.states):
            out += [s for s in d.shape if not s.isdigit() and s not in out]
        return tuple(out)

    def describe(self) -> str:
        """One line per drawn argument: its domain, stress modes and the fact it comes from."""
        lines = [
            f"{r.kind} {r.name}: {r.domain} ({', '.join(r.modes)}): {r.why}" for r in self.ranges
        ]
        return "\n".join(lines + [f"note: {n}" for n in self.notes])


def _free(e: Expr, inputs: set[str], params: set[str]) -> list[str]:
    out = []
    for n in walk(e):
        name = n.name if isinstance(n, Timed) and n.name in inputs else None
        name = name or (n.name if isinstance(n, Name) and n.name in params else None)
        if name and name not in out:
            out.append(name)
    return out


# ----------------------------------------------------------------------------- deriving ranges


@dataclass(frozen=True)
class _Names:
    """The names of a mixer's arguments, by role, and its parameter defaults."""

    inputs: set[str]
    params: set[str]  # without a default
    defaults: dict[str, Expr]

    @classmethod
    def of(cls, mixer) -> _Names:
        return cls(
            {d.name for d in mixer.inputs},
            {p.name for p in mixer.params if p.default is None},
            {p.name: p.default for p in mixer.params if p.default is not None},
        )


def _transition_bounds(facts: Plan, names: _Names) -> tuple[list[Condition], dict[str, str]]:
    """Every state's conditions on its transition, and the inputs drawn as keys of norm <= 1."""
    conditions: list[Condition] = []
    unit_keys: dict[str, str] = {}
    for s in facts.states:
        tr = s.transition
        conditions += tr.kind.conditions(s.name, tr)
        key = tr.kind.unit_key(tr)
        if key is not None:
            why = f"delta-rule key {tr.key} of {s.name}: norm <= 1 keeps it stable"
            unit_keys.update(dict.fromkeys(_free(key, names.inputs, set()), why))
    return conditions, unit_keys


def _write_keys(facts: Plan, inputs: set[str]) -> dict[str, str]:
    """Inputs that are the key of a write (or its l2norm): their norm is what the key's is."""
    keys: dict[str, str] = {}
    for s in facts.states:
        for w in s.writes:
            inner = w.key.args[0] if isinstance(w.key, Call) and w.key.func == "l2norm" else w.key
            if isinstance(inner, Timed) and inner.name in inputs:
                keys.setdefault(inner.name, f"key {w.key} of {s.name}")
    return keys


def _positive_states(facts: Plan) -> dict[str, str]:
    """States read in the denominator of a ratio output: they start positive."""
    out: dict[str, str] = {}
    for o in facts.outputs:
        if o.form == "ratio" and isinstance(o.expr, Binary):
            for n in walk(o.expr.right):
                if isinstance(n, Name) and n.name.startswith("_r"):
                    r = o.readouts[int(n.name[2:])]
                    out[r.state] = f"read in the denominator of {o.name}"
    return out


def _holds(conditions: list[Condition], env: dict, defaults: dict[str, Expr]) -> bool:
    """Whether interval arithmetic proves every condition for the intervals in `env`."""
    for c in conditions:
        lo, hi = bounds(c.expr, env, defaults)
        if not (c.lo <= lo and hi <= c.hi):
            return False
    return True


def _domains(
    conditions: list[Condition], unit_keys: dict[str, str], names: _Names
) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """(domain of every variable of a condition, why, notes): the most general assignment of
    domains (fewest restricted variables) for which interval arithmetic proves every condition;
    all real, with a note, when none does."""
    variables: list[str] = []
    for c in conditions:
        free = _free(c.expr, names.inputs, names.params)
        variables += [n for n in free if n not in variables and n not in unit_keys]
    domains = {n: _REAL for n in variables}
    if not conditions:
        return domains, {}, []
    notes = []
    found = _search_domains(conditions, variables, unit_keys, names.defaults)
    if found is None:
        failing = "; ".join(c.why for c in conditions)
        notes.append(
            f"no input ranges provably satisfy: {failing}; drawing those inputs from N(0, 1)"
        )
    else:
        domains = found
    why = {
        n: "; ".join(c.why for c in conditions if n in _free(c.expr, names.inputs, names.params))
        for n in variables
    }
    return domains, why, notes


def _search_domains(
    conditions: list[Condition],
    variables: list[str],
    unit_keys: dict[str, str],
    defaults: dict[str, Expr],
) -> dict[str, str] | None:
    """The first assignment of domains, fewest restricted variables first, that proves every
    condition (all real only, when there are more than 6 variables), or None."""
    options = [_REAL, _POS, _NEG, _UNIT]
    combos = (
        itertools.product(range(len(options)), repeat=len(variables))
        if len(variables) <= 6
        else [(0,) * len(variables)]
    )
    for combo in sorted(combos, key=lambda c: (sum(i > 0 for i in c), c)):
        env = {n: _DOMAINS[options[i]] for n, i in zip(variables, combo, strict=True)}
        env.update({n: (-1.0, 1.0) for n in unit_keys})
        if _holds(conditions, env, defaults):
            return {n: options[i] for n, i in zip(variables, combo, strict=True)}
    return None


def _wide_sizes(facts: Plan) -> frozenset[str]:
    """Size symbols an l2norm runs over: drawn >= 2 (the l2norm of one entry is its sign, so
    its gradient is all cancellation)."""
    exprs = [
        e
        for s in facts.states
        for e in (s.transition.key, s.transition.beta, *(w.key for w in s.writes))
    ]
    exprs += [r.query for o in facts.outputs for r in o.readouts]
    decls = {d.name: d for d in facts.mixer.inputs}
    return frozenset(
        size
        for e in exprs
        if e is not None
        for n in walk(e)
        if isinstance(n, Call) and n.func == "l2norm"
        for m in walk(n)
        if isinstance(m, Timed) and m.name in decls
        for size in decls[m.name].shape
        if not size.isdigit()
    )


def input_ranges(spec: Spec | str | os.PathLike, facts: Plan | None = None) -> InputRanges:
    """Derive how to draw every argument of `spec` from its analysis facts (see the module doc)."""
    spec = spec if isinstance(spec, Spec) else load_spec(spec)
    facts = facts or analyze(spec)
    mixer = spec.mixer
    names = _Names.of(mixer)
    conditions, unit_keys = _transition_bounds(facts, names)
    domains, why, notes = _domains(conditions, unit_keys, names)
    keys = _write_keys(facts, names.inputs)
    positive = _positive_states(facts)

    ranges: list[Range] = []
    for d in mixer.inputs:
        if d.name in unit_keys:
            ranges.append(Range(d.name, "input", "unit ball", unit_keys[d.name]))
        elif d.name in domains:
            ranges.append(Range(d.name, "input", domains[d.name], why[d.name]))
        elif d.name in keys:
            ranges.append(Range(d.name, "input", "key", keys[d.name]))
        else:
            ranges.append(Range(d.name, "input", "plain", "no constraint"))
    for p in mixer.params:
        if p.default is None and p.name in domains:
            ranges.append(Range(p.name, "param", domains[p.name], why[p.name]))
        elif p.default is None:
            ranges.append(Range(p.name, "param", "plain", "no constraint"))
    for s in mixer.states:
        if s.name in positive:
            ranges.append(Range(s.name, "state", "positive state", positive[s.name]))
        else:
            ranges.append(Range(s.name, "state", "state", "no constraint"))
    return InputRanges(spec, facts, tuple(ranges), tuple(notes), _wide_sizes(facts))


def decays_near_one(r: InputRanges) -> dict[str, str]:
    """The stress mode of every input and parameter of a decay that keeps the decay nearest 1
    (each log-gate nearest 0, each elementwise gate nearest 1), as in a trained model over a
    long sequence: decay factors multiplied over a chunk stay normal floats (subnormals would
    time a CPU's slow path, not the algorithm). Other arguments keep their plain mode."""
    names = _Names.of(r.mixer)
    drawn = {x.name: x for x in r.ranges if x.domain in _DOMAINS}
    modes: dict[str, str] = {}
    for s in r.facts.states:
        for c in s.transition.kind.decay_conditions(s.name, s.transition):
            variables = [n for n in _free(c.expr, names.inputs, names.params) if n in drawn]
            modes.update(_modes_near_one(c, [drawn[n] for n in variables], names.defaults))
    return modes


def _modes_near_one(
    c: Condition, variables: list[Range], defaults: dict[str, Expr]
) -> dict[str, str]:
    """The modes of `variables` whose supports give `c.expr` the highest lower bound (plain
    modes on a tie)."""

    def score(combo: tuple[str, ...]) -> tuple[float, int]:
        env = {
            x.name: _SUPPORT.get((x.domain, m), _DOMAINS[x.domain])
            for x, m in zip(variables, combo, strict=True)
        }
        plain = sum(m == x.modes[0] for x, m in zip(variables, combo, strict=True))
        return bounds(c.expr, env, defaults)[0], plain

    best = max(itertools.product(*(x.modes for x in variables)), key=score)
    return {x.name: m for x, m in zip(variables, best, strict=True)}


# ----------------------------------------------------------------------------- examples


@dataclass(frozen=True)
class Example:
    """One drawn case: sizes, forms to run, stress modes, and the torch seed of every tensor."""

    batch: int
    heads: int
    T: int
    sizes: tuple[tuple[str, int], ...]
    chunk_sizes: tuple[int, ...]
    initial_state: bool
    input_heads: tuple[tuple[str, int], ...]  # heads each input is given with (divides `heads`)
    modes: tuple[tuple[str, str], ...]  # stress mode of each argument that has several
    override_defaults: bool
    seed: int

    def describe(self) -> str:
        sizes = " ".join(f"{k}={v}" for k, v in self.sizes)
        shared = [f"{n}:{h}" for n, h in self.input_heads if h != self.heads]
        modes = [f"{n}={m}" for n, m in self.modes]
        parts = [
            f"batch={self.batch} heads={self.heads} T={self.T} {sizes}".strip(),
            f"chunk_sizes={','.join(map(str, self.chunk_sizes))}",
            f"initial_state={'yes' if self.initial_state else 'no'}",
        ]
        if shared:
            parts.append("input heads " + " ".join(shared))
        if modes:
            parts.append("modes " + " ".join(modes))
        if self.override_defaults:
            parts.append("parameter defaults passed explicitly")
        parts.append(f"seed={self.seed}")
        return ", ".join(parts)


def examples(
    r: InputRanges,
    *,
    max_T: int = 100,
    max_size: int = 12,
    max_batch: int = 3,
    max_heads: int = 4,
    chunked: bool = True,
):
    """A hypothesis strategy of `Example`s for the ranges `r` (see the module doc)."""
    from hypothesis import strategies as st

    ts = [t for t in SPECIAL_T if t <= max_T]

    @st.composite
    def draw(draw_) -> Example:
        batch = draw_(st.integers(1, max_batch))
        heads = draw_(st.integers(1, max_heads))
        T = draw_(st.one_of(st.integers(1, max_T), st.sampled_from(ts)))
        values = _draw_sizes(draw_, r, max_size)
        chunk_sizes = (
            tuple(
                draw_(st.lists(st.sampled_from(CHUNK_SIZES), min_size=1, max_size=3, unique=True))
            )
            if chunked
            else ()
        )
        initial = draw_(st.booleans())
        divisors = [heads] + [d for d in range(1, heads) if heads % d == 0]
        input_heads = [(name, draw_(st.sampled_from(divisors))) for name in r.inputs]
        if input_heads and all(h < heads for _, h in input_heads):  # the inputs fix NH
            input_heads[0] = (input_heads[0][0], heads)
        modes = tuple(
            (x.name, draw_(st.sampled_from(x.modes))) for x in r.ranges if len(x.modes) > 1
        )
        override = bool(r.defaults) and draw_(st.booleans())
        seed = draw_(st.integers(0, 2**31 - 1))
        return Example(
            batch,
            heads,
            T,
            tuple(zip(r.symbols, values, strict=True)),
            chunk_sizes,
            initial,
            tuple(input_heads),
            modes,
            override,
            seed,
        )

    return draw()


def _draw_sizes(draw_, r: InputRanges, max_size: int) -> list[int]:
    """A distinct size for every size symbol, >= 2 for those an l2norm runs over."""
    from hypothesis import strategies as st

    symbols = r.symbols
    n = len(symbols)
    values = draw_(st.lists(st.integers(1, max(max_size, n)), min_size=n, max_size=n, unique=True))
    wide = [i for i, s in enumerate(symbols) if s in r.wide]
    if any(values[i] == 1 for i in wide):  # give the 1 to a symbol that may be 1, or shift all
        narrow = [i for i in range(n) if i not in wide]
        one = values.index(1)
        if narrow:
            values[one], values[narrow[0]] = values[narrow[0]], values[one]
        else:
            values = [x + 1 for x in values]
    return values


# ----------------------------------------------------------------------------- one case


def _dims(shape: tuple[str, ...], sizes: dict[str, int]) -> list[int]:
    return [int(s) if s.isdigit() else sizes[s] for s in shape]


def _out_dims(shape: tuple[str, str]) -> list[str]:
    """The output's trailing dims in the module layout: a scalar has none, a row or column one."""
    return [d for d in shape if d != "1"] if "1" in shape else list(shape)


def _default_values(r: InputRanges, heads: int, sizes: dict[str, int]) -> dict[str, list]:
    """Parameter defaults as explicit values [NH, *shape], evaluated as the oracle does."""
    from mixc.oracle.interpret import _Evaluator

    ev = _Evaluator(r.mixer, {}, torch.device("cpu"))
    h = torch.arange(heads, dtype=torch.float64).reshape(1, heads, 1, 1)
    out = {}
    for prm in r.mixer.params:
        if prm.default is None:
            continue
        dims = _dims(prm.shape, sizes)
        value = ev.eval(prm.default, {"h": h})
        value = value.expand(1, heads, *([*dims, 1, 1][:2] if len(dims) < 2 else dims))
        out[prm.name] = value.reshape(heads, *dims).tolist()
    return out


@dataclass(frozen=True)
class Draw:
    """One tensor of a case: its name, role and the torch expression that makes it."""

    name: str
    kind: str  # "input" | "param" | "default" | "state" | "cotangent"
    code: str


def draws(r: InputRanges, ex: Example) -> list[Draw]:
    """Every tensor of the case, in generation order, as torch expressions over `gen` (seeded
    with `ex.seed`), B, T, NH and the size symbols. Shared by the fuzzer and its reproducers."""
    sizes = dict(ex.sizes)
    modes = dict(ex.modes)
    heads = dict(ex.input_heads)
    out: list[Draw] = []

    def code(x: Range, shape: list[str]) -> str:
        template = SAMPLERS[x.domain][modes.get(x.name, x.modes[0])]
        return template.format(shape=", ".join(shape), rows=", ".join([*shape[:-1], "1"]))

    for d in r.mixer.inputs:
        nh = "NH" if heads.get(d.name, ex.heads) == ex.heads else str(heads[d.name])
        out.append(Draw(d.name, "input", code(r.range(d.name), ["B", "T", nh, *d.shape])))
    for prm in r.mixer.params:
        if prm.default is None:
            out.append(Draw(prm.name, "param", code(r.range(prm.name), ["NH", *prm.shape])))
    if ex.override_defaults:
        for name, value in _default_values(r, ex.heads, sizes).items():
            out.append(Draw(name, "default", f"torch.tensor({value!r}, dtype=torch.float64)"))
    if ex.initial_state:
        for s in r.mixer.states:
            out.append(Draw(s.name, "state", code(r.range(s.name), ["B", "NH", *s.shape])))
    y_shape = _out_dims(r.spec.shapes[r.output])
    out.append(
        Draw(r.output, "cotangent", _RANDN.format(shape=", ".join(["B", "T", "NH", *y_shape])))
    )
    for s in r.mixer.states:
        out.append(Draw(s.name, "cotangent", _RANDN.format(shape=", ".join(["B", "NH", *s.shape]))))
    return out


def _namespace(ex: Example) -> dict:
    gen = torch.Generator().manual_seed(ex.seed)
    return {
        "torch": torch,
        "F": torch.nn.functional,
        "gen": gen,
        "B": ex.batch,
        "T": ex.T,
        "NH": ex.heads,
        **dict(ex.sizes),
    }


@dataclass
class Case:
    """The float64 tensors of one example, by role."""

    inputs: dict[str, Tensor]
    params: dict[str, Tensor]  # without a default
    defaults: dict[str, Tensor]  # explicit values of parameters with a default
    states: dict[str, Tensor]
    cot_y: Tensor
    cot_states: dict[str, Tensor]


def make_case(r: InputRanges, ex: Example) -> Case:
    """The tensors of example `ex`, made by evaluating its `draws`."""
    ns = _namespace(ex)
    case = Case({}, {}, {}, {}, torch.empty(0), {})
    for d in draws(r, ex):
        x = eval(d.code, ns)  # our own sampler templates (SAMPLERS): the reproducer prints them
        if d.kind == "input":
            case.inputs[d.name] = x
        elif d.kind == "param":
            case.params[d.name] = x
        elif d.kind == "default":
            case.defaults[d.name] = x
        elif d.kind == "state":
            case.states[d.name] = x
        elif d.name == r.output and d.kind == "cotangent" and case.cot_y.numel() == 0:
            case.cot_y = x
        else:
            case.cot_states[d.name] = x
    return case


# ----------------------------------------------------------------------------- any size


def _sample(
    r: InputRanges,
    kinds: tuple[str, ...],
    sizes: Mapping[str, int],
    T: int,
    batch: int,
    heads: int,
    seed: int,
    modes: Mapping[str, str],
    input_heads: Mapping[str, int],
) -> list[Tensor]:
    """The float64 draws of the given kinds, in order, for an example of these sizes."""
    ex = Example(
        batch,
        heads,
        T,
        tuple((s, sizes[s]) for s in r.symbols),
        (),
        "state" in kinds,
        tuple(input_heads.items()),
        tuple(modes.items()),
        False,
        seed,
    )
    ns = _namespace(ex)
    # our own sampler templates (SAMPLERS), evaluated as make_case does
    return [eval(d.code, ns) for d in draws(r, ex) if d.kind in kinds]


def sample_inputs(
    spec: Spec | str | os.PathLike,
    sizes: Mapping[str, int],
    T: int,
    *,
    batch: int = 1,
    heads: int = 1,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
    modes: Mapping[str, str] | None = None,
    input_heads: Mapping[str, int] | None = None,
    facts: Plan | None = None,
) -> list[Tensor]:
    """Random arguments for the compiled module of `spec`, in its argument order and layout:
    every input [batch, T, heads, *shape] (or `input_heads[name]` heads, shared across groups),
    then every parameter without a default [heads, *shape]. Drawn from the fuzzer's input ranges
    (each range's plain mode, or `modes[name]`, e.g. `decays_near_one`) with a generator seeded
    by `seed`, at the sizes of `sizes` (every size symbol), in `dtype` on `device`."""
    r = input_ranges(spec, facts)
    tensors = _sample(
        r, ("input", "param"), sizes, T, batch, heads, seed, modes or {}, input_heads or {}
    )
    return [x.to(dtype=dtype, device=device) for x in tensors]


def sample_states(
    spec: Spec | str | os.PathLike,
    sizes: Mapping[str, int],
    *,
    batch: int = 1,
    heads: int = 1,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
    facts: Plan | None = None,
) -> list[Tensor]:
    """Random initial states [batch, heads, *shape] for the compiled module of `spec`, in its
    state order, drawn as the fuzzer draws them (a denominator's state positive)."""
    r = input_ranges(spec, facts)
    tensors = _sample(r, ("state",), sizes, 1, batch, heads, seed, {}, {})
    return [x.to(dtype=dtype, device=device) for x in tensors]
