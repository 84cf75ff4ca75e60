"""Property-based equivalence checks: does a compiled module compute the function its spec wrote?

`fuzz(spec)` (and `mixc fuzz SPEC`) draws random examples with hypothesis and, on each, compares
every form of a module (`chunk` at several chunk sizes, `parallel` where it exists, a loop of
`step` calls, and `recurrent`) against a float64 step-by-step interpreter of the spec itself
(`mixc.oracle.interpret`, which shares no code with the code generator). It compares outputs, final
states, and the gradients of every input, parameter and initial state. `fuzz(spec, module)`
checks a module mixc did not write (a hand-edited or third-party file with the compiled-module
contract, loaded by `load_module(path)`).

What is drawn (`examples`): batch 1-3, heads 1-4, T in 1..max_T with a bias towards 1, primes
and lengths that are not multiples of a chunk size, a distinct size for every size symbol (so
K != V and a transposed state cannot pass by accident), 1-3 power-of-two chunk sizes, with or
without initial states, inputs given with 1 head or a divisor of the heads (shared, as Mamba-2
shares B and C), parameter defaults overridden by explicit tensors (to get their gradients), a
torch seed, and a stress mode for every input whose range matters.

Input ranges (`plan`) are derived from the analysis facts, not from input names, so that every
drawn example is one the spec is meant to handle:

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
N(0, 1), initial states 0.5 N(0, 1). `plan(spec).describe()` lists what a spec gets.

Tolerance, as relative RMS error `||a - ref|| / ||ref||` against the oracle: float64 1e-10 for
every quantity; float32 1e-5 for outputs and final states, 1e-4 for gradients, raised to `FACTOR`
= 4 times the oracle's own change when every input is moved by one float32 rounding (the larger
of two random directions) on an ill-conditioned example, such as an output in which a readout and
a skip cancel; bfloat16 4 times the error of the reference loop in that precision, i.e. of the
oracle's own result rounded to bfloat16, for the same quantity (and never below the float32
bound). The oracle sees exactly the rounded inputs and cotangents the module sees, so the error
measures the computation, not the rounding of inputs. In bfloat16, parameters and states are
float32 holding rounded values (master weights, as in mixed-precision training). A reference
whose RMS is below `NEAR_ZERO` (1%) of the largest RMS of its kind (outputs and states, or
gradients) in the example counts as near zero and is measured against that floor. Each form is
also compared with `recurrent`, within twice the bound.

On a failure hypothesis shrinks the example (for at most `shrink_seconds`); `Report.failure`
gives the form, quantity, error and example, and `reproducer(...)` a short runnable script.
Torch runs on one thread while checking (tiny tensors; a thread pool on a busy machine is
orders of magnitude slower).
"""

from __future__ import annotations

import importlib.util
import itertools
import math
import os
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from mixc.analysis.plan import Plan as Facts
from mixc.analysis.plan import analyze
from mixc.errors import MixcError
from mixc.frontend.ir import Binary, Call, Expr, Identity, Name, Neg, Number, Timed, Transpose, walk
from mixc.frontend.spec import Spec, load_spec
from mixc.oracle.interpret import interpret

__all__ = [
    "FACTOR",
    "GATE_FORMS",
    "NEAR_ZERO",
    "SAMPLERS",
    "TOLERANCE",
    "Example",
    "Failure",
    "Invalid",
    "Plan",
    "Range",
    "Report",
    "Result",
    "check",
    "compare",
    "draws",
    "examples",
    "fuzz",
    "interval",
    "load_module",
    "make_case",
    "plan",
    "random_specs",
    "reference",
    "rel_error",
    "reproducer",
    "run_command",
]

#: Bounds on the relative RMS error: (outputs and final states, gradients).
TOLERANCE = {torch.float64: (1e-10, 1e-10), torch.float32: (1e-5, 1e-4)}
#: A form may be this many times worse than the oracle's own error in the precision under test:
#: bf16, its result rounded to bf16; fp32, its change when every input moves by one fp32 rounding
#: (an ill-conditioned example, such as an output that cancels, gets a bound above the fixed one).
FACTOR = 4.0
#: A reference whose RMS is below this fraction of the largest RMS among the example's references
#: of the same kind (outputs and states, or gradients) counts as near zero: its error is measured
#: against that floor (a gradient that cancels to zero still has fp32 rounding of its terms).
NEAR_ZERO = 1e-2
DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}
CHUNK_SIZES = (4, 16, 1, 2, 8, 32, 64)  # the first is what a shrunk example uses
SPECIAL_T = (1, 2, 3, 5, 7, 13, 17, 31, 37, 61, 64, 65, 97, 100, 127, 128, 129)


def rel_error(a: Tensor, ref: Tensor, floor: float = 0.0) -> float:
    """Relative RMS error ||a - ref|| / ||ref||, with a reference whose RMS is below `floor`
    measured against an RMS of `floor` instead (a near-zero reference, such as a gradient that
    vanishes analytically, is compared at the scale of its example; see `NEAR_ZERO`)."""
    a, ref = a.detach().double().cpu(), ref.detach().double().cpu()
    if a.shape != ref.shape or not torch.isfinite(a).all():
        return math.inf
    diff = (a - ref).norm().item()
    scale = max(ref.norm().item(), floor * max(ref.numel(), 1) ** 0.5)
    if scale == 0:
        return 0.0 if diff == 0 else math.inf
    return diff / scale


def _rms(x: Tensor) -> float:
    return x.double().norm().item() / max(x.numel(), 1) ** 0.5


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
class Plan:
    """What `fuzz` needs to know about a spec: its facts and how to draw each argument."""

    spec: Spec
    facts: Facts
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


def _mul(a: float, b: float) -> float:
    return 0.0 if a == 0 or b == 0 else a * b


def _mul_iv(x: tuple[float, float], y: tuple[float, float]) -> tuple[float, float]:
    ps = [_mul(a, b) for a in x for b in y]
    return min(ps), max(ps)


def _monotone(f: Callable[[float], float], iv: tuple[float, float]) -> tuple[float, float]:
    return f(iv[0]), f(iv[1])


def _safe(
    f: Callable[[float], float], at_minus_inf: float, at_inf: float
) -> Callable[[float], float]:
    def g(x: float) -> float:
        if x == -_INF:
            return at_minus_inf
        if x == _INF:
            return at_inf
        try:
            return f(x)
        except OverflowError:
            return at_inf if x > 0 else at_minus_inf

    return g


_INCREASING: dict[str, Callable[[float], float]] = {
    "exp": _safe(math.exp, 0.0, _INF),
    "sigmoid": _safe(lambda x: 1 / (1 + math.exp(-x)) if x > -700 else 0.0, 0.0, 1.0),
    "logsigmoid": _safe(lambda x: -math.log1p(math.exp(-x)) if x > -700 else x, -_INF, 0.0),
    "softplus": _safe(lambda x: math.log1p(math.exp(x)) if x < 700 else x, 0.0, _INF),
    "relu": lambda x: max(x, 0.0),
    "tanh": _safe(math.tanh, -1.0, 1.0),
    "elu": _safe(lambda x: x if x > 0 else math.expm1(x), -1.0, _INF),
    "sqrt": lambda x: math.sqrt(max(x, 0.0)),
    "log": lambda x: -_INF if x <= 0 else math.log(x),
}


