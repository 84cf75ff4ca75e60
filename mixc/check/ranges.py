"""Input ranges: how the fuzzer draws every argument of a spec, derived from its analysis plan.

The ranges are derived from the plan, not from input names, so that every drawn example is one
the spec is meant to handle:

- a decay must be in (0, 1]: for every log-gate that the analysis cannot prove <= 0 (`g_t`,
  `dt_t A`, `log(gamma)`), each input or parameter it reads gets one of the domains
  real, positive, negative or unit interval, the most general assignment for which interval
  arithmetic (`mixc.algebra.intervals`) proves the log-gate <= 0 (`g_t`: non-positive;
  `dt_t A`: dt > 0, A < 0);
- the delta rule's beta must be in [0, 2] (same search; a plain `beta_t` is drawn in (0, 1)), and
  a full elementwise gate in [0, 1];
- a delta-rule key that is a plain input is drawn with norm <= 1 (unit, shorter, or tiny); one
  written `l2norm(k_t)` may have any norm; in a rank-1 term `a b^T` with no erase strength
  (the diagonal-plus-low-rank class's general form), an input read on both sides is such a
  key, and one read on one side only (a scalar factor, or a vector gating the key) is drawn in
  the unit interval, unless a decay's condition bounds it, or it is read only inside a bounded
  function (`sigmoid(d_t)`, `l2norm(kappa_t)`), which any value keeps bounded;
- a state read in the denominator of a ratio (the normaliser z), or inside a log, starts
  positive;
- a size that an l2norm runs over is at least 2 (the l2norm of one entry is its sign, and its
  gradient is pure cancellation).

Stress modes: a real input in a gate or beta is N(0, 1), N(5, 1), N(-5, 1) or N(0, 36) (decays
near 1 and near 0 whichever way the gate is written); a positive/negative one is softplus-sized,
tiny (|x| < 1e-3) or large (5..20); a unit-interval one is uniform, near 0 or near 1; a key that
is an input (or the l2norm of one) has its norm scaled by 1, 1e-3 or 10. Everything else is
N(0, 1), initial states 0.5 N(0, 1). `input_ranges(spec).describe()` lists what a spec gets;
`decays_near_one` picks the stress modes that keep every decay near 1, as in a trained model run
over a long sequence.

Each stress mode is a torch expression (`SAMPLERS`), which `mixc.check.sampling` evaluates.
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass

from mixc.algebra.expand import inline
from mixc.algebra.intervals import bounds
from mixc.analysis.plan import Plan, analyze
from mixc.frontend.builtins import ROTATIONS
from mixc.frontend.ir import POSITION, Binary, Call, Expr, Name, Timed, children, walk
from mixc.frontend.spec import Spec, load_spec
from mixc.transitions.base import Condition

__all__ = ["SAMPLERS", "InputRanges", "Range", "decays_near_one", "input_ranges"]

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
    # the position a call starts at: whole numbers, near 0 or far from it (angles of 10^6 rad)
    "position": {
        "far": "torch.randint(0, 10**6, ({shape},), generator=gen).to(torch.float64)",
        "near": "torch.randint(0, 100, ({shape},), generator=gen).to(torch.float64)",
    },
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
    """What the fuzzer needs to know about a spec: its plan and how to draw each argument."""

    spec: Spec
    plan: Plan
    ranges: tuple[Range, ...]
    notes: tuple[str, ...]
    wide: frozenset[str] = frozenset()  # size symbols drawn >= 2 (l2norm over one entry is a sign)
    #: (d, p) size symbols of a rotation of a vector [d] by [p] angles: drawn with 2 p <= d
    halved: tuple[tuple[str, str], ...] = ()

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
        """What the forms carry: the states, then each lagged input's last token (`x_{t-1}`)."""
        return tuple(s.name for s in self.mixer.carried)

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


