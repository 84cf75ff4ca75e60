"""Analyses: pure functions from a verified spec to immutable facts.

`analyze(spec)` finds, for every state, whether its update is affine in the state's previous
value, which transition class it belongs to (by a first-match rule table), its write term and
log-space gates; for every output, its readouts; and the plan a backend needs. `mixc explain`
prints these facts and the backends consume them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import networkx as nx

from ._algebra import Expander, NotAffine, Term, inline, num_expr, product, sum_expr, transpose_atom
from ._frontend import Spec
from ._verify import SCALAR, Shape, show, typer_for
from .errors import NotYetImplemented, SpecAnalysisError, SpecError, Span
from .ir import Binary, Call, Expr, Mixer, Name, Neg, Number, Timed, Transpose, walk

__all__ = [
    "CLASSES",
    "RULES",
    "Facts",
    "LogGate",
    "OutputFacts",
    "Readout",
    "StateFacts",
    "Transition",
    "WriteTerm",
    "analyze",
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


class Warning_(SpecError):
    kind = "warning"


# ----------------------------------------------------------------------------- facts


@dataclass(frozen=True)
class LogGate:
    """One decay factor and its logarithm in a numerically safe form."""

    side: str  # "scalar" | "key" | "value"
    decay: Expr  # as written (for a vector gate: the vector of decays)
    log: Expr  # log of the decay, safe to evaluate (logsigmoid(a), dt A, log(gamma))
    proven: bool  # provably in (0, 1]
    note: str


@dataclass(frozen=True)
class Transition:
    cls: str
    rule: str
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

    @property
    def vector(self) -> bool:
        return self.shape[1] == "1"


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
            return (f(lo) if lo > -inf else (0.0 if e.func != "tanh" else -1.0)), (f(hi) if hi < inf else (1.0 if e.func in ("sigmoid", "tanh") else inf))
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
        if e.op in ("*", "@") and not any(math.isinf(x) for x in (a, b, c, d)):
            ps = [a * c, a * d, b * c, b * d]
            return min(ps), max(ps)
        if e.op in ("*", "@"):
            if a >= 0 and c >= 0:
                return 0.0, inf
            if (a >= 0 and d <= 0) or (b <= 0 and c >= 0):
                return -inf, 0.0
            return -inf, inf
        if e.op == "^" and a > 0:
            vals = [x**y for x in (a, b) for y in (c, d) if not (math.isinf(x) and y == 0)]
            try:
                return min(vals), max(vals)
            except (OverflowError, ValueError):
                return 0.0, inf
        if e.op == "/" and c > 0 and a >= 0:
            return 0.0, inf if c == 0 or math.isinf(b) else b / c
    return -inf, inf


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


def log_gate(decay: Expr, side: str, params: dict[str, Expr]) -> LogGate:
    """The log of one decay factor, in a form that never computes log(sigmoid(.))."""
    inner = decay.operand if isinstance(decay, Transpose) else decay
    if isinstance(inner, Call) and inner.func == "diag":
        inner = inner.args[0]
        inner = inner.operand if isinstance(inner, Transpose) else inner
    if isinstance(inner, Call) and inner.func == "sigmoid":
        return LogGate(side, decay, Call("logsigmoid", inner.args), True, "sigmoid(x) is in (0, 1)")
    if isinstance(inner, Call) and inner.func == "exp":
        arg = inner.args[0]
        proven = _nonpositive(arg, params)
        note = f"{arg} <= 0 always" if proven else f"in (0, 1] only if {arg} <= 0"
        return LogGate(side, decay, arg, proven, note)
    if isinstance(inner, Binary) and inner.op == "/" and isinstance(inner.left, Number) and inner.left.text == "1":
        sub = log_gate(inner.right, side, params)
        lo = _bounds(_with_defaults(inner.right, params))[0]
        return LogGate(side, decay, Neg(sub.log), lo >= 1, f"1/x with x >= 1 {'always' if lo >= 1 else 'not proven'}")
    if isinstance(inner, Number):
        v = float(inner.text)
        ok = 0 < v <= 1
        return LogGate(side, decay, Call("log", (inner,)), ok, "a constant in (0, 1]" if ok else f"constant {v} is not in (0, 1]")
    lo, hi = _bounds(_with_defaults(inner, params))
    ok = lo > 0 and hi <= 1
    note = f"in [{lo:.6g}, {hi:.6g}] for every head" if ok else "not provably in (0, 1]"
    return LogGate(side, decay, Call("log", (inner,)), ok, note)


def _scalar_gates(t: Term, params: dict[str, Expr]) -> list[LogGate]:
    gates = [log_gate(s, "scalar", params) for s in t.scalars]
    if t.coeff != 1:
        gates.append(log_gate(num_expr(t.coeff), "scalar", params))
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
    gates = tuple(_scalar_gates(t, ctx.params))
    data = any(isinstance(n, Timed) for s in t.scalars for n in walk(s))
    if data:
        return Transition("scalar data-dependent", "scalar_data: a per-token scalar times S_{t-1}", gates)
    return Transition("scalar constant", "scalar_constant: a per-head constant times S_{t-1}", gates)


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
    gates = list(_scalar_gates(t, ctx.params))
    gates += [log_gate(a, "value", ctx.params) for a in left]
    gates += [log_gate(a, "key", ctx.params) for a in right]
    full = None
    for g in t.gates:
        shape = ex.shape(g)
        if shape[0] == "1" or shape[1] == "1":
            side = "key" if shape[0] == "1" else "value"
            gates.append(log_gate(g, side, ctx.params))
            continue
        outer = ex.expand(g)
        if len(outer) == 1 and len(outer[0].chain) == 2 and not outer[0].gates:
            u, w = outer[0].chain
            gates += _scalar_gates(outer[0], ctx.params)
            gates.append(log_gate(u, "value", ctx.params))
            gates.append(log_gate(w, "key", ctx.params))
        else:
            full = g
    if full is not None:
        return Transition(
            "elementwise gate", "full_elementwise_gate: G_t ⊙ S_{t-1}, G_t a full matrix",
            tuple(gates), gate=full,
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
            return Transition("diagonal key-side", "diagonal_key: diag(a_t) s_{t-1} (a vector state)", tuple(gates))
        return Transition("diagonal value-side", "diagonal_value: diag(a_t) S_{t-1}", tuple(gates))
    return Transition("elementwise gate", "outer_product_gate: (a_t b_t^T) ⊙ S_{t-1}", tuple(gates))


def _rule_delta(terms, ctx):
    if len(terms) != 2 or any(t.gates for t, _ in terms):
        return None
    ex = ctx.expander
    for (t0, at0), (t1, at1) in (terms, terms[::-1]):
        l0, r0 = _split(t0, at0)
        l1, r1 = _split(t1, at1)
        if l0 or r0 or l1 or len(r1) != 2:
            continue
        k, kt = r1
        if str(transpose_atom(k, ex.shape(k))) != str(kt) or ex.shape(k)[1] != "1":
            continue
        rest = list(t1.scalars)
        for s in t0.scalars:
            if str(s) not in map(str, rest):
                break
            rest.pop([str(x) for x in rest].index(str(s)))
        else:
            ratio = -(t1.coeff / t0.coeff)
            if ratio <= 0 and not rest:
                continue
            beta_factors = ([num_expr(ratio)] if ratio != 1 else []) + rest
            beta = product(beta_factors) or Number("1")
            if ratio < 0:
                beta = Neg(product(rest) or Number("1")) if ratio == -1 else beta
            decay = _scalar_gates(t0, ctx.params)
            if decay:
                return Transition(
                    "scalar decay times identity minus rank-1",
                    "gated_delta: a_t S_{t-1} (I - beta_t k_t k_t^T)", tuple(decay), beta=beta, key=k,
                )
            return Transition(
                "identity minus rank-1", "delta: S_{t-1} (I - beta_t k_t k_t^T)", beta=beta, key=k
            )
    return None


def _rule_dense(terms, ctx):
    return Transition(
        "general dense", "general_dense: any other linear map of S_{t-1}",
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
    from dataclasses import replace

    return replace(
        t,
        chain=tuple(transpose_atom(a, ex.shape(a)) for a in reversed(t.chain)),
        gates=tuple(transpose_atom(g, ex.shape(g)) for g in t.gates),
    )


def _analyze_state(mixer: Mixer, name: str, ex: Expander, params) -> StateFacts:
    decl = mixer.state(name)
    eq = mixer.update(name)
    shape = ex.typer.symbols[name].shape
    body = inline(mixer, eq.value)
    others = {s.name for s in mixer.states} - {name}
    try:
        terms = ex.expand(body)
    except NotAffine as exc:
        reason = f"not affine: {exc.why} ({exc.node})"
        return StateFacts(
            name, shape, False,
            Transition("not affine", "not_affine", reason=reason, span=exc.node.span),
            (), "unknown", decl.span,
        )
    if shape[1] == "1":
        terms = [_row_form(t, ex) for t in terms]
    transition_terms, writes, coupled = [], [], None
    for t in terms:
        where = _state_position(t, name)
        touches_other = [a for a in t.chain + t.scalars + t.gates if any(isinstance(n, Timed) and n.name in others for n in walk(a))]
        if touches_other:
            coupled = touches_other[0]
        if len(where) > 1:
            return StateFacts(
                name, shape, False,
                Transition("not affine", "not_affine", reason=f"not affine: {name} appears twice in one product", span=eq.span),
                (), "unknown", decl.span,
            )
        if where:
            transition_terms.append((t, where[0]))
        else:
            writes.append(t)
    if coupled is not None:
        transition = Transition(
            "general dense", "coupled_states",
            reason=f"NYI: the update of {name} reads another state ({coupled}); coupled states run step by step",
            span=coupled.span,
        )
    elif not transition_terms:
        transition = Transition("general dense", "no_recurrence", reason=f"NYI: {name}_t does not depend on {name}_{{t-1}}; write it as a per-token value instead", span=eq.span)
    else:
        ctx = RuleContext(name, shape, ex, params, eq.span)
        transition = next(tr for _, rule in RULES if (tr := rule(transition_terms, ctx)) is not None)
        transition = Transition(**{**transition.__dict__, "span": eq.value.span})
    write_terms, form = _writes(writes, shape, ex)
    if form != "rank-1 outer products" and transition.reason is None:
        transition = Transition(**{**transition.__dict__, "reason": f"NYI: the write term is {form}; chunked forms need a sum of rank-1 outer products v_t k_t^T"})
    return StateFacts(name, shape, True, transition, write_terms, form, decl.span)


def _writes(terms: list[Term], shape: Shape, ex: Expander) -> tuple[tuple[WriteTerm, ...], str]:
    out = []
    for t in terms:
        if t.gates:
            return (), "an elementwise product"
        coeff = [num_expr(t.coeff)] if t.coeff != 1 else []
        scale = product(coeff + list(t.scalars))
        if len(t.chain) == 1 and shape[1] == "1":
            out.append(WriteTerm(None, transpose_atom(t.chain[0], ex.shape(t.chain[0])), scale))
        elif len(t.chain) == 2 and ex.shape(t.chain[0])[1] == "1" and ex.shape(t.chain[1])[0] == "1":
            out.append(WriteTerm(t.chain[0], transpose_atom(t.chain[1], ex.shape(t.chain[1])), scale))
        else:
            return (), f"not an outer product ({show(shape)} from {product(list(t.chain))})"
    if not out:
        return (), "empty (no write)"
    return tuple(out), "rank-1 outer products"


# ----------------------------------------------------------------------------- outputs


def _analyze_output(mixer: Mixer, eq, ex: Expander, shape: Shape) -> OutputFacts:
    states = {s.name for s in mixer.states}
    readouts: list[Readout] = []

    def read(e: Expr) -> Expr:
        if not ex.has_state(e):
            return e
        try:
            terms = ex.expand(e)
        except NotAffine:
            terms = None
        if terms is not None and all(_readout_term(t, states, ex) is not None or not _touches(t, ex) for t in terms):
            pieces: list[Expr] = []
            skips = [t for t in terms if not _touches(t, ex)]
            for t in terms:
                if not _touches(t, ex):
                    continue
                state, query, scale = _readout_term(t, states, ex)
                r = _intern(readouts, state, query, scale)
                pieces.append(r if scale is None else Binary("*", scale, r))
            out = pieces[0]
            for p in pieces[1:]:
                out = Binary("+", out, p)
            if skips:
                out = Binary("+", out, sum_expr(skips))
            return out
        if isinstance(e, Binary):
            return Binary(e.op, read(e.left), read(e.right), span=e.span)
        if isinstance(e, Neg):
            return Neg(read(e.operand), span=e.span)
        if isinstance(e, Call):
            return Call(e.func, tuple(read(a) for a in e.args), span=e.span)
        raise NotYetImplemented(
            f"cannot read the state in {e} linearly", e.span,
            hint="outputs read states as S_t x (a matrix state times a vector) or s_t . x",
        )

    body = inline(mixer, eq.value)
    expr = read(body)
    skip = None
    if not readouts:
        form = "no state"
    elif isinstance(expr, Binary) and expr.op == "/" and _has_readout(expr.left) and _has_readout(expr.right):
        form = "ratio"
    elif isinstance(expr, Name) or (isinstance(expr, Binary) and expr.op == "*" and isinstance(expr.right, Name)):
        form = "linear"
    elif isinstance(expr, Binary) and expr.op == "+" and not _has_readout(expr.right) and _linear_only(expr.left):
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
    coeff = [num_expr(t.coeff)] if t.coeff != 1 else []
    return node.name, query, product(coeff + list(t.scalars))


def _intern(readouts: list[Readout], state: str, query: Expr, scale) -> Name:
    for r in readouts:
        if r.state == state and str(r.query) == str(query):
            return Name(f"_r{r.index}")
    readouts.append(Readout(len(readouts), state, query, None))
    return Name(f"_r{len(readouts) - 1}")


def _has_readout(e: Expr) -> bool:
    return any(isinstance(n, Name) and n.name.startswith("_r") for n in walk(e))


def _linear_only(e: Expr) -> bool:
    if isinstance(e, Name):
        return True
    if isinstance(e, Binary) and e.op == "+":
        return _linear_only(e.left) and _linear_only(e.right)
    if isinstance(e, Binary) and e.op == "*":
        return not _has_readout(e.left) and isinstance(e.right, Name)
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
            key = (tr.cls, tuple((g.side, str(g.log)) for g in tr.gates), str(tr.beta), str(tr.key), str(s.writes[0].key))
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
    params = {p.name: p.default for p in mixer.params}
    states = tuple(_analyze_state(mixer, s.name, ex, params) for s in mixer.states)
    outputs = tuple(_analyze_output(mixer, eq, ex, spec.shapes[eq.target]) for eq in mixer.outputs)
    warnings = []
    for s in states:
        for g in s.transition.gates:
            if not g.proven:
                warnings.append(Warning_(
                    f"cannot prove the decay {g.decay} of {s.name} is in (0, 1] ({g.note})",
                    g.decay.span or s.transition.span, spec.source,
                    hint="if it can exceed 1 the state grows without bound; parametrise it as "
                    "exp(-softplus(x)), sigmoid(x), or exp(dt A) with A = -exp(A_log)",
                ))
        read_by_output = any(nx.has_path(graph, s.name, o.name) for o in outputs)
        if not read_by_output:
            warnings.append(Warning_(
                f"state {s.name} is never read by an output", s.span, spec.source,
                hint=f"read it in an output (y_t = {s.name}_t q_t) or delete it",
            ))
    reasons = [f"{s.name}: {s.transition.reason}" for s in states if s.transition.reason]
    if not states:
        reasons.append("the mixer has no state")
    classes = sorted({CLASSES[s.transition.cls] for s in states})
    algorithm = "; ".join(classes) if not reasons else "recurrent only"
    return Facts(
        spec, graph, order, states, outputs, _groups(states), algorithm,
        "; ".join(reasons) or None, tuple(warnings),
    )