def interval(
    e: Expr, env: dict[str, tuple[float, float]], defaults: dict[str, Expr]
) -> tuple[float, float]:
    """Interval of values `e` can take, elementwise, given intervals for names and per-token
    inputs (anything not in `env` is any real) and the default expressions of parameters
    (evaluated for a head index h >= 0). A matrix product is treated as a product of scalars,
    which is exact for the scalar and elementwise expressions gates are made of."""
    if isinstance(e, Number):
        v = float(e.text)
        return v, v
    if isinstance(e, Identity):
        return 0.0, 1.0
    if isinstance(e, Name):
        if e.name == "h":
            return 0.0, _INF
        if e.name in defaults:
            return interval(defaults[e.name], env, defaults)
        return env.get(e.name, (-_INF, _INF))
    if isinstance(e, Timed):
        return env.get(e.name, (-_INF, _INF))
    if isinstance(e, Neg):
        lo, hi = interval(e.operand, env, defaults)
        return -hi, -lo
    if isinstance(e, Transpose):
        return interval(e.operand, env, defaults)
    if isinstance(e, Call):
        if len(e.args) != 1:
            return -_INF, _INF
        iv = interval(e.args[0], env, defaults)
        if e.func == "diag":
            return min(iv[0], 0.0), max(iv[1], 0.0)
        if e.func == "l2norm":
            return (0.0 if iv[0] >= 0 else -1.0), (0.0 if iv[1] <= 0 else 1.0)
        if e.func == "silu":
            return (iv[0] * 0.5 if iv[0] >= 0 else -0.2785), (_INF if iv[1] > 0 else 0.0)
        if e.func in _INCREASING:
            if e.func in ("log", "sqrt") and iv[0] < 0:  # outside the domain: no bound
                return -_INF, _INF
            return _monotone(_INCREASING[e.func], iv)
        return -_INF, _INF
    if isinstance(e, Binary):
        x, y = interval(e.left, env, defaults), interval(e.right, env, defaults)
        if e.op == "+":
            return x[0] + y[0], x[1] + y[1]
        if e.op == "-":
            return x[0] - y[1], x[1] - y[0]
        if e.op in ("*", "@"):
            return _mul_iv(x, y)
        if e.op == ".":
            lo, hi = _mul_iv(x, y)
            return (0.0 if lo >= 0 else -_INF), (0.0 if hi <= 0 else _INF)
        if e.op == "/" and (y[0] > 0 or y[1] < 0):
            inv = tuple(sorted(0.0 if math.isinf(b) else 1 / b for b in y))
            if y[0] == 0 or y[1] == 0:
                return -_INF, _INF
            return _mul_iv(x, inv)
        if e.op == "^" and x[0] > 0:
            try:
                vals = [a**b for a in x for b in y if not (math.isinf(a) and b == 0)]
                return min(vals), max(vals)
            except (OverflowError, ValueError, ZeroDivisionError):
                return 0.0, _INF
    return -_INF, _INF


def _free(e: Expr, inputs: set[str], params: set[str]) -> list[str]:
    out = []
    for n in walk(e):
        name = n.name if isinstance(n, Timed) and n.name in inputs else None
        name = name or (n.name if isinstance(n, Name) and n.name in params else None)
        if name and name not in out:
            out.append(name)
    return out


def plan(spec: Spec | str | os.PathLike, facts: Facts | None = None) -> Plan:
    """Derive how to draw every argument of `spec` from its analysis facts (see the module doc)."""
    spec = spec if isinstance(spec, Spec) else load_spec(spec)
    facts = facts or analyze(spec)
    mixer = spec.mixer
    inputs = {d.name for d in mixer.inputs}
    free_params = {p.name for p in mixer.params if p.default is None}
    defaults = {p.name: p.default for p in mixer.params if p.default is not None}
    notes: list[str] = []

    # conditions on the transition: (expression, (lo, hi) it must stay in, what it is)
    conditions: list[tuple[Expr, float, float, str]] = []
    unit_keys: dict[str, str] = {}
    keys: dict[str, str] = {}
    positive_states: dict[str, str] = {}
    for s in facts.states:
        tr = s.transition
        for g in tr.gates:
            conditions.append((g.log, -_INF, 0.0, f"log-gate {g.log} of {s.name} must be <= 0"))
        if tr.beta is not None:
            conditions.append(
                (tr.beta, 0.0, 2.0, f"delta-rule beta {tr.beta} of {s.name} in [0, 2]")
            )
        if tr.gate is not None:
            conditions.append(
                (tr.gate, 0.0, 1.0, f"elementwise gate {tr.gate} of {s.name} in [0, 1]")
            )
        if tr.key is not None:
            key = tr.key.operand if isinstance(tr.key, Transpose) else tr.key
            if not (isinstance(key, Call) and key.func == "l2norm"):
                for n in _free(key, inputs, set()):
                    unit_keys[n] = f"delta-rule key {tr.key} of {s.name}: norm <= 1 keeps it stable"
        for w in s.writes:
            inner = w.key.args[0] if isinstance(w.key, Call) and w.key.func == "l2norm" else w.key
            if isinstance(inner, Timed) and inner.name in inputs:  # the key's norm is the input's
                keys.setdefault(inner.name, f"key {w.key} of {s.name}")
    for o in facts.outputs:
        if o.form == "ratio" and isinstance(o.expr, Binary):
            for n in walk(o.expr.right):
                if isinstance(n, Name) and n.name.startswith("_r"):
                    r = o.readouts[int(n.name[2:])]
                    positive_states[r.state] = f"read in the denominator of {o.name}"

    # the most general assignment of domains that proves every condition
    variables: list[str] = []
    for e, *_ in conditions:
        variables += [
            n for n in _free(e, inputs, free_params) if n not in variables and n not in unit_keys
        ]
    domains = {n: _REAL for n in variables}
    why: dict[str, str] = {}
    if conditions:
        found = None
        options = [_REAL, _POS, _NEG, _UNIT]
        combos = (
            itertools.product(range(len(options)), repeat=len(variables))
            if len(variables) <= 6
            else [(0,) * len(variables)]
        )
        for combo in sorted(combos, key=lambda c: (sum(i > 0 for i in c), c)):
            env = {n: _DOMAINS[options[i]] for n, i in zip(variables, combo, strict=True)}
            env.update({n: (-1.0, 1.0) for n in unit_keys})
            if all(
                lo <= interval(e, env, defaults)[0] and interval(e, env, defaults)[1] <= hi
                for e, lo, hi, _ in conditions
            ):
                found = {n: options[i] for n, i in zip(variables, combo, strict=True)}
                break
        if found is None:
            failing = "; ".join(c[3] for c in conditions)
            notes.append(
                f"no input ranges provably satisfy: {failing}; drawing those inputs from N(0, 1)"
            )
        else:
            domains = found
        for n in variables:
            why[n] = "; ".join(c[3] for c in conditions if n in _free(c[0], inputs, free_params))

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
        if p.default is not None:
            continue
        if p.name in domains:
            ranges.append(Range(p.name, "param", domains[p.name], why[p.name]))
        else:
            ranges.append(Range(p.name, "param", "plain", "no constraint"))
    for s in mixer.states:
        if s.name in positive_states:
            ranges.append(Range(s.name, "state", "positive state", positive_states[s.name]))
        else:
            ranges.append(Range(s.name, "state", "state", "no constraint"))
    # l2norm of a single entry is its sign: its gradient is all cancellation, so sizes >= 2
    exprs = [
        e
        for s in facts.states
        for e in (s.transition.key, s.transition.beta, *(w.key for w in s.writes))
    ]
    exprs += [r.query for o in facts.outputs for r in o.readouts]
    decls = {d.name: d for d in mixer.inputs}
    wide = {
        size
        for e in exprs
        if e is not None
        for n in walk(e)
        if isinstance(n, Call) and n.func == "l2norm"
        for m in walk(n)
        if isinstance(m, Timed) and m.name in decls
        for size in decls[m.name].shape
        if not size.isdigit()
    }
    return Plan(spec, facts, tuple(ranges), tuple(notes), frozenset(wide))


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
    p: Plan,
    *,
    max_T: int = 100,
    max_size: int = 12,
    max_batch: int = 3,
    max_heads: int = 4,
    chunked: bool = True,
):
    """A hypothesis strategy of `Example`s for plan `p` (see the module doc for what is drawn)."""
    from hypothesis import strategies as st

    symbols = p.symbols
    ts = [t for t in SPECIAL_T if t <= max_T]

    @st.composite
    def draw(draw_) -> Example:
        batch = draw_(st.integers(1, max_batch))
        heads = draw_(st.integers(1, max_heads))
        T = draw_(st.one_of(st.integers(1, max_T), st.sampled_from(ts)))
        n = len(symbols)
        values = draw_(
            st.lists(st.integers(1, max(max_size, n)), min_size=n, max_size=n, unique=True)
        )
        wide = [i for i, s in enumerate(symbols) if s in p.wide]
        if any(values[i] == 1 for i in wide):  # give the 1 to a symbol that may be 1, or shift all
            narrow = [i for i in range(n) if i not in wide]
            one = values.index(1)
            if narrow:
                values[one], values[narrow[0]] = values[narrow[0]], values[one]
            else:
                values = [x + 1 for x in values]
        chunk_sizes = (
            tuple(
                draw_(st.lists(st.sampled_from(CHUNK_SIZES), min_size=1, max_size=3, unique=True))
            )
            if chunked
            else ()
        )
        initial = draw_(st.booleans())
        divisors = [heads] + [d for d in range(1, heads) if heads % d == 0]
        input_heads = [(name, draw_(st.sampled_from(divisors))) for name in p.inputs]
        if input_heads and all(h < heads for _, h in input_heads):  # the inputs fix NH
            input_heads[0] = (input_heads[0][0], heads)
        modes = tuple(
            (r.name, draw_(st.sampled_from(r.modes))) for r in p.ranges if len(r.modes) > 1
        )
        override = bool(p.defaults) and draw_(st.booleans())
        seed = draw_(st.integers(0, 2**31 - 1))
        return Example(
            batch,
            heads,
            T,
            tuple(zip(symbols, values, strict=True)),
            chunk_sizes,
            initial,
            tuple(input_heads),
            modes,
            override,
            seed,
        )

    return draw()