def _transition_bounds(
    plan: Plan, names: _Names
) -> tuple[list[Condition], dict[str, str], dict[str, str]]:
    """Every state's conditions on its transition, the inputs drawn as keys of norm <= 1, and
    the inputs drawn in the unit interval, with why.

    A unit key's inputs are what its norm bound reads outside a bounded function (RWKV-7's
    kappa_t in l2norm(kappa_t), a sigmoid(d_t) are bounded whatever the input), but not all of
    them are keys: an input a condition bounds (a decay's g_t, which may also scale the rank-1
    term, as Comba's -beta_t exp(g_t) p_t does) is drawn by that condition instead, and a gate
    on the key is drawn in the unit interval: a scalar factor (Comba's beta_t, whose norm is its
    magnitude: a unit ball over the heads would be no bound on it), or a vector read on one
    side of a rank-1 term a b^T only (GDN-2's erase gate b_t in a = -(b_t * k_t)), where the
    key is read on both."""
    conditions: list[Condition] = []
    found: dict[str, str] = {}
    gates: set[str] = set()
    for s in plan.states:
        for tr in s.transition.acting:  # each step a token applies
            conditions += tr.transition_class.conditions(s.name, tr)
            key = tr.transition_class.unit_key(s.name, tr)
            if key is None:
                continue
            free = _unbounded_reads(key.expr, names.inputs)
            found.update(dict.fromkeys(free, key.why))
            if key.sides is not None:
                a, b = (set(_unbounded_reads(x, names.inputs)) for x in key.sides)
                gates |= a ^ b
    bounded = {n for c in conditions for n in _free(c.expr, names.inputs, names.params)}
    gates |= {d.name for d in plan.mixer.inputs if not d.shape}
    unit_keys = {n: why for n, why in found.items() if n not in bounded | gates}
    unit_gates = {n: why for n, why in found.items() if n in gates - bounded}
    return conditions, unit_keys, unit_gates


def _unbounded_reads(e: Expr, inputs: set[str]) -> list[str]:
    """The inputs `e` reads somewhere outside every call that interval arithmetic bounds for
    any value of what it reads (sigmoid, l2norm, tanh, ...), in order."""
    out: list[str] = []
    stack = [e]
    while stack:
        node = stack.pop()
        if isinstance(node, Call) and all(math.isfinite(x) for x in bounds(node)):
            continue
        if isinstance(node, Timed) and node.name in inputs and node.name not in out:
            out.append(node.name)
        stack.extend(reversed(children(node)))
    return out


def _write_keys(plan: Plan, inputs: set[str]) -> dict[str, str]:
    """Inputs that are the key of a write (or its l2norm): their norm is what the key's is."""
    keys: dict[str, str] = {}
    for s in plan.states:
        for w in s.writes:
            inner = w.key.args[0] if isinstance(w.key, Call) and w.key.func == "l2norm" else w.key
            if isinstance(inner, Timed) and inner.name in inputs:
                keys.setdefault(inner.name, f"key {w.key} of {s.name}")
    return keys


def _positive_states(plan: Plan) -> dict[str, str]:
    """States read in the denominator of a ratio output, or inside a log: they start
    positive."""
    out: dict[str, str] = {}
    for o in plan.outputs:
        if o.form == "ratio" and isinstance(o.expr, Binary):
            for n in walk(o.expr.right):
                if isinstance(n, Name) and n.name.startswith("_r"):
                    r = o.readouts[int(n.name[2:])]
                    out[r.state] = f"read in the denominator of {o.name}"
    states = {s.name for s in plan.mixer.states}
    for eq in plan.mixer.equations:  # a state whose entries a log reads (a preconditioner)
        for n in walk(inline(plan.mixer, eq.value)):
            if isinstance(n, Call) and n.func == "log":
                for m in walk(n.args[0]):
                    if isinstance(m, Timed) and m.name in states:
                        out.setdefault(m.name, f"read inside the log of {eq.target}")
    return out


def _holds(conditions: list[Condition], env: dict, defaults: dict[str, Expr]) -> bool:
    """Whether interval arithmetic proves every condition for the intervals in `env`."""
    for c in conditions:
        lo, hi = bounds(c.expr, env, defaults)
        if not (c.lo <= lo and hi <= c.hi):
            return False
    return True


