"""Per-output analysis: the readouts `S_t q` of each state and what the output does with them."""

from __future__ import annotations

import re

from mixc.algebra.canon import Canon, signed
from mixc.algebra.expand import Expander, NotAffine, Term, inline, product
from mixc.analysis.facts import OutputFacts, Readout
from mixc.errors import NotYetImplemented, SpecShapeError
from mixc.frontend.ir import Binary, Call, Expr, Mixer, Name, Neg, Number, Timed, Transpose, walk
from mixc.frontend.limits import SpecSizeError
from mixc.frontend.shapes import SCALAR, Shape, Symbol, Typer

__all__ = [
    "ReadoutTable",
    "analyze_output",
    "has_readout",
    "lift",
    "readout_name",
    "reads_of",
]


_PREFIX = "_r"


def readout_name(index: int) -> str:
    """The name a readout takes in an output's expression (a value the backends compute)."""
    return f"{_PREFIX}{index}"


#: A readout's name in a query's text (`exp(_r0)`).
_NAMED = re.compile(rf"(?<![\w]){_PREFIX}(\d+)(?!\w)")

#: What a readout is, whatever its number: (the state's place among the spec's states, offset,
#: entrywise, the query's text with the readouts it reads written out as theirs).
Key = tuple[int, int, bool, str]


class ReadoutTable:
    """Every readout of a spec, each name typed in the plan's Typer as it is made, so that a
    later expression can read it (`p_t = exp(Ks_t q_t)` in the query of `Vs_t p_t`).

    Readouts are numbered in the order they are first found (the states' updates first, then
    the output) unless `numbers` gives them by key: the plan, once its first analysis
    has found every readout, analyses again with `canonical()` when the order found is not
    that one, so that equal specs whose terms are written in another order (`Th_t` read before
    `Th_{t-1}` or after) give the same numbers. The canonical order follows the states as
    declared, then the offset, then the query's text."""

    def __init__(self, typer: Typer, numbers: dict[Key, int] | None = None) -> None:
        self.typer = typer
        self.numbers = numbers or {}
        self.items: list[Readout] = []  # by number
        self._keys: dict[Key, int] = {}  # key -> number
        self._texts: dict[int, str] = {}  # number -> key as text, for the queries that read it
        self._places = {s.name: i for i, s in enumerate(typer.mixer.states)}

    def intern(self, state: str, offset: int, query: Expr, entrywise: bool, span) -> Name:
        inner = _NAMED.sub(lambda m: self._texts.get(int(m.group(1)), m.group(0)), str(query))
        key = (self._places[state], offset, entrywise, inner)
        if key in self._keys:
            return Name(readout_name(self._keys[key]))
        # a readout the first analysis did not find (none should) takes a number past them all
        index = self.numbers.get(key, len(self.numbers) + len(self.items))
        self._keys[key] = index
        self._texts[index] = f"{state}[{offset}{', entrywise' if entrywise else ''}]({inner})"
        self.items.append(Readout(index, state, query, None, offset, entrywise, span=span))
        self.items.sort(key=lambda r: r.index)
        shape = self.typer.symbols[state].shape
        self.typer.symbols[readout_name(index)] = Symbol(
            "readout", SCALAR if shape[1] == "1" and not entrywise else (shape[0], "1")
        )
        return Name(readout_name(index))

    def canonical(self) -> dict[Key, int] | None:
        """The readouts' numbers in canonical order, by key: the least key first among those
        whose queries read only readouts numbered already (so a query reads lower numbers, as
        when found). None when they are numbered so already."""
        keys = {i: k for k, i in self._keys.items()}
        reads = {r.index: {int(n) for n in _NAMED.findall(str(r.query))} for r in self.items}
        order: dict[Key, int] = {}
        placed: set[int] = set()
        while len(order) < len(keys):
            i = min((i for i in keys if i not in placed and reads[i] <= placed), key=keys.get)
            order[keys[i]] = len(order)
            placed.add(i)
        return None if all(order[k] == i for i, k in keys.items()) else order


def analyze_output(
    mixer: Mixer, eq, ex: Expander, shape: Shape, canon: Canon, table: ReadoutTable
) -> OutputFacts:
    """The readouts of one output and what it does with them. An expression the analysis builds
    that grows too large is reported at the output."""
    try:
        return _analyze_output(mixer, eq, ex, shape, canon, table)
    except SpecSizeError as exc:
        raise exc.at(eq.value.span) from None


