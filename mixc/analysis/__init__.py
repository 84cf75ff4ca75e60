"""Analyses: pure functions from a verified spec to immutable facts.

`analyze(spec)` finds, for every state, whether its update is affine in the state's previous
value, which transition class it belongs to (by a first-match rule table), its write term and
log-space gates; for every output, its readouts; and the plan a backend needs. `mixc explain`
prints these facts and the backends consume them. `costs(facts)` is the cost model.

Expressions in the facts are canonical (`Canon`): equal math gives equal text, so `gamma H` and
`H gamma`, `exp(dt A)` and `exp(A dt)`, or `H - b H k k^T` and `H (I - b k k^T)` give the same
facts, and the rules compare canonical text, never the spelling.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from decimal import Decimal
from fractions import Fraction

import networkx as nx

from mixc.algebra.expand import (
    Expander,
    NotAffine,
    Term,
    inline,
    product,
    transpose_atom,
)
from mixc.errors import NotYetImplemented, Span, SpecAnalysisError, SpecError
from mixc.frontend.ir import Binary, Call, Expr, Mixer, Name, Neg, Number, Timed, Transpose, walk
from mixc.frontend.spec import Spec
from mixc.frontend.verify import SCALAR, Shape, show, typer_for

__all__ = [
    "CLASSES",
    "RULES",
    "Canon",
    "Costs",
    "Facts",
    "FormCost",
    "Formula",
    "GroupCost",
    "LogGate",
    "OutputFacts",
    "Readout",
    "SpecWarning",
    "StateFacts",
    "Transition",
    "WriteTerm",
    "analyze",
    "costs",
    "dependency_graph",
]

#: Transition classes, in the order of the rule table, with the algorithm each one gets.
CLASSES = {
    "identity": "chunked scalar decay (log-space decay masks), or the quadratic masked form",
    "scalar constant": "chunked scalar decay (log-space decay masks), or the quadratic masked form",
    "scalar data-dependent": "chunked scalar decay (log-space decay masks), or the quadratic masked form",
    "diagonal key-side": "chunked diagonal gate (sub-chunks, factors measured from a boundary)",
    "diagonal value-side": "chunked diagonal gate (sub-chunks, factors measured from a boundary)",
    "elementwise gate": "chunked diagonal gate on both sides when the gate is an outer product; "
    "recurrent only for a full gate",
    "identity minus rank-1": "chunked delta rule (UT transform, fp32 triangular solve)",
    "scalar decay times identity minus rank-1": "chunked delta rule (UT transform, fp32 triangular solve)",
    "general dense": "recurrent only (no chunked form)",
    "not affine": "recurrent only (the update is not affine in the state: no chunked form exists)",
}


class SpecWarning(SpecError):  # noqa: N818 - a warning, not an error
    """A located warning: the spec compiles, but something in it is probably wrong."""

    kind = "warning"


# ----------------------------------------------------------------------------- facts


@dataclass(frozen=True)
class LogGate:
    """One decay factor and its logarithm in a numerically safe form."""

    side: str  # "scalar" | "key" | "value"
    decay: Expr  # as written (for a vector gate: the vector of decays)
    log: Expr  # log of the decay, safe to evaluate (logsigmoid(a), dt A, log(gamma)); canonical
    proven: bool  # provably in (0, 1]
    note: str


@dataclass(frozen=True)
class Transition:
    cls: str
    rule: str  # "<rule name>: <what it matched>", e.g. "delta: S_{t-1} (I - beta_t k_t k_t^T)"
    gates: tuple[LogGate, ...] = ()
    beta: Expr | None = None  # identity minus rank-1: I - beta k k^T
    key: Expr | None = None
    gate: Expr | None = None  # a full elementwise gate (recurrent only)
    reason: str | None = None  # why there is no chunked form
    span: Span | None = None

    def log(self, side: str) -> Expr | None:
        """Sum of the log-gates on one side ("scalar", "key" or "value"), or None."""
        logs = [g.log for g in self.gates if g.side == side]
        out = None
        for lg in logs:
            out = lg if out is None else Binary("+", out, lg)
        return out

    @property
    def rule_name(self) -> str:
        """The name of the rule that fired (`scalar_data`, `gated_delta`, `not_affine`, ...)."""
        return self.rule.split(":", 1)[0]

    @property
    def chunkable(self) -> bool:
        return self.reason is None


@dataclass(frozen=True)
class WriteTerm:
    """`scale value key^T`: a rank-1 write. `value` is None for a vector state (a column of 1)."""

    value: Expr | None
    key: Expr
    scale: Expr | None


@dataclass(frozen=True)
class StateFacts:
    name: str
    shape: Shape
    affine: bool
    transition: Transition
    writes: tuple[WriteTerm, ...]
    write_form: str
    span: Span | None = None
    stability: str | None = None  # delta rule: whether |k| = 1 and beta in [0, 2] are proven

    @property
    def vector(self) -> bool:
        return self.shape[1] == "1"

    @property
    def rank(self) -> int:
        """Rank of the write term (number of rank-1 outer products)."""
        return len(self.writes)


@dataclass(frozen=True)
class Readout:
    """`state_t query`, times an optional scalar scale: a linear read of one state."""

    index: int
    state: str
    query: Expr
    scale: Expr | None


@dataclass(frozen=True)
class OutputFacts:
    name: str
    shape: Shape
    form: str  # "linear", "linear + skip", "ratio", "function of readouts", "no state"
    expr: Expr  # the output with readouts replaced by Name("_r0"), Name("_r1"), ...
    readouts: tuple[Readout, ...]
    skip: Expr | None


@dataclass(frozen=True)
class Facts:
    spec: Spec
    graph: nx.DiGraph = field(repr=False)
    order: tuple[str, ...]
    states: tuple[StateFacts, ...]
    outputs: tuple[OutputFacts, ...]
    groups: tuple[tuple[str, ...], ...]  # states that share transition and key: one chunked pass
    algorithm: str
    reason: str | None  # why there is no chunked form (None when there is one)
    warnings: tuple[SpecError, ...]

    @property
    def mixer(self) -> Mixer:
        return self.spec.mixer

    @property
    def chunkable(self) -> bool:
        return self.reason is None

    def state(self, name: str) -> StateFacts:
        return next(s for s in self.states if s.name == name)


# ----------------------------------------------------------------------------- canonical text


def _number(value: Fraction | float) -> Expr:
    """A non-negative constant as a literal: 0.9 rather than 9 / 10 where the decimal is exact."""
    if isinstance(value, int):  # Term's default coefficient
        value = Fraction(value)
    if isinstance(value, Fraction):
        if value.denominator == 1:
            return Number(str(value.numerator))
        short = repr(float(value))
        if Fraction(short) == value:
            return Number(short)
        den = value.denominator
        for p in (2, 5):
            while den % p == 0:
                den //= p
        if den == 1:  # a terminating decimal longer than a float prints
            return Number(format(Decimal(value.numerator) / Decimal(value.denominator), "f"))
        return Binary("/", Number(str(value.numerator)), Number(str(value.denominator)))
    return Number(repr(float(value)))


def _signed(value: Fraction | float) -> Expr:
    return Neg(_number(-value)) if value < 0 else _number(value)


def _factor_order(e: Expr) -> tuple[int, str]:
    """Scalar factors print per-token values first, then parameters, then constants."""
    nodes = list(walk(e))
    rank = (
        0
        if any(isinstance(n, Timed) for n in nodes)
        else 1
        if any(isinstance(n, Name) for n in nodes)
        else 2
    )
    return rank, str(e)


class Canon:
    """The canonical spelling of a state-free expression: the same math gives the same text.

    Expands into terms (so `a b` and `b a`, `x + y - y`, `(a b) c` and `a (b c)` meet), merges like
    terms, and orders scalars (per-token values first) and terms; arguments of functions are
    canonical too. Facts hold canonical expressions, so equal mixers give equal facts.
    """

    def __init__(self, ex: Expander) -> None:
        self.ex = ex

    def __call__(self, e: Expr | None) -> Expr | None:
        if e is None:
            return None
        try:
            terms = self.ex.expand(e)
        except (NotAffine, SpecError):
            return e
        return self.terms(terms)

    def key(self, e: Expr) -> str:
        return str(self(e))

    def atom(self, a: Expr) -> Expr:
        if isinstance(a, Transpose):
            return Transpose(self.atom(a.operand), span=a.span)
        if isinstance(a, Call):
            return Call(a.func, tuple(self(x) for x in a.args), span=a.span)
        if isinstance(a, Neg | Binary):
            try:
                terms = self.ex.expand(a)
            except (NotAffine, SpecError):
                terms = None
            atomic = terms is not None and len(terms) == 1 and terms[0].coeff == 1
            if terms is not None and not (atomic and a in (terms[0].chain + terms[0].scalars)):
                return self.terms(terms)  # a sum of equal shapes, say, expands like any other
        if isinstance(a, Neg):
            return Neg(self(a.operand), span=a.span)
        if isinstance(a, Binary):
            left, right = self(a.left), self(a.right)
            if a.op in ("+", "*", ".") and _factor_order(right) < _factor_order(left):
                left, right = right, left
            return Binary(a.op, left, right, span=a.span)
        return a

    def combine(self, terms: list[Term]) -> list[Term]:
        """Collect like terms whose factors are equal once canonical (`exp(a b) H` and
        `exp(b a) H`), which the expander's textual collection misses; the first spelling stays."""
        merged: dict[tuple, Term] = {}
        for t in (piece for term in terms for piece in self._split_gates(term)):
            key = (
                tuple(sorted(self.key(a) for a in t.scalars)),
                tuple(str(self.atom(a)) for a in t.chain),
                tuple(sorted(str(self.atom(g)) for g in t.gates)),
            )
            merged[key] = (
                replace(merged[key], coeff=merged[key].coeff + t.coeff) if key in merged else t
            )
        return [t for t in merged.values() if t.coeff != 0]

    def _split_gates(self, t: Term) -> list[Term]:
        """`(a + b) ⊙ S` is `a ⊙ S + b ⊙ S`, and `(2 a) ⊙ S` is `2 (a ⊙ S)`: a gate that expands to
        more than one plain atom is distributed, so like terms meet."""
        out = [replace(t, gates=())]
        for g in t.gates:
            try:
                pieces = self.ex.expand(g)
            except (NotAffine, SpecError):
                pieces = None
            plain = (
                pieces is not None
                and len(pieces) == 1
                and pieces[0].coeff == 1
                and not pieces[0].scalars
            )
            if (
                pieces is None
                or (plain and len(pieces[0].chain) == 1)
                or any(p.gates for p in pieces)
            ):
                out = [replace(x, gates=(*x.gates, g)) for x in out]
                continue
            out = [
                replace(
                    x.scale(p.coeff, p.scalars),
                    gates=(*x.gates, p.chain[0] if len(p.chain) == 1 else product(list(p.chain))),
                )
                for x in out
                for p in pieces
                if p.chain
            ]
        out = [replace(x, gates=tuple(sorted(x.gates, key=str))) for x in out]
        return [self._fold_gates(x) for x in out]

    def _fold_gates(self, t: Term) -> Term:
        """A state-free gated term (`g ⊙ (S + x)` leaves `g ⊙ x`) is one atom `g * x`, as the
        expander writes a state-free elementwise product, so the two spellings meet."""
        if not t.gates or not t.chain or any(self.ex.has_state(a) for a in t.chain):
            return t
        e = product(list(t.chain))
        for g in t.gates:
            e = Binary("*", g, e)
        return replace(t, chain=(self.atom(e),), gates=())

    def factor(self, terms: list[Term]) -> list[Term]:
        """Terms with the same matrix factors, told apart only by their scalars, become one term
        whose scalar is the sum: `H - s H` is `(1 - s) H`, one scalar decay (as written or not)."""
        groups: dict[tuple, list[Term]] = {}
        for t in terms:
            key = (
                tuple(str(self.atom(a)) for a in t.chain),
                tuple(sorted(str(self.atom(g)) for g in t.gates)),
            )
            groups.setdefault(key, []).append(t)
        out = []
        for group in groups.values():
            if len(group) == 1:
                out.append(group[0])
                continue
            scalar = self.terms([Term(coeff=t.coeff, scalars=t.scalars) for t in group])
            if isinstance(scalar, Number) and scalar.text == "0":
                continue
            out.append(Term(scalars=(scalar,), chain=group[0].chain, gates=group[0].gates))
        return out

    def terms(self, terms: list[Term]) -> Expr:
        merged: dict[tuple, list] = {}
        for t in terms:
            scalars = sorted((self.atom(a) for a in t.scalars), key=_factor_order)
            chain = [self.atom(a) for a in t.chain]
            gates = sorted((self.atom(g) for g in t.gates), key=str)
            key = (tuple(map(str, chain)), tuple(map(str, scalars)), tuple(map(str, gates)))
            if key in merged:
                merged[key][0] += t.coeff
            else:
                merged[key] = [t.coeff, scalars, chain, gates]
        out: Expr | None = None
        for key in sorted(merged):
            coeff, scalars, chain, gates = merged[key]
            if coeff == 0:
                continue
            factors = list(scalars) + list(chain)
            if abs(coeff) != 1 or not factors:
                factors.insert(0, _number(abs(coeff)))
            e = product(factors)
            for g in gates:
                e = Binary("*", g, e)
            if out is None:
                out = Neg(e) if coeff < 0 else e
            else:
                out = Binary("-" if coeff < 0 else "+", out, e)
        return out if out is not None else Number("0")

    def column(self, e: Expr | None) -> Expr | None:
        """A vector as a column (for a per-channel gate or a key), canonical."""
        if e is None:
            return None
        shape = self.ex.shape(e)
        return self(Transpose(e, span=e.span) if shape[0] == "1" and shape != SCALAR else e)


