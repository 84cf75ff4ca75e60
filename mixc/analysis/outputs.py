"""Per-output analysis: the readouts `S_t q` of each state and what the output does with them."""

from __future__ import annotations

from mixc.algebra.canon import Canon, signed
from mixc.algebra.expand import Expander, NotAffine, Term, inline, product
from mixc.analysis.facts import OutputFacts, Readout
from mixc.errors import NotYetImplemented, SpecShapeError
from mixc.frontend.ir import Binary, Call, Expr, Mixer, Name, Neg, Number, Timed, Transpose, walk
from mixc.frontend.limits import SpecSizeError
from mixc.frontend.shapes import Shape

__all__ = ["analyze_output", "has_readout", "readout_name"]


_PREFIX = "_r"


def readout_name(index: int) -> str:
    """The name a readout takes in an output's expression (a value the backends compute)."""
    return f"{_PREFIX}{index}"


def analyze_output(mixer: Mixer, eq, ex: Expander, shape: Shape, canon: Canon) -> OutputFacts:
    """The readouts of one output and what it does with them. An expression the analysis builds
    that grows too large is reported at the output."""
    try:
        return _analyze_output(mixer, eq, ex, shape, canon)
    except SpecSizeError as exc:
        raise exc.at(eq.value.span) from None


def _analyze_output(mixer: Mixer, eq, ex: Expander, shape: Shape, canon: Canon) -> OutputFacts:
    states = {s.name for s in mixer.states}
    readouts: list[Readout] = []

    def read(e: Expr) -> Expr:
        """`e` with every linear read of a state replaced by its readout's name."""
        if not ex.has_state(e):
            return canon(e)
        linear = _linear_reads(e, states, ex, canon, readouts)
        if linear is not None:
            return linear
        if isinstance(e, Binary):
            return Binary(e.op, read(e.left), read(e.right), span=e.span)
        if isinstance(e, Neg):
            return Neg(read(e.operand), span=e.span)
        if isinstance(e, Call):
            return Call(e.func, tuple(read(a) for a in e.args), span=e.span)
        raise NotYetImplemented(
            f"cannot read the state in {e} linearly",
            e.span,
            hint="outputs read states as S_t x (a matrix state times a vector), s_t . x, or a "
            "vector state s_t itself (a_t * s_t)",
        )

    expr = read(inline(mixer, eq.value))
    form, skip = _output_form(expr, readouts)
    return OutputFacts(eq.target, shape, form, expr, tuple(readouts), skip)


def _linear_reads(
    e: Expr, states: set[str], ex: Expander, canon: Canon, readouts: list[Readout]
) -> Expr | None:
    """`e` as a sum of readouts, each times its term's coefficient, scalars and gates, plus the
    terms that read no state; None unless every term of `e` that reads a state reads one state
    linearly. The readouts it names are added to `readouts` (once each)."""
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
            name = _intern(readouts, state, offset, canon(query), entrywise)
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
        and first.offset == 0
        and ex.shape(first)[1] == "1"
        and not any(ex.has_state(a) for a in t.scalars + t.gates)
    ):
        scale = [signed(t.coeff)] if t.coeff != 1 else []
        return first.name, 0, Number("1"), product(scale + list(t.scalars)), True
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


def _intern(readouts: list[Readout], state: str, offset: int, query: Expr, entrywise: bool) -> Name:
    for r in readouts:
        same = (r.state, r.offset, str(r.query), r.entrywise) == (
            state,
            offset,
            str(query),
            entrywise,
        )
        if same:
            return Name(readout_name(r.index))
    readouts.append(Readout(len(readouts), state, query, None, offset, entrywise))
    return Name(readout_name(len(readouts) - 1))


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