def _analyze_output(
    mixer: Mixer, eq, ex: Expander, shape: Shape, canon: Canon, table: ReadoutTable
) -> OutputFacts:
    states = {s.name for s in mixer.states}
    expr = lift(inline(mixer, eq.value), states, ex, canon, table, canon)
    if ex.has_state(expr):
        _unreadable(expr, ex)
    used = {n.name for n in walk(expr) if isinstance(n, Name)}
    read = _reads_of(used, table)
    form, skip = _output_form(expr, read)
    return OutputFacts(eq.target, shape, form, expr, tuple(read), skip)


def _reads_of(names: set[str], table: ReadoutTable) -> list[Readout]:
    """The readouts named in `names`, and those their queries read, in the order found."""
    found: set[int] = set()
    todo = [r for r in table.items if readout_name(r.index) in names]
    while todo:
        r = todo.pop()
        if r.index not in found:
            found.add(r.index)
            inner = {n.name for n in walk(r.query) if isinstance(n, Name)}
            todo += [x for x in table.items if readout_name(x.index) in inner]
    return [r for r in table.items if r.index in found]


def reads_of(e: Expr, table: ReadoutTable) -> tuple[Readout, ...]:
    """The readouts `e` reads, directly or through their queries."""
    return tuple(_reads_of({n.name for n in walk(e) if isinstance(n, Name)}, table))


def lift(
    e: Expr, readable: set[str], ex: Expander, canon: Canon, table: ReadoutTable, tidy=None
) -> Expr:
    """`e` with every read of a state in `readable` that is a readout (`S_t q`, `S_{t-1} q`,
    `s_t . q`, a vector state itself) replaced by its readout's name, innermost first, so that
    a function of one readout can be the query of another (`Vs_t exp(Ks_t q_t)`); a read that
    is no readout (a bare matrix state) is left as it is. `tidy` rewrites the parts that read
    no state (the output's are made canonical)."""
    if not _reads(e, readable):
        return tidy(e) if tidy is not None and not ex.has_state(e) else e
    others = not _reads(e, ex.states - readable)
    if others:
        linear = _linear_reads(e, readable, ex, canon, table)
        if linear is not None:
            return linear

    def again(x: Expr) -> Expr:
        return lift(x, readable, ex, canon, table, tidy)

    if isinstance(e, Binary):
        new = Binary(e.op, again(e.left), again(e.right), span=e.span)
        if others and new != e and _reads(new, readable):
            linear = _linear_reads(new, readable, ex, canon, table)
            if linear is not None:
                return linear
        return new
    if isinstance(e, Neg):
        return Neg(again(e.operand), span=e.span)
    if isinstance(e, Transpose):
        return Transpose(again(e.operand), span=e.span)
    if isinstance(e, Call):
        return Call(e.func, tuple(again(a) for a in e.args), span=e.span)
    return e


def _reads(e: Expr, states) -> bool:
    return any(isinstance(n, Timed) and n.name in states for n in walk(e))


def _unreadable(e: Expr, ex: Expander) -> None:
    """Raise NYI at the innermost part of `e` that reads a state other than by a readout."""
    for child in _children(e):
        if ex.has_state(child):
            _unreadable(child, ex)
    raise NotYetImplemented(
        f"cannot read the state in {e} linearly",
        e.span,
        hint="outputs read states as S_t x (a matrix state times a vector), s_t . x, or a "
        "vector state s_t itself (a_t * s_t), or functions of such reads",
    )


def _children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Binary):
        return (e.left, e.right)
    if isinstance(e, Neg | Transpose):
        return (e.operand,)
    if isinstance(e, Call):
        return e.args
    return ()