# ----------------------------------------------------------------------------- graph


def dependency_graph(mixer: Mixer) -> nx.DiGraph:
    """Nodes: every input, parameter, state and equation target, with `kind`. Edges: reads,
    labelled with `lag` (0 or 1)."""
    g = nx.DiGraph()
    for d in mixer.inputs:
        g.add_node(d.name, kind="input")
    for p in mixer.params:
        g.add_node(p.name, kind="param")
    for s in mixer.states:
        g.add_node(s.name, kind="state")
    outputs = {e.target for e in mixer.outputs}
    states = {s.name for s in mixer.states}
    for eq in mixer.equations:
        if eq.target not in states:
            g.add_node(eq.target, kind="output" if eq.target in outputs else "value")
    for eq in mixer.equations:
        body = inline_lets_only(mixer, eq.value)
        for n in walk(body):
            if isinstance(n, Timed):
                lag = -n.offset
                if g.has_edge(n.name, eq.target):
                    lag = min(lag, g.edges[n.name, eq.target]["lag"])
                g.add_edge(n.name, eq.target, lag=lag)
            elif isinstance(n, Name) and n.name in g:
                g.add_edge(n.name, eq.target, lag=0)
    return g


def inline_lets_only(mixer: Mixer, e: Expr) -> Expr:
    if not mixer.lets:
        return e
    stripped = Mixer(mixer.name, lets=mixer.lets, states=mixer.states)
    return inline(stripped, e)