def _domains(
    conditions: list[Condition], unit_keys: dict[str, tuple[float, float]], names: _Names
) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """(domain of every variable of a condition, why, notes): the most general assignment of
    domains (fewest restricted variables) for which interval arithmetic proves every condition;
    all real, with a note, when none does. unit_keys: the inputs already drawn with a bound
    (-1 to 1: a key of norm <= 1; 0 to 1: a scalar in the unit interval)."""
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
    unit_keys: dict[str, tuple[float, float]],
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
        env.update({n: unit_keys[n] for n in unit_keys})
        if _holds(conditions, env, defaults):
            return {n: options[i] for n, i in zip(variables, combo, strict=True)}
    return None


def _wide_sizes(plan: Plan) -> frozenset[str]:
    """Size symbols an l2norm runs over: drawn >= 2 (the l2norm of one entry is its sign, so
    its gradient is all cancellation)."""
    exprs = [
        e
        for s in plan.states
        for tr in s.transition.acting
        for e in (*tr.args.exprs(), *(w.key for w in s.writes))
    ]
    exprs += [r.query for o in plan.outputs for r in o.readouts]
    decls = {d.name: d for d in plan.mixer.inputs}
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


def _halved_sizes(plan: Plan) -> tuple[tuple[str, str], ...]:
    """(d, p) for each rotation of a vector [d] by [p] angles, two size symbols: p must be at
    most d / 2 (the leading 2p entries turn; Mamba-3's rope_fraction), so the sizes are drawn
    so."""
    found = []
    for eq in plan.mixer.equations:
        for n in walk(inline(plan.mixer, eq.value)):
            if isinstance(n, Call) and n.func in ROTATIONS:
                d, p = (plan.expander.shape(a)[0] for a in n.args)
                if d != p and not d.isdigit() and not p.isdigit() and (d, p) not in found:
                    found.append((d, p))
    return tuple(found)


def input_ranges(spec: Spec | str | os.PathLike, plan: Plan | None = None) -> InputRanges:
    """Derive how to draw every argument of `spec` from its analysis plan (see the module doc)."""
    spec = spec if isinstance(spec, Spec) else load_spec(spec)
    plan = plan or analyze(spec)
    mixer = spec.mixer
    names = _Names.of(mixer)
    conditions, unit_keys, unit_gates = _transition_bounds(plan, names)
    drawn = {n: (-1.0, 1.0) for n in unit_keys} | {n: _DOMAINS[_UNIT] for n in unit_gates}
    domains, why, notes = _domains(conditions, drawn, names)
    keys = _write_keys(plan, names.inputs)
    positive = _positive_states(plan)

    ranges: list[Range] = []
    for d in mixer.inputs:
        if d.name in unit_keys:
            ranges.append(Range(d.name, "input", "unit ball", unit_keys[d.name]))
        elif d.name in unit_gates:
            ranges.append(Range(d.name, "input", _UNIT, unit_gates[d.name]))
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
    lagged = mixer.carried[len(mixer.states) : len(mixer.states) + len(mixer.lagged)]
    for d, last in zip(mixer.lagged, lagged, strict=True):
        drawn = next(x for x in ranges if x.name == d.name)
        ranges.append(Range(last.name, "state", drawn.domain, f"a token of {d.name}: {drawn.why}"))
    if mixer.positioned:
        ranges.append(Range(POSITION, "state", "position", "the position of the first token"))
    return InputRanges(
        spec, plan, tuple(ranges), tuple(notes), _wide_sizes(plan), _halved_sizes(plan)
    )


def decays_near_one(r: InputRanges) -> dict[str, str]:
    """The stress mode of every input and parameter of a decay that keeps the decay nearest 1
    (each log-gate nearest 0, each elementwise gate nearest 1), as in a trained model over a
    long sequence: decay factors multiplied over a chunk stay normal floats (subnormals would
    time a CPU's slow path, not the algorithm). Other arguments keep their plain mode."""
    names = _Names.of(r.mixer)
    drawn = {x.name: x for x in r.ranges if x.domain in _DOMAINS}
    modes: dict[str, str] = {}
    for s in r.plan.states:
        for c in s.transition.transition_class.decay_conditions(s.name, s.transition):
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