# ----------------------------------------------------------------------------- one case


def _dims(shape: tuple[str, ...], sizes: dict[str, int]) -> list[int]:
    return [int(s) if s.isdigit() else sizes[s] for s in shape]


def _out_dims(shape: tuple[str, str]) -> list[str]:
    """The output's trailing dims in the module layout: a scalar has none, a row or column one."""
    return [d for d in shape if d != "1"] if "1" in shape else list(shape)


def _default_values(p: Plan, heads: int, sizes: dict[str, int]) -> dict[str, list]:
    """Parameter defaults as explicit values [NH, *shape], evaluated as the oracle does."""
    from mixc.oracle.interpret import _Evaluator

    ev = _Evaluator(p.mixer, {}, torch.device("cpu"))
    h = torch.arange(heads, dtype=torch.float64).reshape(1, heads, 1, 1)
    out = {}
    for prm in p.mixer.params:
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


def draws(p: Plan, ex: Example) -> list[Draw]:
    """Every tensor of the case, in generation order, as torch expressions over `gen` (seeded
    with `ex.seed`), B, T, NH and the size symbols. Shared by the fuzzer and its reproducers."""
    sizes = dict(ex.sizes)
    modes = dict(ex.modes)
    heads = dict(ex.input_heads)
    out: list[Draw] = []

    def code(r: Range, shape: list[str]) -> str:
        template = SAMPLERS[r.domain][modes.get(r.name, r.modes[0])]
        return template.format(shape=", ".join(shape), rows=", ".join([*shape[:-1], "1"]))

    for d in p.mixer.inputs:
        nh = "NH" if heads.get(d.name, ex.heads) == ex.heads else str(heads[d.name])
        out.append(Draw(d.name, "input", code(p.range(d.name), ["B", "T", nh, *d.shape])))
    for prm in p.mixer.params:
        if prm.default is None:
            out.append(Draw(prm.name, "param", code(p.range(prm.name), ["NH", *prm.shape])))
    if ex.override_defaults:
        for name, value in _default_values(p, ex.heads, sizes).items():
            out.append(Draw(name, "default", f"torch.tensor({value!r}, dtype=torch.float64)"))
    if ex.initial_state:
        for s in p.mixer.states:
            out.append(Draw(s.name, "state", code(p.range(s.name), ["B", "NH", *s.shape])))
    y_shape = _out_dims(p.spec.shapes[p.output])
    out.append(
        Draw(p.output, "cotangent", _RANDN.format(shape=", ".join(["B", "T", "NH", *y_shape])))
    )
    for s in p.mixer.states:
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


def make_case(p: Plan, ex: Example) -> Case:
    ns = _namespace(ex)
    case = Case({}, {}, {}, {}, torch.empty(0), {})
    for d in draws(p, ex):
        x = eval(d.code, ns)  # our own sampler templates (SAMPLERS): the reproducer prints them
        if d.kind == "input":
            case.inputs[d.name] = x
        elif d.kind == "param":
            case.params[d.name] = x
        elif d.kind == "default":
            case.defaults[d.name] = x
        elif d.kind == "state":
            case.states[d.name] = x
        elif d.name == p.output and d.kind == "cotangent" and case.cot_y.numel() == 0:
            case.cot_y = x
        else:
            case.cot_states[d.name] = x
    return case


# ----------------------------------------------------------------------------- the oracle


@dataclass
class Result:
    """Output, final states and gradients of one form (or of the oracle)."""

    y: Tensor
    finals: dict[str, Tensor]
    grads: dict[str, Tensor | None]


def reference(
    spec: Spec | str | os.PathLike,
    inputs: dict[str, Tensor],
    params: dict[str, Tensor] | None = None,
    initial_state: dict[str, Tensor] | None = None,
    cot_y: Tensor | None = None,
    cot_states: dict[str, Tensor] | None = None,
) -> Result:
    """The float64 oracle: output, final states, and the gradients of
    loss = sum(y * cot_y) + sum over states of sum(final * cot_state)
    with respect to every input, parameter and initial state given (by name)."""
    spec = spec if isinstance(spec, Spec) else load_spec(spec)
    params, initial_state, cot_states = params or {}, initial_state or {}, cot_states or {}
    leaves = {
        n: x.detach().double().cpu().requires_grad_(True)
        for n, x in {**inputs, **params, **initial_state}.items()
    }
    outputs, finals = interpret(
        spec,
        {n: leaves[n] for n in inputs},
        {n: leaves[n] for n in params},
        {n: leaves[n] for n in initial_state} or None,
    )
    y = outputs[spec.mixer.outputs[0].target]
    grads: dict[str, Tensor | None] = {}
    if cot_y is not None:
        loss = (y * cot_y.double().cpu()).sum()
        for n, c in cot_states.items():
            loss = loss + (finals[n] * c.double().cpu()).sum()
        got = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
        grads = {
            n: g if g is not None else torch.zeros_like(leaves[n])
            for n, g in zip(leaves, got, strict=True)
        }
    return Result(y.detach(), {n: f.detach() for n, f in finals.items()}, grads)