def _order(mixer: Mixer, g: nx.DiGraph) -> tuple[str, ...]:
    lag0 = nx.DiGraph()
    lag0.add_nodes_from(g.nodes)
    lag0.add_edges_from((a, b) for a, b, d in g.edges(data=True) if d["lag"] == 0)
    try:
        return tuple(nx.lexicographical_topological_sort(lag0))
    except nx.NetworkXUnfeasible:
        cycle = nx.find_cycle(lag0)
        eq = mixer.update(cycle[0][1])
        raise SpecAnalysisError(
            "not causal: " + " -> ".join(f"{a}_t" for a, _ in cycle) + f" -> {cycle[0][0]}_t",
            eq.span if eq else None,
            hint="a value at time t may depend on earlier times only through a state at t-1",
        ) from None


# ----------------------------------------------------------------------------- log-gates


def _bounds(e: Expr) -> tuple[float, float]:
    """Interval of values `e` can take, for h >= 0 and unknown inputs and parameters."""
    inf = math.inf
    if isinstance(e, Number):
        v = float(e.text)
        return v, v
    if isinstance(e, Name):
        return (0.0, inf) if e.name == "h" else (-inf, inf)
    if isinstance(e, Neg):
        lo, hi = _bounds(e.operand)
        return -hi, -lo
    if isinstance(e, Call) and len(e.args) == 1:
        lo, hi = _bounds(e.args[0])
        monotone = {
            "exp": lambda x: math.exp(min(x, 700)),
            "sigmoid": lambda x: 1 / (1 + math.exp(-max(min(x, 700), -700))),
            "softplus": lambda x: math.log1p(math.exp(min(x, 700))) if x < 700 else x,
            "relu": lambda x: max(x, 0.0),
            "tanh": math.tanh,
        }
        if e.func in monotone:
            f = monotone[e.func]
            low = f(lo) if lo > -inf else (-1.0 if e.func == "tanh" else 0.0)
            high = f(hi) if hi < inf else (1.0 if e.func in ("sigmoid", "tanh") else inf)
            return low, high
        if e.func == "logsigmoid":
            return -inf, 0.0
        if e.func == "sqrt":
            return 0.0, inf
        return -inf, inf
    if isinstance(e, Binary):
        (a, b), (c, d) = _bounds(e.left), _bounds(e.right)
        if e.op == "+":
            return a + c, b + d
        if e.op == "-":
            return a - d, b - c
        if e.op in ("*", "@"):
            return _mul_bounds(a, b, c, d)
        if e.op == "/" and (c > 0 or d < 0):  # the denominator never crosses 0
            inv = (
                1 / d if d not in (0, inf, -inf) else 0.0,
                1 / c if c not in (0, inf, -inf) else 0.0,
            )
            if c > 0 and math.isinf(d):
                inv = (0.0, 1 / c)
            if d < 0 and math.isinf(c):
                inv = (1 / d, 0.0)
            return _mul_bounds(a, b, *inv)
        if e.op == "^" and a > 0:
            vals = [x**y for x in (a, b) for y in (c, d) if not (math.isinf(x) and y == 0)]
            try:
                return min(vals), max(vals)
            except (OverflowError, ValueError):
                return 0.0, inf
    return -inf, inf


def _mul_bounds(a: float, b: float, c: float, d: float) -> tuple[float, float]:
    if not any(math.isinf(x) for x in (a, b, c, d)):
        ps = [a * c, a * d, b * c, b * d]
        return min(ps), max(ps)
    if a >= 0 and c >= 0:
        return 0.0, math.inf
    if (a >= 0 and d <= 0) or (b <= 0 and c >= 0):
        return -math.inf, 0.0
    if b <= 0 and d <= 0:
        return 0.0, math.inf
    return -math.inf, math.inf


def _nonpositive(e: Expr, params: dict[str, Expr]) -> bool:
    return _bounds(_with_defaults(e, params))[1] <= 0


def _with_defaults(e: Expr, params: dict[str, Expr]) -> Expr:
    if isinstance(e, Name) and params.get(e.name) is not None:
        return params[e.name]
    if isinstance(e, Neg):
        return Neg(_with_defaults(e.operand, params))
    if isinstance(e, Binary):
        return Binary(e.op, _with_defaults(e.left, params), _with_defaults(e.right, params))
    if isinstance(e, Call):
        return Call(e.func, tuple(_with_defaults(a, params) for a in e.args))
    if isinstance(e, Transpose):
        return _with_defaults(e.operand, params)
    return e


def _constant(e: Expr) -> float | None:
    """The value of an expression of numbers only (no names, no head index), else None."""
    if any(isinstance(n, Name | Timed) for n in walk(e)):
        return None
    lo, hi = _bounds(e)
    return lo if lo == hi else None


def log_gate(decay: Expr, side: str, params: dict[str, Expr]) -> LogGate:
    """The log of one decay factor, in a form that never computes log(sigmoid(.))."""
    inner = decay.operand if isinstance(decay, Transpose) else decay
    if isinstance(inner, Call) and inner.func == "diag":
        inner = inner.args[0]
        inner = inner.operand if isinstance(inner, Transpose) else inner
    if isinstance(inner, Call) and inner.func == "sigmoid":
        return LogGate(side, decay, Call("logsigmoid", inner.args), True, "sigmoid(x) is in (0, 1)")
    if (
        isinstance(inner, Binary)
        and inner.op == "-"
        and isinstance(inner.left, Number)
        and inner.left.text == "1"
        and isinstance(inner.right, Call)
        and inner.right.func == "sigmoid"
    ):
        arg = inner.right.args[0]
        return LogGate(
            side,
            decay,
            Call("logsigmoid", (Neg(arg),)),
            True,
            "1 - sigmoid(x) = sigmoid(-x) is in (0, 1)",
        )
    if isinstance(inner, Call) and inner.func == "exp":
        arg = inner.args[0]
        proven = _nonpositive(arg, params)
        note = f"{arg} <= 0 always" if proven else f"in (0, 1] only if {arg} <= 0"
        return LogGate(side, decay, arg, proven, note)
    if isinstance(inner, Binary) and inner.op in ("*", "@"):
        a, b = log_gate(inner.left, side, params), log_gate(inner.right, side, params)
        notes = a.note if a.note == b.note else f"{a.note}; {b.note}"
        return LogGate(side, decay, Binary("+", a.log, b.log), a.proven and b.proven, notes)
    value = _constant(inner)
    if value is not None:
        ok = 0 < value <= 1
        return LogGate(
            side,
            decay,
            Call("log", (inner,)),
            ok,
            "a constant in (0, 1]" if ok else f"the constant {value:g} is not in (0, 1]",
        )
    if (
        isinstance(inner, Binary)
        and inner.op == "/"
        and isinstance(inner.left, Number)
        and inner.left.text == "1"
    ):
        sub = log_gate(inner.right, side, params)
        lo = _bounds(_with_defaults(inner.right, params))[0]
        return LogGate(
            side,
            decay,
            Neg(sub.log),
            lo >= 1,
            f"1/x with x >= 1 {'always' if lo >= 1 else 'not proven'}",
        )
    lo, hi = _bounds(_with_defaults(inner, params))
    ok = lo > 0 and hi <= 1
    note = f"in [{lo:.6g}, {hi:.6g}] for every head" if ok else "not provably in (0, 1]"
    return LogGate(side, decay, Call("log", (inner,)), ok, note)