def _linear_reads(
    e: Expr, states: set[str], ex: Expander, canon: Canon, table: ReadoutTable
) -> Expr | None:
    """`e` as a sum of readouts, each times its term's coefficient, scalars and gates, plus the
    terms that read no state; None unless every term of `e` that reads a state reads one state
    linearly. The readouts it names are added to `table` (once each)."""
    try:
        terms = canon.combine(ex.expand(e))
    except NotAffine:
        return None
    if not all(_readout_term(t, states, ex) is not None or not _touches(t, ex) for t in terms):
        return None
    pieces: list[Expr] = []
    skips = [t for t in terms if not _touches(t, ex)]
    reads = []
    for t in terms:
        if _touches(t, ex):
            state, offset, query, scale, entrywise = _readout_term(t, states, ex)
            name = table.intern(state, offset, canon(query), entrywise, e.span)
            reads.append((name, scale, t))
    for r, _, t in sorted(reads, key=lambda x: x[0].name):
        factors = [canon.terms([Term(coeff=t.coeff, scalars=t.scalars)])]
        if not (t.coeff != 1 or t.scalars):
            factors = []
        factors += [canon(g) for g in t.gates]  # an entrywise read's vector factors
        pieces.append(r if not factors else Binary("*", product_of(factors), r))
    out = pieces[0]
    for p in pieces[1:]:
        out = Binary("+", out, p)
    if skips:
        out = Binary("+", out, canon.terms(skips))
    return out


def _output_form(expr: Expr, readouts: list[Readout]) -> tuple[str, Expr | None]:
    """What an output does with its readouts ("no state", "ratio", "linear", "linear + skip" or
    "function of readouts"), and its skip term where it is linear plus one."""
    if not readouts:
        return "no state", None
    if (
        isinstance(expr, Binary)
        and expr.op == "/"
        and has_readout(expr.left)
        and has_readout(expr.right)
    ):
        return "ratio", None
    if _linear_only(expr):
        return "linear", None
    if (
        isinstance(expr, Binary)
        and expr.op == "+"
        and not has_readout(expr.right)
        and _linear_only(expr.left)
    ):
        return "linear + skip", expr.right
    return "function of readouts", None


def _touches(t: Term, ex: Expander) -> bool:
    return any(ex.has_state(a) for a in t.chain + t.scalars + t.gates)


def _readout_term(t: Term, states: set[str], ex: Expander):
    """(state, offset, query, scale, entrywise) of a term that reads one state linearly (at t or
    t-1), else None: a
    matrix state times a vector, a vector state's dot product, or a vector state itself, maybe
    times vectors entry by entry (entrywise)."""
    if not t.chain:
        return None
    first, rest = t.chain[0], t.chain[1:]
    if (
        not rest
        and isinstance(first, Timed)
        and first.name in states
        and ex.shape(first)[1] == "1"
        and not any(ex.has_state(a) for a in t.scalars + t.gates)
    ):
        scale = [signed(t.coeff)] if t.coeff != 1 else []
        return first.name, first.offset, Number("1"), product(scale + list(t.scalars)), True
    if t.gates:
        return None
    vector_state = isinstance(first, Transpose) and isinstance(first.operand, Timed)
    node = first.operand if vector_state else first
    if not (isinstance(node, Timed) and node.name in states):
        return None
    if any(ex.has_state(a) for a in rest + t.scalars):
        return None
    state_shape = ex.shape(node)
    if vector_state != (state_shape[1] == "1"):
        return None
    query = product(list(rest))
    try:  # a scalar readout times a vector, (s_t . q) x, is the chain s^T q x: not one query
        if query is None or ex.shape(query)[1] != "1":
            return None
    except SpecShapeError:
        return None
    scale = [signed(t.coeff)] if t.coeff != 1 else []
    return node.name, node.offset, query, product(scale + list(t.scalars)), False


def product_of(factors: list[Expr]) -> Expr:
    """The elementwise product of the factors, left to right."""
    out = factors[0]
    for f in factors[1:]:
        out = Binary("*", out, f)
    return out


def has_readout(e: Expr) -> bool:
    return any(isinstance(n, Name) and n.name.startswith(_PREFIX) for n in walk(e))


def _linear_only(e: Expr) -> bool:
    if isinstance(e, Name):
        return e.name.startswith(_PREFIX)
    if isinstance(e, Binary) and e.op == "+":
        return _linear_only(e.left) and _linear_only(e.right)
    if isinstance(e, Binary) and e.op == "*":
        return not has_readout(e.left) and _linear_only(e.right) and isinstance(e.right, Name)
    return False


# ----------------------------------------------------------------------------- plan