# ----------------------------------------------------------------------------- forms


def _forms(p: Plan, module: types.ModuleType, ex: Example) -> list[tuple[str, int | None]]:
    forms: list[tuple[str, int | None]] = [("recurrent", None), ("step", None)]
    if p.facts.chunkable and callable(getattr(module, "chunk", None)):
        forms += [("chunk", cs) for cs in ex.chunk_sizes]
    if callable(getattr(module, "parallel", None)) and not ex.initial_state:
        forms.append(("parallel", None))
    return forms


def _label(form: str, chunk_size: int | None) -> str:
    return f"chunk (chunk_size={chunk_size})" if chunk_size else form


def _call(module, form: str, chunk_size: int | None, args: list, kwargs: dict, n_inputs: int, init):
    """Run one form; returns (y, final states as a tuple, or None for parallel)."""
    if form == "recurrent":
        return module.recurrent(*args, **kwargs, initial_state=init, output_final_state=True)
    if form == "chunk":
        return module.chunk(
            *args, **kwargs, initial_state=init, output_final_state=True, chunk_size=chunk_size
        )
    if form == "parallel":
        return module.parallel(*args, **kwargs)
    ys, state = [], init
    for t in range(args[0].shape[1]):
        step_args = [a[:, t] if i < n_inputs else a for i, a in enumerate(args)]
        y, state = module.step(*step_args, **kwargs, state=state)
        ys.append(y)
    return torch.stack(ys, 1), state


def _finals(final, names: tuple[str, ...]) -> dict[str, Tensor] | None:
    if final is None:
        return None
    finals = final if isinstance(final, tuple | list) else (final,)
    if len(finals) != len(names):
        return None
    return dict(zip(names, finals, strict=True))


@dataclass(frozen=True)
class Failure:
    """A disagreement (or a crash) of one form on one example."""

    form: str
    chunk_size: int | None
    quantity: str  # "output", "final state H", "gradient of g", "call"
    error: float
    bound: float
    vs_recurrent: float | None
    message: str
    example: Example
    dtype: torch.dtype

    @property
    def label(self) -> str:
        return _label(self.form, self.chunk_size)

    def summary(self) -> str:
        if self.quantity == "call":
            return f"{self.label} raised {self.message}"
        tail = f"; vs recurrent {self.vs_recurrent:.2e}" if self.vs_recurrent is not None else ""
        return (
            f"{self.label}: {self.quantity} has relative RMS error {self.error:.2e} vs the float64 "
            f"oracle (bound {self.bound:.1e}{tail}){': ' + self.message if self.message else ''}"
        )


class _Mismatch(Exception):  # noqa: N818 - internal signal to hypothesis, carries the Failure
    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.summary())
        self.failure = failure


def _quantities(r: Result) -> dict[str, Tensor]:
    out = {"output": r.y, **{f"final state {n}": x for n, x in r.finals.items()}}
    out.update({f"gradient of {n}": g for n, g in r.grads.items() if g is not None})
    return out


def _limits(
    dtype: torch.dtype, ref: dict[str, Tensor], perturbed: dict[str, Tensor] | None = None
) -> dict[str, tuple[float, float]]:
    """(near-zero floor, bound) of every quantity: the floor is NEAR_ZERO times the largest RMS
    among references of the same kind; the bound is fixed for fp32/fp64, or FACTOR times the
    oracle's change under a one-rounding perturbation of its inputs (`perturbed`) when larger; for
    bf16 it is FACTOR times the error of the oracle's own result rounded to bf16 (at least the
    fp32 bound)."""
    scale = {False: 0.0, True: 0.0}
    for q, r in ref.items():
        kind = q.startswith("gradient")
        scale[kind] = max(scale[kind], _rms(r))
    out = {}
    for q, r in ref.items():
        kind = q.startswith("gradient")
        floor = NEAR_ZERO * scale[kind]
        if dtype in TOLERANCE:
            bound = TOLERANCE[dtype][kind]
            if perturbed is not None and q in perturbed:
                bound = max(bound, FACTOR * rel_error(perturbed[q], r, floor))
        else:
            bound = max(FACTOR * rel_error(r.to(dtype), r, floor), TOLERANCE[torch.float32][kind])
        out[q] = (floor, bound)
    return out


def compare(got: Result, ref: Result, dtype: torch.dtype) -> dict[str, tuple[float, float]]:
    """(relative error, bound) of every quantity of `ref` (output, final states, gradients) in
    `got`, by the fuzzer's rule (see the module doc). A missing quantity has error inf."""
    target = _quantities(ref)
    mine = _quantities(got)
    out = {}
    for q, (floor, bound) in _limits(dtype, target).items():
        a = mine.get(q)
        if a is None and q.startswith("gradient") and q.removeprefix("gradient of ") in got.grads:
            a = torch.zeros_like(target[q])  # autograd's None: no dependence
        out[q] = (math.inf if a is None else rel_error(a, target[q], floor), bound)
    return out