def _scalar_gates(t: Term, ctx: RuleContext) -> list[LogGate]:
    gates = [ctx.gate(s, "scalar") for s in t.scalars]
    if t.coeff != 1:
        gates.append(ctx.gate(_signed(t.coeff), "scalar"))
    return gates


# ----------------------------------------------------------------------------- rule table

Matcher = Callable[[list[tuple[Term, int]], "RuleContext"], "Transition | None"]


@dataclass(frozen=True)
class RuleContext:
    state: str
    shape: Shape
    expander: Expander
    params: dict[str, Expr]
    span: Span | None
    canon: Canon

    def gate(self, decay: Expr, side: str) -> LogGate:
        """The log-gate of a decay, proved on its canonical form (so `exp(x + y - y)` is `exp(x)`)
        but reported as written."""
        return replace(log_gate(self.canon(decay), side, self.params), decay=decay)


def _split(t: Term, at: int) -> tuple[tuple[Expr, ...], tuple[Expr, ...]]:
    return t.chain[:at], t.chain[at + 1 :]


def _plain(terms, ctx) -> tuple[Term, tuple, tuple] | None:
    if len(terms) != 1:
        return None
    t, at = terms[0]
    left, right = _split(t, at)
    return t, left, right


def _rule_identity(terms, ctx):
    p = _plain(terms, ctx)
    if p and not (p[1] or p[2] or p[0].gates or p[0].scalars) and p[0].coeff == 1:
        return Transition("identity", "identity: S_{t-1} alone")
    return None


def _rule_scalar(terms, ctx):
    p = _plain(terms, ctx)
    if not p or p[1] or p[2] or p[0].gates:
        return None
    t = p[0]
    gates = tuple(_scalar_gates(t, ctx))
    data = any(isinstance(n, Timed) for s in t.scalars for n in walk(s))
    if data:
        return Transition(
            "scalar data-dependent", "scalar_data: a per-token scalar times S_{t-1}", gates
        )
    return Transition(
        "scalar constant", "scalar_constant: a per-head constant times S_{t-1}", gates
    )


def _diag_vector(atom: Expr) -> Expr | None:
    if isinstance(atom, Call) and atom.func == "diag":
        return atom
    return None


def _rule_diagonal(terms, ctx):
    p = _plain(terms, ctx)
    if not p:
        return None
    t, left, right = p
    if not all(_diag_vector(a) for a in left + right):
        return None
    ex = ctx.expander
    gates = list(_scalar_gates(t, ctx))
    gates += [ctx.gate(a, "value") for a in left]
    gates += [ctx.gate(a, "key") for a in right]
    full = None
    for g in t.gates:
        shape = ex.shape(g)
        if shape == SCALAR:
            gates.append(ctx.gate(g, "scalar"))
            continue
        if shape[0] == "1" or shape[1] == "1":
            side = "key" if shape[0] == "1" else "value"
            gates.append(ctx.gate(g, side))
            continue
        outer = ex.expand(g)
        if len(outer) == 1 and len(outer[0].chain) == 2 and not outer[0].gates:
            u, w = outer[0].chain
            gates += _scalar_gates(outer[0], ctx)
            gates.append(ctx.gate(u, "value"))
            gates.append(ctx.gate(w, "key"))
        else:
            full = g
    if full is not None:
        return Transition(
            "elementwise gate",
            "full_elementwise_gate: G_t ⊙ S_{t-1}, G_t a full matrix",
            tuple(gates),
            gate=full,
            reason=f"NYI: the full elementwise gate {full} has no chunked form (the decay between two "
            "tokens would be a [V, K] tensor per pair); write it as an outer product a_t b_t^T, or "
            "as diag(...) on one side, to get one",
        )
    sides = {g.side for g in gates} - {"scalar"}
    if not sides:
        return None
    if sides == {"key"}:
        return Transition("diagonal key-side", "diagonal_key: S_{t-1} diag(a_t)", tuple(gates))
    if sides == {"value"}:
        if ctx.shape[1] == "1":
            return Transition(
                "diagonal key-side",
                "diagonal_key: diag(a_t) s_{t-1} (a vector state)",
                tuple(gates),
            )
        return Transition("diagonal value-side", "diagonal_value: diag(a_t) S_{t-1}", tuple(gates))
    return Transition("elementwise gate", "outer_product_gate: (a_t b_t^T) ⊙ S_{t-1}", tuple(gates))


def _monomials(t: Term, ctx, atoms: dict[str, Expr]) -> dict[tuple[str, ...], Fraction | float]:
    """t's coefficient times its scalars, expanded into a sum of monomials: {sorted canonical
    keys of the scalar atoms: coefficient}; `(1 - s) b` is {(b,): 1, (b, s): -1}. Each atom
    met is recorded in `atoms` by its key."""
    poly: dict[tuple[str, ...], Fraction | float] = {(): t.coeff}
    for scalar in t.scalars:
        pieces = ctx.expander.expand(scalar)
        if any(p.gates or any(ctx.expander.shape(a) != SCALAR for a in p.chain) for p in pieces):
            pieces = [Term(scalars=(scalar,))]
        grown: dict[tuple[str, ...], Fraction | float] = {}
        for p in pieces:
            keys = []
            for a in p.scalars + p.chain:
                keys.append(ctx.canon.key(a))
                atoms.setdefault(keys[-1], a)
            for known, c in poly.items():
                key = tuple(sorted(known + tuple(keys)))
                grown[key] = grown.get(key, 0) + c * p.coeff
        poly = {k: c for k, c in grown.items() if c != 0}
    return poly


def _quotient(big: dict, small: dict) -> dict | None:
    """A polynomial q with big = q * small (polynomials as from _monomials), or None: termwise
    when small is one monomial, else a single monomial q (enough for a decay that is a sum)."""
    if not small:
        return None

    def divide(atoms: tuple[str, ...], by: tuple[str, ...]) -> tuple[str, ...] | None:
        rest = list(atoms)
        for a in by:
            if a not in rest:
                return None
            rest.remove(a)
        return tuple(rest)

    if len(small) == 1:
        (by, c0), out = next(iter(small.items())), {}
        for atoms, c in big.items():
            rest = divide(atoms, by)
            if rest is None:
                return None
            out[rest] = c / c0
        return out
    first, c0 = next(iter(small.items()))
    for atoms, c in big.items():
        rest = divide(atoms, first)
        if rest is None:
            continue
        if {tuple(sorted(k + rest)): v * c / c0 for k, v in small.items()} == big:
            return {rest: c / c0}
    return None