def check(
    p: Plan,
    module: types.ModuleType,
    ex: Example,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> tuple[dict[str, tuple[float, float]], Failure | None]:
    """Run every form of `module` on example `ex` and compare with the oracle.

    Returns (worst (forward, gradient) error per form, the first Failure or None).
    Raises `Invalid` when the oracle itself is not finite on this example. Runs torch on one CPU
    thread (restored afterwards): the tensors are tiny, and a thread pool on a busy machine
    makes each call orders of magnitude slower.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _check(p, module, ex, dtype, device)
    finally:
        torch.set_num_threads(threads)


def _check(p: Plan, module: types.ModuleType, ex: Example, dtype: torch.dtype, device) -> tuple:
    case = make_case(p, ex)
    state_dtype = torch.float64 if dtype == torch.float64 else torch.float32

    def low(x: Tensor, dt: torch.dtype) -> Tensor:
        return x.to(dt).double()

    inputs = {n: low(x, dtype) for n, x in case.inputs.items()}
    # low precision: parameters hold rounded values in fp32 (master weights, as in mixed-precision
    # training; a bf16 parameter used by T step calls would accumulate its gradient in bf16)
    params = {n: low(x, dtype) for n, x in {**case.params, **case.defaults}.items()}
    states = {n: low(x, state_dtype) for n, x in case.states.items()}
    cot_y = low(case.cot_y, dtype)
    cot_s = {n: low(x, dtype) for n, x in case.cot_states.items()}

    def targets(states: dict, cot_s: dict) -> tuple[dict[str, Tensor], dict]:
        """The oracle's quantities and their (floor, bound)s; in fp32 the oracle also runs with
        every input moved by one rounding, to measure how well-conditioned the example is."""
        ref = _quantities(reference(p.spec, inputs, params, states, cot_y, cot_s))
        if not all(torch.isfinite(v).all() for v in ref.values()):
            raise Invalid("the oracle is not finite on this example")
        if dtype != torch.float32:
            return ref, _limits(dtype, ref)
        gen = torch.Generator().manual_seed(ex.seed + 1)
        eps = torch.finfo(dtype).eps / 2

        def nudge(xs: dict[str, Tensor]) -> dict[str, Tensor]:
            return {n: x * (1 + eps * torch.randn(x.shape, generator=gen)) for n, x in xs.items()}

        bounds = []
        for _ in range(2):  # two random directions: one can happen to miss a cancellation
            moved = [nudge(xs) for xs in (inputs, params, states, {"y": cot_y}, cot_s)]
            perturbed = _quantities(reference(p.spec, *moved[:3], moved[3]["y"], moved[4]))
            bounds.append(_limits(dtype, ref, perturbed))
        return ref, {q: max(b[q] for b in bounds) for q in ref}

    ref, limits = targets(states, cot_s)
    ref_y_only = None  # parallel: from a zero state, loss on the output only

    worst: dict[str, tuple[float, float]] = {}
    recurrent: dict[str, Tensor] | None = None
    for form, cs in _forms(p, module, ex):
        leaves = {n: x.to(dtype).to(device).requires_grad_(True) for n, x in inputs.items()}
        leaves.update(
            {n: x.to(state_dtype).to(device).requires_grad_(True) for n, x in params.items()}
        )
        leaves.update(
            {n: x.to(state_dtype).to(device).requires_grad_(True) for n, x in states.items()}
        )
        args = [leaves[n] for n in (*p.inputs, *p.params)]
        kwargs = {n: leaves[n] for n in p.defaults if n in leaves}
        init = tuple(leaves[n] for n in p.states) if states else None
        if init is not None and len(init) == 1:
            init = init[0]
        try:
            y, final = _call(module, form, cs, args, kwargs, len(p.inputs), init)
            finals = _finals(final, p.states) if form != "parallel" else {}
            if finals is None:
                raise MixcError(
                    f"returned {type(final).__name__} as the final state, expected {len(p.states)} tensor(s)"
                )
            loss = (y.double().cpu() * cot_y).sum()
            for n, s in finals.items():
                loss = loss + (s.double().cpu() * cot_s[n]).sum()
            got = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
        except Exception as exc:  # a broken module may raise anything: that is a failure too
            msg = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            return worst, Failure(form, cs, "call", math.inf, 0.0, None, msg, ex, dtype)
        result = _quantities(
            Result(
                y.detach(),
                {n: s.detach() for n, s in finals.items()},
                {
                    n: (g if g is not None else torch.zeros_like(leaves[n]))
                    for n, g in zip(leaves, got, strict=True)
                },
            )
        )
        target, target_limits = ref, limits
        if form == "parallel":
            if ref_y_only is None:
                zero, zero_limits = targets({}, {})
                ref_y_only = {q: r for q, r in zero.items() if not q.startswith("final state")}
                parallel_limits = {q: zero_limits[q] for q in ref_y_only}
            target, target_limits = ref_y_only, parallel_limits
        fwd, grad = worst.get(form, (0.0, 0.0))
        for q, r in target.items():
            floor, bound = target_limits[q]
            a = result.get(q)
            if a is None:
                return worst, Failure(form, cs, q, math.inf, bound, None, "missing", ex, dtype)
            err = rel_error(a, r, floor)
            vs_rec = None
            if recurrent is not None and (q == "output" or form != "parallel"):
                vs_rec = rel_error(a, recurrent[q], floor)
            shape = "" if a.shape == r.shape else f"shape {list(a.shape)}, expected {list(r.shape)}"
            if err > bound or (vs_rec is not None and vs_rec > 2 * bound):
                return worst, Failure(form, cs, q, err, bound, vs_rec, shape, ex, dtype)
            if q.startswith("gradient"):
                grad = max(grad, err)
            else:
                fwd = max(fwd, err)
        worst[form] = (fwd, grad)
        if form == "recurrent":
            recurrent = result
    return worst, None


class Invalid(Exception):  # noqa: N818 - the example is outside what the spec can handle
    """The oracle itself overflowed on an example: the example is discarded."""


# ----------------------------------------------------------------------------- modules


def load_module(path: str | os.PathLike) -> types.ModuleType:
    """Import a module file by path (a compiled module, or any file with the same contract)."""
    path = Path(path)
    if not path.is_file():
        raise MixcError(f"{path}: no such module file")
    name = f"mixc_fuzz_target_{abs(hash(str(path.resolve()))) & 0xFFFFFFFF:08x}"
    loader_spec = importlib.util.spec_from_file_location(name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise MixcError(f"{path}: not a Python module")
    module = importlib.util.module_from_spec(loader_spec)
    try:
        loader_spec.loader.exec_module(module)
    except Exception as exc:  # any error importing user code
        where = f" (line {exc.lineno})" if isinstance(exc, SyntaxError) else ""
        raise MixcError(f"{path}: cannot import{where}: {type(exc).__name__}: {exc}") from None
    return module


def _check_contract(p: Plan, module: types.ModuleType, where: str) -> None:
    """The module must declare the spec's inputs, parameters and states, and define the forms."""
    missing = [n for n in ("INPUTS", "STATES", "recurrent", "step") if not hasattr(module, n)]
    if missing:
        raise MixcError(f"{where}: not a mixc module: it defines no {', '.join(missing)}")

    def names(attr: str) -> tuple[str, ...]:
        try:
            return tuple(entry[0] for entry in getattr(module, attr, ()))
        except (TypeError, IndexError):
            raise MixcError(f"{where}: {attr} should be ((name, shape), ...)") from None

    for attr, want, what in (
        ("INPUTS", p.inputs, "inputs"),
        ("PARAMS", p.params, "parameters without a default"),
        ("PARAM_DEFAULTS", p.defaults, "parameters with a default"),
        ("STATES", p.states, "states"),
    ):
        got = names(attr)
        if got != want:
            raise MixcError(
                f"{where} does not match the spec: its {attr} are ({', '.join(got)}) but the spec's "
                f"{what} are ({', '.join(want)})"
            )


# ----------------------------------------------------------------------------- fuzz


@dataclass
class Report:
    """The outcome of `fuzz`: examples run, worst error per form, and the failure if any."""

    name: str
    examples: int
    dtype: torch.dtype
    worst: dict[str, tuple[float, float]] = field(default_factory=dict)
    failure: Failure | None = None
    shrink_steps: int = 0
    discarded: int = 0
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.failure is None

    def summary(self) -> str:
        """One line: examples run and the worst (forward / gradient) error of each form."""
        dtype = str(self.dtype).removeprefix("torch.")
        forms = ", ".join(f"{f} {a:.1e}/{b:.1e}" for f, (a, b) in self.worst.items())
        return (
            f"{self.name}: {self.examples} examples passed ({dtype}); worst relative error vs the "
            f"float64 oracle (outputs and states / gradients): {forms}"
        )


def fuzz(
    spec: Spec | str | os.PathLike,
    module: types.ModuleType | str | os.PathLike | None = None,
    *,
    examples: int = 25,
    seed: int = 0,
    dtype: str | torch.dtype = "float32",
    device: str = "cpu",
    max_T: int = 100,
    max_size: int = 12,
    shrink: bool = True,
    shrink_seconds: float = 60.0,
    progress: Callable[[int, int, str], None] | None = None,
) -> Report:
    """Fuzz `module` (default: the spec compiled in-process; a path loads a module file) against
    the float64 oracle of `spec` on `examples` drawn examples, deterministically for a `seed`.
    `progress(done, total, phase)` is called after every example."""
    from hypothesis import HealthCheck, Phase, Verbosity, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis.errors import Flaky, Unsatisfiable

    spec = spec if isinstance(spec, Spec) else load_spec(spec)
    dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    if dtype not in (torch.float64, torch.float32, torch.bfloat16):
        raise MixcError(f"dtype {dtype}: expected float64, float32 or bfloat16")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise MixcError("--device cuda: CUDA is not available on this machine")
    if examples < 1:
        raise MixcError(f"examples: expected at least 1, got {examples}")
    if module is None:
        from mixc.driver import load

        module, where = load(spec.source), "the compiled module"
    elif isinstance(module, types.ModuleType):
        where = getattr(module, "__file__", None) or module.__name__
    else:
        module, where = load_module(module), str(module)
    p = plan(spec)
    _check_contract(p, module, where)

    report = Report(spec.mixer.name, 0, dtype, notes=p.notes)
    state: dict = {"failure": None, "since": None}

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=False,
        phases=[Phase.generate, Phase.shrink] if shrink else [Phase.generate],
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
        verbosity=Verbosity.quiet,
        print_blob=False,
    )
    @hypothesis_seed(seed)
    @given(_examples_for(p, max_T, max_size))
    def run(ex: Example) -> None:
        from hypothesis import reject

        best: Failure | None = state["failure"]
        if best is not None:
            report.shrink_steps += 1
            timed_out = time.monotonic() - state["since"] > shrink_seconds
            if timed_out and ex != best.example:  # shrinking budget spent: keep the best so far
                reject()
        try:
            worst, failure = check(p, module, ex, dtype=dtype, device=device)
        except Invalid:
            report.discarded += 1
            reject()
        if failure is None and best is None:
            report.examples += 1
            for form, (a, b) in worst.items():
                old = report.worst.get(form, (0.0, 0.0))
                report.worst[form] = (max(old[0], a), max(old[1], b))
        if progress is not None:
            phase = "shrinking" if best is not None or failure is not None else "generating"
            progress(report.examples, examples, phase)
        if failure is not None:
            if best is None:
                state["since"] = time.monotonic()
            state["failure"] = failure
            raise _Mismatch(failure)

    try:
        run()
    except _Mismatch as exc:
        report.failure = exc.failure
    except Flaky:  # the module is not deterministic: report the smallest failure seen
        if state["failure"] is None:
            raise
        report.failure = state["failure"]
        report.notes += (
            "the failure did not reproduce on replay: the module is not deterministic",
        )
    except Unsatisfiable:
        raise MixcError(
            f"{spec.mixer.name}: the oracle overflowed on every drawn example; the derived input "
            "ranges do not keep this spec finite:\n" + p.describe()
        ) from None
    return report


def _examples_for(p: Plan, max_T: int, max_size: int):
    return examples(p, max_T=max_T, max_size=max_size, chunked=p.facts.chunkable)


# ----------------------------------------------------------------------------- reproducer


def reproducer(p: Plan, failure: Failure, spec_path: str | None, module_path: str | None) -> str:
    """A short script that rebuilds the failing example's tensors from its seed with torch,
    calls the failing form of the module, compares it with the float64 oracle, and exits 1 when
    a quantity is out of bounds."""
    ex, dtype = failure.example, str(failure.dtype).removeprefix("torch.")
    wide = "float64" if dtype == "float64" else "float32"  # parameters and states
    spec_arg = repr(spec_path) if spec_path else repr(p.spec.source.text)
    load = f"load_module({module_path!r})" if module_path else f"mixc.load({spec_arg})"
    lines = [
        f"# mixc fuzz reproducer: {failure.summary()}",
        "import torch",
        "import torch.nn.functional as F",
        "",
        *(["import mixc"] if not module_path else []),
        "from mixc.check.fuzz import Result, compare, load_module, reference",
        "",
        f"spec = {spec_arg}",
        f"module = {load}",
        f"gen = torch.Generator().manual_seed({ex.seed})",
        f"B, T, NH = {ex.batch}, {ex.T}, {ex.heads}",
    ]
    if ex.sizes:
        lines.append(
            f"{', '.join(k for k, _ in ex.sizes)} = {', '.join(str(v) for _, v in ex.sizes)}"
        )
    kinds: dict[str, list[str]] = {
        "input": [],
        "param": [],
        "default": [],
        "state": [],
        "cotangent": [],
    }
    for d in draws(p, ex):
        var = (
            f"{d.name}0"
            if d.kind == "state"
            else f"cot_{d.name}"
            if d.kind == "cotangent"
            else d.name
        )
        lines.append(f"{var} = {d.code}")
        kinds[d.kind].append(d.name)
    params = kinds["param"] + kinds["default"]

    def pick(names: list[str]) -> str:
        return "{" + ", ".join(f"{n!r}: d[{n!r}]" for n in names) + "}"

    def cast(names: list[str], to: str, suffix: str = "") -> list[str]:
        return [f"{n!r}: {n}{suffix}.to(torch.{to})" for n in names]

    entries = cast(kinds["input"], dtype) + cast(params, wide) + cast(kinds["state"], wide, "0")
    args = ", ".join(f"x[{n!r}]" for n in (*p.inputs, *p.params))
    kwargs = "".join(f", {n}=x[{n!r}]" for n in kinds["default"])
    init = "None"
    if kinds["state"]:
        init = (
            f"x[{p.states[0]!r}]"
            if len(p.states) == 1
            else "(" + ", ".join(f"x[{n!r}]" for n in p.states) + ")"
        )
    lines += [
        "",
        f"# inputs rounded to {dtype}, parameters and states to {wide}: the oracle sees the same values",
        "x = {" + ", ".join(entries) + "}",
        "x = {n: t.requires_grad_(True) for n, t in x.items()}",
    ]
    if failure.form == "step":
        step_args = ", ".join(
            [f"x[{n!r}][:, t]" for n in p.inputs] + [f"x[{n!r}]" for n in p.params]
        )
        lines += [
            f"ys, state = [], {init}",
            "for t in range(T):",
            f"    y_t, state = module.step({step_args}{kwargs}, state=state)",
            "    ys.append(y_t)",
            "y, final = torch.stack(ys, 1), state",
        ]
    elif failure.form == "parallel":
        lines.append(f"y, final = module.parallel({args}{kwargs})")
    else:
        cs = f", chunk_size={failure.chunk_size}" if failure.form == "chunk" else ""
        lines.append(
            f"y, final = module.{failure.form}({args}{kwargs}, initial_state={init}, output_final_state=True{cs})"
        )
    cots = (
        "{}"
        if failure.form == "parallel"
        else "{" + ", ".join(f"{n!r}: cot_{n}.to(torch.{dtype}).double()" for n in p.states) + "}"
    )
    lines += [
        f"final = dict(zip({p.states!r}, final if isinstance(final, tuple) else (final,))) if final is not None else {{}}",
        f"cot_y, cots = cot_{p.output}.to(torch.{dtype}).double(), {cots}",
        "loss = (y.double() * cot_y).sum() + sum((final[n].double() * c).sum() for n, c in cots.items())",
        "grads = dict(zip(x, torch.autograd.grad(loss, list(x.values()), allow_unused=True)))",
        "",
        "d = {n: t.detach().double() for n, t in x.items()}",
        f"ref = reference(spec, {pick(kinds['input'])}, {pick(params)}, "
        f"{pick(kinds['state'] if failure.form != 'parallel' else [])}, cot_y, cots)",
        *(
            ["ref.finals.clear()  # the quadratic form keeps no state"]
            if failure.form == "parallel"
            else []
        ),
        "got = Result(y.detach(), {n: s.detach() for n, s in final.items()}, grads)",
        f"errors = compare(got, ref, torch.{dtype})",
        "for what, (err, bound) in errors.items():",
        "    print(f\"{what}: relative error {err:.2e} (bound {bound:.1e}){'  FAILS' if err > bound else ''}\")",
        "raise SystemExit(any(err > bound for err, bound in errors.values()))",
    ]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- random specs