def _rule_delta(terms, ctx):
    """a S (I - beta k k^T): one term S times a scalar decay a (or none), one term S k k^T whose
    scalar is -a beta, found by dividing the two scalars as polynomials, however the decay is
    written: `(1 - s) S (I - b k k^T)` expands to four terms, gathered by scalar into two."""
    if len(terms) != 2 or any(t.gates for t, _ in terms):
        return None
    ex, key = ctx.expander, ctx.canon.key
    for (t0, at0), (t1, at1) in (terms, terms[::-1]):
        l0, r0 = _split(t0, at0)
        l1, r1 = _split(t1, at1)
        if l0 or r0 or l1 or len(r1) != 2:
            continue
        k, kt = r1
        if ex.shape(k)[1] != "1" or key(transpose_atom(k, ex.shape(k))) != key(kt):
            continue
        by_key: dict[str, Expr] = {}
        quotient = _quotient(_monomials(t1, ctx, by_key), _monomials(t0, ctx, by_key))  # -beta
        if not quotient or (set(quotient) == {()} and -quotient[()] <= 0):
            continue  # none, or a constant beta that is not positive
        beta = ctx.canon.terms(
            [
                Term(coeff=-c, scalars=tuple(by_key[a] for a in atoms))
                for atoms, c in quotient.items()
            ]
        )
        decay = _scalar_gates(t0, ctx)
        if decay:
            return Transition(
                "scalar decay times identity minus rank-1",
                "gated_delta: a_t S_{t-1} (I - beta_t k_t k_t^T)",
                tuple(decay),
                beta=beta,
                key=k,
            )
        return Transition(
            "identity minus rank-1", "delta: S_{t-1} (I - beta_t k_t k_t^T)", beta=beta, key=k
        )
    return None


def _rule_dense(terms, ctx):
    return Transition(
        "general dense",
        "general_dense: any other linear map of S_{t-1}",
        reason="NYI: this transition is linear but in no class with a chunked form "
        "(scalar, diagonal, outer-product gate, identity minus rank-1, or those times a scalar decay)",
    )


#: The rule table: first match wins; each rule's name is reported by `mixc explain`.
RULES: tuple[tuple[str, Matcher], ...] = (
    ("identity", _rule_identity),
    ("scalar", _rule_scalar),
    ("diagonal", _rule_diagonal),
    ("delta", _rule_delta),
    ("general_dense", _rule_dense),
)


# ----------------------------------------------------------------------------- states


def _state_position(t: Term, state: str) -> list[int]:
    return [i for i, a in enumerate(t.chain) if _is_state(a, state)]


def _is_state(a: Expr, state: str) -> bool:
    return (isinstance(a, Timed) and a.name == state) or (
        isinstance(a, Transpose) and isinstance(a.operand, Timed) and a.operand.name == state
    )


def _row_form(t: Term, ex: Expander) -> Term:
    """A vector state s[K] is treated as the row s^T (one value channel): transpose its terms."""
    return replace(
        t,
        chain=tuple(transpose_atom(a, ex.shape(a)) for a in reversed(t.chain)),
        gates=tuple(transpose_atom(g, ex.shape(g)) for g in t.gates),
    )


def _at(span: Span | None) -> str:
    return f" at line {span.line}, column {span.column}" if span else ""


def _analyze_state(mixer: Mixer, name: str, ex: Expander, params, canon: Canon) -> StateFacts:
    decl = mixer.state(name)
    eq = mixer.update(name)
    shape = ex.typer.symbols[name].shape
    body = inline(mixer, eq.value)
    others = {s.name for s in mixer.states} - {name}
    try:
        terms = canon.factor(canon.combine(ex.expand(body)))
    except NotAffine as exc:
        reason = f"not affine: {exc.why} ({exc.node}{_at(exc.node.span)})"
        return StateFacts(
            name,
            shape,
            False,
            Transition(
                "not affine",
                "not_affine: the update is not affine in S_{t-1}",
                reason=reason,
                span=exc.node.span,
            ),
            (),
            "unknown",
            decl.span,
        )
    if shape[1] == "1":
        terms = [_row_form(t, ex) for t in terms]
    transition_terms, writes, coupled = [], [], None
    for t in terms:
        where = _state_position(t, name)
        touches_other = [
            a
            for a in t.chain + t.scalars + t.gates
            if any(isinstance(n, Timed) and n.name in others for n in walk(a))
        ]
        if touches_other:
            coupled = touches_other[0]
        if len(where) > 1:
            return StateFacts(
                name,
                shape,
                False,
                Transition(
                    "not affine",
                    "not_affine: the update is not affine in S_{t-1}",
                    reason=f"not affine: {name} appears twice in one product{_at(eq.span)}",
                    span=eq.span,
                ),
                (),
                "unknown",
                decl.span,
            )
        if where:
            transition_terms.append((t, where[0]))
        else:
            writes.append(t)
    if coupled is not None:
        transition = Transition(
            "general dense",
            "coupled_states: the update reads another state",
            reason=f"NYI: the update of {name} reads another state ({coupled}{_at(coupled.span)}); "
            "coupled states run step by step",
            span=coupled.span,
        )
    elif not transition_terms:
        transition = Transition(
            "general dense",
            "no_recurrence: S_t does not read S_{t-1}",
            reason=f"NYI: {name}_t does not depend on {name}_{{t-1}}; write it as a per-token value instead",
            span=eq.span,
        )
    else:
        ctx = RuleContext(name, shape, ex, params, eq.span, canon)
        transition = next(
            tr for _, rule in RULES if (tr := rule(transition_terms, ctx)) is not None
        )
        transition = replace(
            transition,
            span=eq.value.span,
            beta=canon(transition.beta),
            key=canon.column(transition.key),
            gate=canon(transition.gate),
            gates=tuple(_canonical_gate(g, canon) for g in transition.gates),
        )
        negative = [g for g in transition.gates if (v := _constant(g.decay)) is not None and v <= 0]
        if negative and transition.reason is None:
            transition = replace(
                transition,
                reason=f"NYI: the decay {negative[0].decay} is not positive; log-space chunking needs "
                "a decay in (0, 1]",
            )
    write_terms, form = _writes(writes, shape, ex, canon)
    if form != "rank-1 outer products" and transition.reason is None:
        transition = replace(
            transition,
            reason=f"NYI: the write term is {form}; chunked forms need a sum of rank-1 outer products v_t k_t^T",
        )
    elif len(write_terms) > 1 and transition.reason is None:
        transition = replace(
            transition,
            reason=f"NYI: the write of {name} has rank {len(write_terms)}; the chunked lowerings take one "
            f"rank-1 write per state: split {name} into {len(write_terms)} states with the same "
            "transition, one write each, and add their readouts",
        )
    return StateFacts(
        name,
        shape,
        True,
        transition,
        write_terms,
        form,
        decl.span,
        _stability(transition, write_terms, params),
    )


def _canonical_gate(g: LogGate, canon: Canon) -> LogGate:
    log = canon.column(g.log)
    return replace(g, log=log, note=g.note.replace(str(g.log), str(log)))


def _stability(tr: Transition, writes: tuple[WriteTerm, ...], params) -> str | None:
    """The delta rule is stable when |k| = 1 and beta is in [0, 2] (eigenvalues 1 and 1 - beta)."""
    if tr.beta is None or tr.key is None:
        return None
    unit = isinstance(tr.key, Call) and tr.key.func == "l2norm"
    lo, hi = _bounds(_with_defaults(tr.beta, params))
    beta_ok = lo >= 0 and hi <= 2
    parts = [
        f"|{tr.key}| = 1 (l2norm)"
        if unit
        else f"|{tr.key}| = 1 not proven (write l2norm({tr.key}))",
        f"{tr.beta} in [{lo:g}, {hi:g}]" if beta_ok else f"{tr.beta} in [0, 2] not proven",
    ]
    verdict = "stable" if unit and beta_ok else "stable only if"
    return (
        f"{verdict}: "
        + ", ".join(parts)
        + " (eigenvalues of I - beta k k^T are 1 and 1 - beta |k|^2)"
    )