#: The scalar-decay forms (a constant, a number, parameters, per-token inputs).
_SCALAR_FORMS = (
    "constant",
    "number",
    "param",
    "param sigmoid",
    "param raw",
    "sigmoid",
    "softplus",
    "mamba",
    "mamba raw",
    "log input",
)
#: The transition forms `random_specs` draws, one per class and parametrisation.
GATE_FORMS = ("none", *_SCALAR_FORMS, "diag key", "diag value", "outer", "delta", "gated delta")
#: Size names the runtime uses for its own layout dims (see the report of issue 5): not drawn.
_LAYOUT_DIMS = frozenset({"B", "T", "NH"})
_KEYWORDS = frozenset({"mixer", "in", "param", "state", "let"})


def _valid_name(name: str) -> bool:
    from mixc.frontend.verify import RESERVED

    return name not in RESERVED and name not in _KEYWORDS and name not in _LAYOUT_DIMS


def random_specs(forms: tuple[str, ...] = GATE_FORMS):
    """A hypothesis strategy of random valid spec texts across every supported class.

    Draws a transition form (`GATE_FORMS`: none, a constant per-head parameter with a default, a
    number, a parameter without default (exp(-exp(lam)), exp(-softplus(lam)), sigmoid(lam), or
    raw in (0, 1)),
    sigmoid(a_t), exp(-softplus(g_t)), exp(-softplus(dt_t) exp(A_log)), exp(dt_t A), exp(g_t),
    diagonal key-side, value-side, outer-product, delta with l2norm(k) or a plain unit key, gated
    delta), a write scale (scalar input, parameter, number), a feature map (elu + 1, relu, silu,
    via `let`), a normaliser state z read as a ratio (with elu + 1 only, so the denominator is
    positive), a skip term D v_t, random names for sizes, inputs, parameters and states, and
    equivalent spellings (G H vs H G vs G ⊙ H, ^T vs ᵀ, distributed delta, per-token values).
    Every spec is stable for the input ranges `plan` derives (decays in (0, 1], beta in [0, 2],
    keys of norm <= 1), which the tests check by fuzzing each one.
    """
    from hypothesis import strategies as st

    unknown = set(forms) - set(GATE_FORMS)
    if unknown or not forms:
        raise MixcError(
            f"forms: expected some of {', '.join(GATE_FORMS)}, got {', '.join(sorted(unknown)) or 'none'}"
        )
    return st.composite(_draw_spec)(tuple(forms))


def _draw_spec(draw, forms: tuple[str, ...]) -> str:
    from hypothesis import strategies as st

    taken: set[str] = set()

    def fresh(pool: tuple[str, ...], upper: bool = False) -> str:
        letters = "ACDEFGJKLMNOPQRSUVWXYZ" if upper else "abcdefgjklmnopqrsuvwxyz"
        made = st.builds(
            str.__add__,
            st.sampled_from(letters),
            st.text("abcdefgjkmnopqrsuvwxyz0123456789", max_size=3),
        )
        base = draw(st.one_of(st.sampled_from(pool), made))
        name, i = base, 1
        while name in taken or not _valid_name(name):
            name, i = f"{base}{i}", i + 1
        taken.add(name)
        return name

    def pick(*options):
        return draw(st.sampled_from(options))

    T = pick("^T", "^T", "ᵀ")
    had = pick("⊙", "*")
    minus = pick("-", "-", "−")
    dot = pick(".", "·")

    mixer = fresh(("mix", "mixer1", "variant", "my_mixer", "m"))
    K, V = fresh(("K", "N", "Dk", "E"), upper=True), fresh(("V", "P", "Dv", "M"), upper=True)
    S = fresh(("H", "S", "W", "C", "Mem"), upper=True)
    q, k, v = fresh(("q", "c", "query")), fresh(("k", "key", "b")), fresh(("v", "x", "val"))
    inputs = [f"{q}[{K}]", f"{k}[{K}]", f"{v}[{V}]"]
    params: list[str] = []
    lets: list[str] = []
    values: list[str] = []  # per-token value equations

    form = pick(*forms)
    delta = form in ("delta", "gated delta")

    def scalar_gate(kind: str) -> tuple[str, bool]:
        """(text, atomic) of a scalar decay in (0, 1] for the derived input ranges."""
        if kind == "constant":
            g = fresh(("gamma", "lam", "decay"))
            default = pick(
                "1 - 2^(-5 - h)", "1 - 2^(-3 - h)", "0.9", "exp(-0.1 (h + 1))", "sigmoid(3 - h)"
            )
            params.append(f"{g} = {default}")
            return g, True
        if kind == "number":
            return pick("0.9", "0.5", "0.99"), True
        if kind in ("param", "param sigmoid"):
            g = fresh(("lam", "w0", "A_log"))
            params.append(g)
            if kind == "param sigmoid":
                return f"sigmoid({g})", True
            return pick(f"exp(-exp({g}))", f"exp({minus}softplus({g}))"), True
        if kind == "param raw":
            g = fresh(("gamma", "rho"))
            params.append(g)
            return g, True
        if kind == "sigmoid":
            a = fresh(("a", "f", "alpha"))
            inputs.append(a)
            return pick((f"sigmoid({a}_t)", True), (f"1 - sigmoid({a}_t)", False))
        if kind == "softplus":
            g = fresh(("g", "gt", "z0"))
            inputs.append(g)
            return f"exp({minus}softplus({g}_t))", True
        if kind in ("mamba", "mamba raw"):
            dt = fresh(("dt", "delta", "s"))
            inputs.append(dt)
            scale_name["dt"] = dt
            if kind == "mamba":
                A = fresh(("A_log", "alog"))
                params.append(A)
                return f"exp(-softplus({dt}_t) exp({A}))", True
            A = fresh(("A", "Aneg"))
            params.append(A)
            return f"exp({dt}_t {A})", True
        g = fresh(("g", "lg"))
        inputs.append(g)
        return f"exp({g}_t)", True

    def vector_gate(size: str) -> str:
        a = fresh(("a", "g", "f", "r"))
        kind = pick("sigmoid", "softplus", "log")
        inputs.append(f"{a}[{size}]")
        return {
            "sigmoid": f"sigmoid({a}_t)",
            "softplus": f"exp(-softplus({a}_t))",
            "log": f"exp({a}_t)",
        }[kind]

    def as_value(text: str, atomic: bool) -> tuple[str, bool]:
        """Maybe name a per-token decay as a value equation `d_t = ...`."""
        if "_t" in text and draw(st.booleans()):
            d = fresh(("d", "dec", "alpha_t0"))
            values.append(f"{d}_t = {text}")
            return f"{d}_t", True
        return text, atomic

    scale_name: dict[str, str] = {}
    fmap = pick(None, "elu", "elu", "relu", "silu")
    phi = None
    if fmap:
        phi, arg = fresh(("phi", "fm", "feat")), fresh(("x", "u", "y0"))
        body = {"elu": f"elu({arg}) + 1", "relu": f"relu({arg})", "silu": f"silu({arg})"}[fmap]
        lets.append(f"let {phi}({arg}) = {body}")
    qx = f"{phi}({q}_t)" if phi else f"{q}_t"
    kx = f"{phi}({k}_t)" if phi and not delta else f"{k}_t"

    prev = f"{S}_{{t-1}}"
    gate_text, atomic, scale, g, gk = None, True, None, None, None
    update = None
    if form in _SCALAR_FORMS:
        gate_text, atomic = as_value(*scalar_gate(form))
    if delta:
        key_kind = pick("l2norm", "let", "feature", "plain")
        if key_kind == "let":
            kn, arg = fresh(("kn", "unit")), fresh(("x", "w"))
            lets.append(f"let {kn}({arg}) = l2norm({arg})")
            kx = f"{kn}({k}_t)"
        elif key_kind == "feature" and phi:
            kx = f"l2norm({phi}({k}_t))"
        elif key_kind != "plain":
            kx = f"l2norm({k}_t)"
        b = fresh(("beta", "b", "bt"))
        inputs.append(b)
        beta = pick(f"sigmoid({b}_t)", f"{b}_t", f"2 sigmoid({b}_t)")
        beta, _ = as_value(beta, True) if beta != f"{b}_t" else (beta, True)
        decay = ""
        if form == "gated delta":
            kinds = [
                f
                for f in ("constant", "sigmoid", "softplus", "mamba", "log input", "number")
                if f in forms
            ]
            g, g_atomic = as_value(*scalar_gate(pick(*(kinds or ["sigmoid"]))))
            decay = (g if g_atomic else f"({g})") + " "
        write = f"{beta} {v}_t {kx}{T}"
        update = pick(
            f"{decay}{prev} (I {minus} {beta} {kx} {kx}{T}) + {write}",
            f"{decay}{prev} {minus} {decay}{beta} {prev} {kx} {kx}{T} + {write}",
            f"{prev} {decay}(I {minus} {beta} {kx} {kx}{T}) + {beta} ({v}_t {kx}{T})",
        )
    else:
        g = gate_text if atomic else f"({gate_text})" if gate_text else None
        if form == "none":
            decayed = prev
        elif form in _SCALAR_FORMS:
            decayed = pick(f"{g} {prev}", f"{prev} {g}", f"{g} {had} {prev}")
        elif form == "diag key":
            gk = vector_gate(K)
            decayed = pick(f"{prev} diag({gk})", f"{gk}{T} {had} {prev}", f"{prev} {had} {gk}{T}")
        elif form == "diag value":
            gv = vector_gate(V)
            decayed = pick(f"diag({gv}) {prev}", f"{gv} {had} {prev}")
        else:  # outer
            gv, gk = vector_gate(V), vector_gate(K)
            decayed = f"({gv} {gk}{T}) {had} {prev}"
        scale = None
        if "dt" in scale_name and draw(st.booleans()):
            dt = scale_name["dt"]
            scale = f"softplus({dt}_t)" if form == "mamba" else f"{dt}_t"
        else:
            kind = pick(None, "input", "param", "default", "number")
            if kind == "input":
                s = fresh(("s", "beta", "w"))
                inputs.append(s)
                scale = f"{s}_t"
            elif kind in ("param", "default"):
                s = fresh(("w", "scale", "eta"))
                params.append(s if kind == "param" else f"{s} = {pick('0.5', '1 + h', '2^(-h)')}")
                scale = s
            elif kind == "number":
                scale = pick("0.5", "2", "0.125")
        pre = f"{scale} " if scale else ""
        write = pick(
            f"{pre}{v}_t {kx}{T}",
            f"{pre}({v}_t {kx}{T})",
            f"{v}_t ({pre}{kx}){T}" if scale else f"{v}_t @ {kx}{T}",
        )
        update = f"{decayed} + {write}"

    # a normaliser state z read as a ratio: elu + 1 features keep its denominator positive
    z = None
    positive = scale is None or scale[0].isdigit() or scale.startswith("softplus")
    if (
        not delta
        and fmap == "elu"
        and form not in ("diag value", "outer")
        and positive
        and draw(st.booleans())
    ):
        z = fresh(("z", "n", "norm"))
        zprev = f"{z}_{{t-1}}"
        if form == "none":
            zdecayed = zprev
        elif form in _SCALAR_FORMS:
            zdecayed = pick(f"{g} {zprev}", f"{g} {had} {zprev}")
        else:  # diag key
            zdecayed = pick(f"diag({gk}) {zprev}", f"{gk} {had} {zprev}")
        zpre = f"{scale} " if scale else ""
        zupdate = f"{zdecayed} + {zpre}{kx}"

    read = pick(f"{S}_t {qx}", f"{S}_t @ {qx}")
    if z:
        read = f"{read} / ({pick(f'{z}_t {dot} {qx}', f'{qx} {dot} {z}_t')})"
    skip = pick(None, "scalar", "default", "vector") if not z else None
    if skip:
        D = fresh(("D", "skip", "Dh"), upper=True)
        if skip == "scalar":
            params.append(D)
            read += " + " + pick(f"{D} {v}_t", f"{D} {had} {v}_t")
        elif skip == "default":
            params.append(f"{D} = {pick('1', '0.5')}")
            read += f" + {D} {v}_t"
        else:
            params.append(f"{D}[{V}]")
            read += f" + {D} {had} {v}_t"
    y = fresh(("y", "o", "out"))

    lines = [f"mixer {mixer}" + pick("", ' "a random variant"')]
    split = draw(st.integers(1, len(inputs)))
    lines.append("in    " + ", ".join(inputs[:split]))
    if inputs[split:]:
        lines.append("in    " + ", ".join(inputs[split:]))
    if params:
        lines.append("param " + ", ".join(params))
    lines.append(f"state {S}[{V}, {K}]" + (f", {z}[{K}]" if z else ""))
    lines += lets
    lines += values
    lines.append(f"{S}_t = {update}")
    if z:
        lines.append(f"{z}_t = {zupdate}")
    lines.append(f"{y}_t = {read}" + pick("", "  # the output"))
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- command line