def _writes(
    terms: list[Term], shape: Shape, ex: Expander, canon: Canon
) -> tuple[tuple[WriteTerm, ...], str]:
    out = []
    for t in terms:
        if t.gates:
            return (), "an elementwise product"
        scale = (
            canon.terms([Term(coeff=t.coeff, scalars=t.scalars)])
            if (t.coeff != 1 or t.scalars)
            else None
        )
        if len(t.chain) == 1 and shape[1] == "1":
            out.append(WriteTerm(None, canon.column(t.chain[0]), scale))
        elif (
            len(t.chain) == 2 and ex.shape(t.chain[0])[1] == "1" and ex.shape(t.chain[1])[0] == "1"
        ):
            out.append(WriteTerm(canon(t.chain[0]), canon.column(t.chain[1]), scale))
        else:
            return (), f"not an outer product ({show(shape)} from {product(list(t.chain))})"
    if not out:
        return (), "empty (no write)"
    return tuple(out), "rank-1 outer products"


# ----------------------------------------------------------------------------- outputs


def _analyze_output(mixer: Mixer, eq, ex: Expander, shape: Shape, canon: Canon) -> OutputFacts:
    states = {s.name for s in mixer.states}
    readouts: list[Readout] = []

    def read(e: Expr) -> Expr:
        if not ex.has_state(e):
            return canon(e)
        try:
            terms = canon.combine(ex.expand(e))
        except NotAffine:
            terms = None
        if terms is not None and all(
            _readout_term(t, states, ex) is not None or not _touches(t, ex) for t in terms
        ):
            pieces: list[Expr] = []
            skips = [t for t in terms if not _touches(t, ex)]
            reads = []
            for t in terms:
                if _touches(t, ex):
                    state, query, scale = _readout_term(t, states, ex)
                    reads.append((_intern(readouts, state, canon(query)), scale, t))
            for r, _, t in sorted(reads, key=lambda x: x[0].name):
                pieces.append(
                    r
                    if not (t.coeff != 1 or t.scalars)
                    else Binary("*", canon.terms([Term(coeff=t.coeff, scalars=t.scalars)]), r)
                )
            out = pieces[0]
            for p in pieces[1:]:
                out = Binary("+", out, p)
            if skips:
                out = Binary("+", out, canon.terms(skips))
            return out
        if isinstance(e, Binary):
            return Binary(e.op, read(e.left), read(e.right), span=e.span)
        if isinstance(e, Neg):
            return Neg(read(e.operand), span=e.span)
        if isinstance(e, Call):
            return Call(e.func, tuple(read(a) for a in e.args), span=e.span)
        raise NotYetImplemented(
            f"cannot read the state in {e} linearly",
            e.span,
            hint="outputs read states as S_t x (a matrix state times a vector) or s_t . x",
        )

    body = inline(mixer, eq.value)
    expr = read(body)
    skip = None
    if not readouts:
        form = "no state"
    elif (
        isinstance(expr, Binary)
        and expr.op == "/"
        and _has_readout(expr.left)
        and _has_readout(expr.right)
    ):
        form = "ratio"
    elif _linear_only(expr):
        form = "linear"
    elif (
        isinstance(expr, Binary)
        and expr.op == "+"
        and not _has_readout(expr.right)
        and _linear_only(expr.left)
    ):
        form, skip = "linear + skip", expr.right
    else:
        form = "function of readouts"
    return OutputFacts(eq.target, shape, form, expr, tuple(readouts), skip)


def _touches(t: Term, ex: Expander) -> bool:
    return any(ex.has_state(a) for a in t.chain + t.scalars + t.gates)


def _readout_term(t: Term, states: set[str], ex: Expander):
    if t.gates or not t.chain:
        return None
    first, rest = t.chain[0], t.chain[1:]
    vector_state = isinstance(first, Transpose) and isinstance(first.operand, Timed)
    node = first.operand if vector_state else first
    if not (isinstance(node, Timed) and node.name in states and node.offset == 0):
        return None
    if any(ex.has_state(a) for a in rest + t.scalars):
        return None
    state_shape = ex.shape(node)
    if vector_state != (state_shape[1] == "1"):
        return None
    query = product(list(rest))
    if query is None or ex.shape(query)[1] != "1":
        return None
    scale = [_signed(t.coeff)] if t.coeff != 1 else []
    return node.name, query, product(scale + list(t.scalars))


def _intern(readouts: list[Readout], state: str, query: Expr) -> Name:
    for r in readouts:
        if r.state == state and str(r.query) == str(query):
            return Name(f"_r{r.index}")
    readouts.append(Readout(len(readouts), state, query, None))
    return Name(f"_r{len(readouts) - 1}")


def _has_readout(e: Expr) -> bool:
    return any(isinstance(n, Name) and n.name.startswith("_r") for n in walk(e))


def _linear_only(e: Expr) -> bool:
    if isinstance(e, Name):
        return e.name.startswith("_r")
    if isinstance(e, Binary) and e.op == "+":
        return _linear_only(e.left) and _linear_only(e.right)
    if isinstance(e, Binary) and e.op == "*":
        return not _has_readout(e.left) and _linear_only(e.right) and isinstance(e.right, Name)
    return False


# ----------------------------------------------------------------------------- plan


def _groups(states: tuple[StateFacts, ...]) -> tuple[tuple[str, ...], ...]:
    """States with the same transition and one write of the same key share one chunked pass
    (their values are concatenated), as the normaliser z shares H's pass."""
    groups: dict[tuple, list[str]] = {}
    for s in states:
        tr = s.transition
        if not tr.chunkable or len(s.writes) != 1:
            key = ("alone", s.name)
        else:
            key = (
                tr.cls,
                tuple((g.side, str(g.log)) for g in tr.gates),
                str(tr.beta),
                str(tr.key),
                str(s.writes[0].key),
            )
        groups.setdefault(key, []).append(s.name)
    return tuple(tuple(v) for v in groups.values())


def analyze(spec: Spec) -> Facts:
    """All facts about one verified spec. Raises SpecAnalysisError for non-causal specs."""
    try:
        return _analyze(spec)
    except SpecError as exc:
        raise exc.located(spec.source) from None


def _analyze(spec: Spec) -> Facts:
    mixer = spec.mixer
    graph = dependency_graph(mixer)
    order = _order(mixer, graph)
    typer = typer_for(mixer, spec.shapes)
    state_names = {s.name for s in mixer.states}
    ex = Expander(mixer, typer, state_names)
    canon = Canon(ex)
    params = {p.name: p.default for p in mixer.params}
    states = tuple(_analyze_state(mixer, s.name, ex, params, canon) for s in mixer.states)
    outputs = tuple(
        _analyze_output(mixer, eq, ex, spec.shapes[eq.target], canon) for eq in mixer.outputs
    )
    warnings = []
    for s in states:
        for g in s.transition.gates:
            if not g.proven:
                warnings.append(
                    SpecWarning(
                        f"cannot prove the decay {g.decay} of {s.name} is in (0, 1] ({g.note})",
                        g.decay.span or s.transition.span,
                        spec.source,
                        hint="if it can exceed 1 the state grows without bound; parametrise it as "
                        "exp(-softplus(x)), sigmoid(x), or exp(dt A) with A = -exp(A_log)",
                    )
                )
        read_by_output = any(nx.has_path(graph, s.name, o.name) for o in outputs)
        if not read_by_output:
            warnings.append(
                SpecWarning(
                    f"state {s.name} is never read by an output",
                    s.span,
                    spec.source,
                    hint=f"read it in an output (y_t = {s.name}_t q_t) or delete it",
                )
            )
    reasons = [f"{s.name}: {s.transition.reason}" for s in states if s.transition.reason]
    if not states:
        reasons.append("the mixer has no state")
    classes = sorted({CLASSES[s.transition.cls] for s in states})
    algorithm = "; ".join(classes) if not reasons else "recurrent only"
    return Facts(
        spec,
        graph,
        order,
        states,
        outputs,
        _groups(states),
        algorithm,
        "; ".join(reasons) or None,
        tuple(warnings),
    )