def _progress_bar(label: str, total: int):
    """A rich progress bar on stderr when stderr is a terminal (quiet when piped or without rich);
    returns (callback, context manager)."""
    import contextlib

    if not sys.stderr.isatty():
        return None, contextlib.nullcontext()
    try:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )
    except ImportError:
        return None, contextlib.nullcontext()
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    task = bar.add_task(label, total=total)

    def update(done: int, total: int, phase: str) -> None:
        bar.update(task, completed=min(done, total), description=f"{label} ({phase})")

    return update, bar


def run_command(
    spec_path: str,
    module_path: str | None = None,
    *,
    examples: int = 25,
    seed: int = 0,
    dtype: str = "float32",
    device: str = "cpu",
    out=None,
) -> int:
    """`mixc fuzz`: 0 when every form agrees with the oracle (prints a one-line summary), 1 on a
    disagreement (prints the shrunk example and a reproducer). Spec errors raise MixcError."""
    out = out or sys.stdout
    try:
        import hypothesis  # noqa: F401
    except ImportError:
        raise MixcError("mixc fuzz needs hypothesis: pip install 'mixc[fuzz]'") from None
    spec = load_spec(spec_path)
    target = f"{spec_path}" + (f" --module {module_path}" if module_path else "")
    update, bar = _progress_bar(f"fuzzing {spec.mixer.name}", examples)
    with bar:
        report = fuzz(
            spec,
            module_path,
            examples=examples,
            seed=seed,
            dtype=dtype,
            device=device,
            progress=update,
        )
    for note in report.notes:
        print(f"note: {note}", file=sys.stderr)
    if report.ok:
        print(f"mixc fuzz {target}: {report.summary().split(': ', 1)[1]}", file=out)
        return 0
    f = report.failure
    replay = f"mixc fuzz {target} --examples {examples} --seed {seed} --dtype {dtype}"
    script = reproducer(plan(spec), f, spec_path, module_path)
    print(
        f"FAILED mixc fuzz {target}: {f.summary()}\n"
        f"  after {report.examples} passing examples; shrunk in {report.shrink_steps} steps to:\n"
        f"  {f.example.describe()}\n"
        f"  replay: {replay}\n\n"
        f"reproducer (save as repro.py, run python repro.py):\n\n{script}",
        file=out,
        end="",
    )
    return 1