# ----------------------------------------------------------------------------- cost model

Monomial = tuple[tuple[str, int], ...]

#: Bytes of one element: inputs and outputs in a 16-bit type, states and intermediates in fp32.
IO_BYTES = 2
ACC_BYTES = 4


@dataclass(frozen=True)
class Formula:
    """A per-token count: a polynomial in size symbols with rational coefficients. Exponents may
    be negative (`8*K*V/C`: a state moved once per chunk of C tokens)."""

    terms: tuple[tuple[Monomial, Fraction], ...] = ()

    @staticmethod
    def const(value: int | Fraction) -> Formula:
        return Formula((((), Fraction(value)),)) if value else Formula()

    @staticmethod
    def size(name: str) -> Formula:
        """A declared size: a symbol, or a number for a literal size such as 64."""
        return (
            Formula.const(int(name)) if name.isdigit() else Formula(((((name, 1),), Fraction(1)),))
        )

    def _combine(self, items) -> Formula:
        acc: dict[Monomial, Fraction] = {}
        for mono, c in items:
            acc[mono] = acc.get(mono, Fraction(0)) + c
        return Formula(
            tuple(sorted(((m, c) for m, c in acc.items() if c), key=lambda mc: _mono_order(mc[0])))
        )

    def __add__(self, other: Formula | int) -> Formula:
        other = other if isinstance(other, Formula) else Formula.const(other)
        return self._combine(self.terms + other.terms)

    __radd__ = __add__

    def __mul__(self, other: Formula | int | Fraction) -> Formula:
        if not isinstance(other, Formula):
            other = Formula.const(other)
        items = []
        for m1, c1 in self.terms:
            for m2, c2 in other.terms:
                powers = dict(m1)
                for s, e in m2:
                    powers[s] = powers.get(s, 0) + e
                items.append((tuple(sorted((s, e) for s, e in powers.items() if e)), c1 * c2))
        return self._combine(items)

    __rmul__ = __mul__

    def __truediv__(self, other: Formula | int) -> Formula:
        """Division by a number or by one monomial (a size symbol)."""
        if not isinstance(other, Formula):
            return self * Fraction(1, other)
        ((mono, c),) = other.terms
        return self * Formula(((tuple((s, -e) for s, e in mono), 1 / c),))

    def substitute(self, name: str, by: Formula) -> Formula:
        out = Formula()
        for mono, c in self.terms:
            term = Formula.const(c)
            for s, e in mono:
                base = by if s == name else Formula.size(s)
                if e < 0:
                    ((bm, bc),) = base.terms
                    base = Formula(((tuple((x, -y) for x, y in bm), 1 / bc),))
                for _ in range(abs(e)):
                    term = term * base
            out = out + term
        return out

    @property
    def symbols(self) -> frozenset[str]:
        return frozenset(s for mono, _ in self.terms for s, _ in mono)

    def value(self, sizes: dict[str, float]) -> float | None:
        """The number for these sizes, or None if a size the formula uses is not given."""
        if not self.symbols <= set(sizes):
            return None
        return float(
            sum(c * math.prod(Fraction(sizes[s]) ** e for s, e in mono) for mono, c in self.terms)
        )

    def __str__(self) -> str:
        if not self.terms:
            return "0"
        out = ""
        for i, (mono, c) in enumerate(self.terms):
            text = _term_text(mono, abs(c))
            out += (
                (("-" if c < 0 else "") + text) if i == 0 else ((" - " if c < 0 else " + ") + text)
            )
        return out


def _mono_order(mono: Monomial) -> tuple:
    return (-sum(e for _, e in mono), [(s, -e) for s, e in mono])


def _term_text(mono: Monomial, c: Fraction) -> str:
    def power(s: str, e: int) -> str:
        return s if e == 1 else f"{s}^{e}"

    num = [power(s, e) for s, e in mono if e > 0]
    den = [power(s, -e) for s, e in mono if e < 0]
    if c.numerator != 1 or not num:
        num.insert(0, str(c.numerator))
    if c.denominator != 1:
        den.insert(0, str(c.denominator))
    text = "*".join(num)
    if den:
        text += "/" + (den[0] if len(den) == 1 else "(" + "*".join(den) + ")")
    return text


@dataclass(frozen=True)
class FormCost:
    """FLOPs and bytes moved per token and head of one form (a multiply-add is 2 FLOPs)."""

    flops: Formula
    bytes: Formula

    def __add__(self, other: FormCost) -> FormCost:
        return FormCost(self.flops + other.flops, self.bytes + other.bytes)


@dataclass(frozen=True)
class GroupCost:
    states: tuple[str, ...]
    cls: str
    recurrent: FormCost
    chunked: FormCost | None  # None: no chunked form
    quadratic: FormCost | None  # None: no quadratic form
    note: str


@dataclass(frozen=True)
class Costs:
    chunk: str  # the chunk-size symbol (C, unless the spec uses C as a size)
    seq: str  # the sequence-length symbol (T, unless the spec uses T as a size)
    io: Formula  # bytes of per-token inputs read and outputs written
    groups: tuple[GroupCost, ...]
    recurrent: FormCost
    chunked: FormCost | None
    quadratic: FormCost | None

    @property
    def symbols(self) -> tuple[str, ...]:
        forms = [self.recurrent, self.chunked, self.quadratic]
        forms += [f for g in self.groups for f in (g.recurrent, g.chunked, g.quadratic)]
        used = set(self.io.symbols)
        for f in forms:
            if f is not None:
                used |= f.flops.symbols | f.bytes.symbols
        return tuple(sorted(used))


def _family(cls: str) -> str | None:
    if cls in ("identity", "scalar constant", "scalar data-dependent"):
        return "scalar"
    if cls in ("diagonal key-side", "diagonal value-side", "elementwise gate"):
        return "diagonal"
    if cls in ("identity minus rank-1", "scalar decay times identity minus rank-1"):
        return "delta"
    return None


def _numel(shape: tuple[str, ...]) -> Formula:
    out = Formula.const(1)
    for d in shape:
        out = out * Formula.size(d)
    return out


def costs(facts: Facts) -> Costs:
    """Per-token, per-head cost of the recurrent, chunked and quadratic forms, as formulas in the
    spec's sizes, the chunk size C and the sequence length T. A pure function of the facts.

    Conventions: a multiply-add is 2 FLOPs, an elementwise op (exp included) 1; a matrix product
    (m x n)(n x p) is 2 m n p. Per state group, d_k is the key size, d_v the summed value widths
    (a vector state adds 1), r the write rank, n_q the number of distinct readout queries, and
    d_g the gated size (d_k for a key-side gate, d_v value-side, both for an outer product).
    Lower-order FLOPs (O(d) or O(1) per token, such as cumulative sums of gates) are dropped.

    FLOPs per token:

    - Recurrent (ALGORITHMS.md "Cost": O(d_k d_v) per token): decay d_k d_v (2 d_k d_v for an
      outer-product gate, none for the identity), write 2 r d_k d_v, readout 2 n_q d_k d_v; the
      delta rule's erase S^T k and rank-1 update add 4 d_k d_v. A transition in no class (general
      dense, full gate, not affine) is not modelled: its count is a lower bound.
    - Chunked, scalar decay: n_q (2 C r (d_k + d_v) + (2 or 1) C r) for Q K^T, the decay mask
      and P V inside the chunk, 2 n_q d_k d_v for Q S_0, 2 r d_k d_v for K^T V, d_k d_v / C to
      decay the state once per chunk: O(C (d_k + d_v) + d_k d_v), as ALGORITHMS.md states.
    - Chunked, diagonal gate (sub-chunks of c = 16): the same matmuls, plus C d_g / 16 to rescale
      keys between sub-chunks and 5 c d_g for the diagonal blocks done elementwise in log space.
    - Chunked, delta rule (UT transform): K K^T 2 C d_k, the unit-triangular solve C^2 / 3
      (C^3 / 3 per chunk), W = T K 2 C d_k, U = T V 2 C d_v, W S_0 and K^T V_new 4 d_k d_v, the
      mask (C, or 2 C with decays), plus n_q (2 C d_k + 2 C d_v + 2 d_k d_v) for the output.
    - Quadratic (one masked T x T product, from a zero state): the chunked intra-chunk terms
      with C = T and no state terms: O(T d) per token, O(T^2 d) in all. A diagonal gate needs
      its decay per channel and pair (5 T d_g instead of the matmul's 2 T d_g); the delta rule is
      its chunked form with one chunk of T tokens (T^2 / 3 for the solve).

    Bytes per token (forward only, inputs and outputs in 2 bytes, states and intermediates in
    fp32): every form reads the per-token inputs and writes the outputs once (`io`). The
    recurrent form reads and writes the state every token (8 d_k d_v; a fused kernel that keeps
    the state on chip would not); the chunked form once per chunk (8 d_k d_v / C) plus its
    C x C intermediates (scores, decay mask; A and T for the delta rule; per-channel decay
    factors for a diagonal gate); the quadratic form its T x T matrices (per channel for a
    diagonal gate).
    """
    mixer = facts.mixer
    dims = {d for decl in (*mixer.inputs, *mixer.params, *mixer.states) for d in decl.shape}
    chunk = "C" if "C" not in dims else "C_chunk"
    seq = "T" if "T" not in dims else "T_seq"
    C, T = Formula.size(chunk), Formula.size(seq)
    io = Formula()
    for d in mixer.inputs:
        io = io + IO_BYTES * _numel(d.shape)
    for o in facts.outputs:
        io = io + IO_BYTES * _numel(tuple(x for x in o.shape if x != "1"))
    groups = []
    for group in facts.groups:
        groups.append(_group_cost(facts, group, C, T))
    recurrent = FormCost(Formula(), io)
    chunked: FormCost | None = FormCost(Formula(), io)
    quadratic: FormCost | None = FormCost(Formula(), io)
    for g in groups:
        recurrent = recurrent + g.recurrent
        chunked = chunked + g.chunked if chunked is not None and g.chunked is not None else None
        quadratic = (
            quadratic + g.quadratic if quadratic is not None and g.quadratic is not None else None
        )
    if not groups:
        chunked = quadratic = None
    return Costs(chunk, seq, io, tuple(groups), recurrent, chunked, quadratic)


def _group_cost(facts: Facts, group: tuple[str, ...], C: Formula, T: Formula) -> GroupCost:
    states = [facts.state(n) for n in group]
    lead = states[0]
    tr = lead.transition
    dk = Formula.size(lead.shape[0] if lead.vector else lead.shape[1])
    dv = Formula()
    for s in states:
        dv = dv + (Formula.const(1) if s.vector else Formula.size(s.shape[0]))
    r = max(1, lead.rank)
    queries = {str(rd.query) for o in facts.outputs for rd in o.readouts if rd.state in group}
    nq = len(queries)  # 0 for a state no output reads
    family = _family(tr.cls)
    gated = tr.cls not in ("identity", "identity minus rank-1")
    sides = {g.side for g in tr.gates}
    dg = Formula()
    if "key" in sides:
        dg = dg + dk
    if "value" in sides:
        dg = dg + dv
    kv = dk * dv
    state_bytes = 2 * ACC_BYTES * kv

    # recurrent
    decay = kv * (2 if {"key", "value"} <= sides else 1) if gated else Formula()
    if family == "delta":
        flops = decay + 4 * kv + 2 * nq * kv
    else:
        flops = decay + 2 * r * kv + 2 * nq * kv
    recurrent = FormCost(flops, state_bytes)
    note = ""
    if family is None:
        note = "recurrent only; the transition itself is not modelled (no class), so its count is a lower bound"
        return GroupCost(group, tr.cls, recurrent, None, None, note)
    if not tr.chunkable:
        note = "recurrent only: " + (tr.reason or "")
        return GroupCost(group, tr.cls, recurrent, None, None, note)

    mask = 2 if gated else 1
    if family == "scalar":
        intra = nq * (2 * r * C * (dk + dv) + mask * r * C)
        chunked = FormCost(
            intra + 2 * nq * kv + 2 * r * kv + (kv / C if gated else Formula()),
            state_bytes / C + ACC_BYTES * mask * nq * C,
        )
        quadratic = FormCost(
            nq * (2 * r * T * (dk + dv) + mask * r * T),
            ACC_BYTES * mask * nq * T,
        )
        note = "scalar decay: masks exp(b_i - b_j) as running products of per-token decays"
    elif family == "diagonal":
        # aligned blocks of 2, 4, ..., C tokens: each query-key pair of a chunk once (a corner
        # matmul per block), C (C + 1) / 2 products of d_k per chunk; the values once per block
        # with value-side gates, else in one C x C product
        values = (C + 1) * dv if "value" in sides else 2 * C * dv
        intra = nq * ((C + 1) * dk + values)
        chunked = FormCost(
            intra + 2 * nq * kv + 2 * kv + kv / C,
            state_bytes / C + ACC_BYTES * nq * C + 2 * ACC_BYTES * dg,
        )
        quadratic = FormCost(
            nq * (2 * T * (dk + dv) + 3 * T * dg),
            ACC_BYTES * nq * T * dg,
        )
        note = (
            "diagonal gate: aligned blocks of 2, 4, ..., C tokens, decays measured from each "
            "block's middle; their elementwise products (about 3 d_g per token at each of the "
            "log2(C) levels) are not counted; the quadratic form needs a decay per channel and pair"
        )
    else:
        solve = C * C / 3
        flops = (
            4 * C * dk + 2 * C * dv + solve + mask * C + 4 * kv + nq * (2 * C * (dk + dv) + 2 * kv)
        )
        if gated:
            flops = flops + kv / C
        chunked = FormCost(flops, state_bytes / C + 4 * ACC_BYTES * C + ACC_BYTES * (dk + 2 * dv))
        no_state = 4 * T * dk + 2 * T * dv + T * T / 3 + mask * T + nq * 2 * T * (dk + dv)
        quadratic = FormCost(no_state, 4 * ACC_BYTES * T + ACC_BYTES * (dk + 2 * dv))
        note = "delta rule: UT transform; the triangular solve is C^3/3 per chunk; quadratic = one chunk of T"
    return GroupCost(group, tr.cls, recurrent, chunked, quadratic, note)
