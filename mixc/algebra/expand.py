"""Algebraic normal form of expressions, for recognising structure however a spec writes it.

`expand` turns an expression into a sum of `Term`s: a numeric coefficient, commuting scalar
factors, an ordered chain of matrix/vector factors (at most one of them a state), and
elementwise gates applied to the whole chain. `gamma H`, `H gamma`, `H (I - b k k^T)` and
`H - b H k k^T` all reach the same terms. Transposes are pushed down to atoms; state-free sums
whose operands broadcast (elu(x) + 1) stay whole, as one atom.

Like terms are collected wherever terms are produced (each sum and each product), so that a
product of sums that collapses (`(I - b k k^T)` forty times has 41 distinct terms, not 2^40)
stays small. What does not collapse is bounded: a product may multiply out at most `MAX_TERMS`
terms, a sum keep at most `MAX_TERMS`, a term have at most `MAX_FACTORS` factors, and a
coefficient must stay within float64; past that the expansion raises `SpecSizeError` at the node
(`mixc.frontend.limits`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import TypeVar

from mixc.frontend.builtins import BUILTINS
from mixc.frontend.ir import (
    Binary,
    Call,
    Expr,
    Identity,
    LetFn,
    Mixer,
    Name,
    Neg,
    Number,
    Timed,
    Transpose,
    children,
)
from mixc.frontend.limits import MAX_FACTORS, MAX_TERMS, SpecSizeError, brief
from mixc.frontend.parser import MAX_DEPTH
from mixc.frontend.shapes import IDENTITY, SCALAR, Shape, Typer

T = TypeVar("T")

#: Built-ins that act on each entry alone: a transpose passes through them.
ELEMENTWISE = frozenset(name for name, builtin in BUILTINS.items() if builtin.elementwise)


class NotAffine(Exception):  # noqa: N818 - a signal inside the analysis, never shown
    """The expression is not affine in a state; `node` is the offending sub-expression."""

    def __init__(self, node: Expr, why: str) -> None:
        super().__init__(why)
        self.node = node
        self.why = why


@dataclass(frozen=True)
class Term:
    coeff: Fraction | float = 1
    scalars: tuple[Expr, ...] = ()  # sorted by text
    chain: tuple[Expr, ...] = ()  # ordered factors; a state appears as Timed(name, offset)
    gates: tuple[Expr, ...] = ()  # elementwise factors on the whole chain, sorted by text

    def key(self) -> tuple:
        return (
            tuple(map(str, self.scalars)),
            tuple(map(str, self.chain)),
            tuple(map(str, self.gates)),
        )

    def scale(self, coeff, scalars=()) -> Term:
        return replace(
            self, coeff=self.coeff * coeff, scalars=_sorted(self.scalars + tuple(scalars))
        )


def _sorted(exprs) -> tuple[Expr, ...]:
    return tuple(sorted(exprs, key=str))


def number(text: str) -> Fraction | float:
    try:
        return Fraction(text)
    except ValueError:
        return float(text)


def product(factors: list[Expr]) -> Expr | None:
    """The spec expression `f1 f2 ...` (None for an empty product)."""
    out = None
    for f in factors:
        out = f if out is None else Binary("@", out, f)
    return out


def transpose_atom(e: Expr, shape: Shape) -> Expr:
    """x^T pushed inside elementwise calls and through double transposes."""
    if shape == SCALAR or shape == IDENTITY:
        return e
    if isinstance(e, Transpose):
        return e.operand
    if isinstance(e, Call) and e.func == "diag":
        return e
    return Transpose(e, span=e.span)


class Expander:
    """Expands expressions of one mixer. `states` are the names treated as linear unknowns.

    A plan's Expander is frozen once the analysis has built it (`freeze`), with its Typer: the
    backends and tools that read the plan leave it as they found it."""

    def __init__(self, mixer: Mixer, typer: Typer, states: set[str]) -> None:
        self.mixer = mixer
        self.typer = typer
        self.states = states
        # keyed by id, holding the node itself so that its id is never reused for another node
        self._stateful: dict[int, tuple[Expr, bool]] = {}
        self._depths: dict[int, tuple[Expr, int]] = {}
        self._frozen = False

    def freeze(self, *held: object) -> None:
        """Keep what is known so far, and no more, here and in the Typer (which types what
        `held` holds first, `Typer.freeze`): what is not known yet is found each time it is
        asked for."""
        self.typer.freeze(*held)
        self._frozen = True

    def shape(self, e: Expr) -> Shape:
        return self.typer.shape_of(e)

    def has_state(self, e: Expr) -> bool:
        """Whether `e` reads a state."""
        return _bottom_up(
            self._stateful,
            e,
            lambda node, below: (
                (isinstance(node, Timed) and node.name in self.states) or any(below)
            ),
            keep=not self._frozen,
        )

    def depth(self, e: Expr) -> int:
        """How many levels `e` nests (a name is one)."""
        return _bottom_up(
            self._depths, e, lambda node, below: 1 + max(below, default=0), keep=not self._frozen
        )

    def expand(self, e: Expr, transposed: bool = False) -> list[Term]:
        """`e` as a sum of terms, like terms collected. Raises NotAffine, and SpecSizeError (placed
        at `e` when the node that grew is one without a place in the spec), also where the terms
        written out would nest deeper than a spec may (every later stage, down to the Python the
        code generator writes, is built for that depth)."""
        try:
            terms = combine(self._expand(e, transposed))
            levels = self.nesting(terms)
            if levels > MAX_DEPTH:
                raise SpecSizeError(
                    f"{brief(e)} is too large to analyse: expanded, it nests {levels} levels deep "
                    f"(the limit is {MAX_DEPTH})",
                    e.span,
                    hint="a sum nests a level deeper for each term, a product for each factor: "
                    "multiply fewer sums out around deeply nested factors",
                )
        except SpecSizeError as exc:
            raise exc.at(e.span) from None
        return terms

    def nesting(self, terms: list[Term]) -> int:
        """How deeply the sum of `terms` nests written out: a level for each term after the first
        and each factor after the first, and the deepest factor."""
        deepest = 1
        for t in terms:
            factors = t.scalars + t.chain + t.gates
            if factors:
                deepest = max(deepest, len(factors) - 1 + max(map(self.depth, factors)))
        return len(terms) - 1 + deepest

    def _atom(self, e: Expr, transposed: bool) -> list[Term]:
        shape = self.shape(e)
        if shape == SCALAR:
            return [Term(scalars=(e,))]
        return [Term(chain=(transpose_atom(e, shape) if transposed else e,))]

    def _expand(self, e: Expr, tr: bool) -> list[Term]:
        if isinstance(e, Number):
            return [Term(coeff=number(e.text))]
        if isinstance(e, Identity):
            return [Term()]
        if isinstance(e, Name):
            return self._atom(e, tr)
        if isinstance(e, Timed):
            return self._atom(e, tr)
        if isinstance(e, Neg):
            return [t.scale(-1) for t in self._expand(e.operand, tr)]
        if isinstance(e, Transpose):
            return self._expand(e.operand, not tr)
        if isinstance(e, Call):
            if self.has_state(e):
                raise NotAffine(e, f"{e.func}(...) of a state is not linear in it")
            if e.func in ELEMENTWISE and tr and self.shape(e) != SCALAR:
                return self._atom(
                    Call(
                        e.func,
                        tuple(transpose_atom(a, self.shape(a)) for a in e.args),
                        span=e.span,
                    ),
                    False,
                )
            return self._atom(e, tr)
        assert isinstance(e, Binary)
        return _BINARY[e.op](self, e, tr)

    def _sum(self, e: Binary, tr: bool) -> list[Term]:
        a, b = self.shape(e.left), self.shape(e.right)
        broadcast = a != b and IDENTITY not in (a, b)
        if broadcast:
            if self.has_state(e):
                raise NotAffine(e, "a sum that broadcasts a state is not a linear map of it")
            return self._atom(e, tr)
        sign = 1 if e.op == "+" else -1
        terms = self._expand(e.left, tr) + [t.scale(sign) for t in self._expand(e.right, tr)]
        collected = combine(terms, e)
        if len(collected) > MAX_TERMS:
            raise _too_many(e, len(collected))
        return collected

    def _matmul(self, e: Binary, tr: bool) -> list[Term]:
        left, right = (e.right, e.left) if tr else (e.left, e.right)
        return _product(self._expand(left, tr), self._expand(right, tr), e)

    def _hadamard(self, e: Binary, tr: bool) -> list[Term]:
        a, b = self.shape(e.left), self.shape(e.right)
        if SCALAR in (a, b):
            return _product(self._expand(e.left, tr), self._expand(e.right, tr), e)
        sl, sr = self.has_state(e.left), self.has_state(e.right)
        if sl and sr:
            raise NotAffine(
                e, "an elementwise product of two state terms is quadratic in the state"
            )
        if not (sl or sr):
            return self._atom(e, tr)
        gate_side, state_side = (e.right, e.left) if sl else (e.left, e.right)
        terms = self._expand(state_side, tr)
        if a == b and "1" in a and any(len(t.chain) > 1 for t in terms):
            # a vector read from a state (`b * (H k)`): a gate on it is a diagonal factor
            return self._matmul(_as_diagonal(gate_side, state_side, a, e), tr)
        gate = gate_side
        if tr:
            gate = transpose_atom(gate, self.shape(gate))
        return [replace(t, gates=_sorted((*t.gates, gate))) for t in terms]

    def _div(self, e: Binary, tr: bool) -> list[Term]:
        if self.has_state(e.right):
            raise NotAffine(e, "dividing by a state is not linear in it")
        if self.shape(e.right) != SCALAR:
            if self.has_state(e.left):
                raise NotAffine(e, "elementwise division of a state by a tensor is NYI")
            return self._atom(e, tr)
        if isinstance(e.right, Number):
            inv = 1 / number(e.right.text)  # not 0: the verifier refuses a division by zero
            return [replace(t, coeff=finite(t.coeff * inv, e)) for t in self._expand(e.left, tr)]
        recip = Binary("/", Number("1"), e.right, span=e.span)
        return [t.scale(1, (recip,)) for t in self._expand(e.left, tr)]

    def _dot(self, e: Binary, tr: bool) -> list[Term]:
        if not self.has_state(e):
            return self._atom(e, tr)
        a, b = self.shape(e.left), self.shape(e.right)
        row = e.left if a[0] == "1" else Transpose(e.left, span=e.left.span)
        col = e.right if b[1] == "1" else Transpose(e.right, span=e.right.span)
        terms = _product(self._expand(row, False), self._expand(col, False), e)
        # a scalar equals its transpose: put the state first so readouts read `S x`
        return [flip_scalar_chain(t, self) for t in terms]

    def _pow(self, e: Binary, tr: bool) -> list[Term]:
        if self.has_state(e):
            raise NotAffine(e, "a power of a state is not linear in it")
        if isinstance(e.right, Number) and e.right.text == "1":
            return self._expand(e.left, tr)
        return self._atom(e, tr)


def _bottom_up(
    known: dict[int, tuple[Expr, T]],
    e: Expr,
    value: Callable[[Expr, list[T]], T],
    keep: bool = True,
) -> T:
    """`value(node, values of its children)` at `e`, with `known` holding it by id for every node
    found so far. Found bottom up for every node below `e` at once, without recursion, so that
    asking it of each node of a tree, as expanding does, costs the tree's size, not its size
    times its depth. Unless `keep`, what is found is not added to `known`."""
    got = known.get(id(e))
    if got is not None and got[0] is e:
        return got[1]
    found = known if keep else {}
    order, stack = [], [e]
    while stack:  # the nodes not known yet, each after its parent
        node = stack.pop()
        got = known.get(id(node))
        if got is None or got[0] is not node:
            order.append(node)
            stack.extend(children(node))
    for node in reversed(order):
        below = [(found.get(id(c)) or known[id(c)])[1] for c in children(node)]
        found[id(node)] = (node, value(node, below))
    return found[id(e)][1]


def _as_diagonal(gate: Expr, vector: Expr, shape: Shape, where: Binary) -> Binary:
    """`gate * vector` for two vectors of one shape, as the matrix product it is: `diag(gate)
    vector` for columns, `vector diag(gate^T)` for rows, so that `b * (H k)` and `diag(b) H k`
    reach the same terms."""
    if shape[1] == "1":
        return Binary("@", Call("diag", (gate,), span=gate.span), vector, span=where.span)
    column = Transpose(gate, span=gate.span)
    return Binary("@", vector, Call("diag", (column,), span=gate.span), span=where.span)


def _product(xs: list[Term], ys: list[Term], where: Expr) -> list[Term]:
    """Every term of xs times every term of ys, like terms collected; refused before it starts
    when that is more than MAX_TERMS products."""
    if len(xs) * len(ys) > MAX_TERMS:
        raise _too_many(where, len(xs) * len(ys))
    return combine([multiply(x, y, where) for x in xs for y in ys], where)


def _too_many(where: Expr, count: int) -> SpecSizeError:
    return SpecSizeError(
        f"{brief(where)} is too large to analyse: it expands into {count:,} terms "
        f"(the limit is {MAX_TERMS})",
        where.span,
        hint="mixc multiplies every product of sums out to recognise the transition, so n "
        "factors of two terms make 2^n terms; multiply fewer sums, or write a repeated scalar "
        "factor as a power (x^8)",
    )


def multiply(x: Term, y: Term, where: Expr) -> Term:
    if (x.gates and y.chain) or (y.gates and x.chain):
        raise NotAffine(where, "a matrix product of an elementwise-gated state is NYI")
    factors = len(x.scalars) + len(y.scalars) + len(x.chain) + len(y.chain)
    factors += len(x.gates) + len(y.gates)
    if factors > MAX_FACTORS:
        raise SpecSizeError(
            f"{brief(where)} is too large to analyse: a term of it has {factors} factors "
            f"(the limit is {MAX_FACTORS})",
            where.span,
            hint="a term takes a factor from each factor of a product: multiply fewer, or "
            "write a repeated scalar factor as a power (x^8)",
        )
    return Term(
        coeff=finite(x.coeff * y.coeff, where),
        scalars=_sorted(x.scalars + y.scalars),
        chain=x.chain + y.chain,
        gates=_sorted(x.gates + y.gates),
    )


def finite(coeff: Fraction | float, where: Expr | None) -> Fraction | float:
    """`coeff`, refused unless the generated code can hold it: at most float64's largest number.
    `where` is the expression it belongs to, for the error."""
    if abs(coeff) > sys.float_info.max:
        raise SpecSizeError(
            f"{brief(where) if where is not None else 'a term'} is too large: a constant "
            "factor of it is beyond float64 (about 1.8e308)",
            where.span if where is not None else None,
            hint="constants are computed in float64; scale them down",
        )
    return coeff


def flip_scalar_chain(t: Term, ex: Expander) -> Term:
    if not t.chain or (isinstance(t.chain[0], Transpose) and isinstance(t.chain[0].operand, Timed)):
        return t
    if not any(isinstance(a, Timed) and a.name in ex.states for a in t.chain):
        return t
    flipped = tuple(transpose_atom(a, ex.shape(a)) for a in reversed(t.chain))
    return replace(t, chain=flipped)


def combine(terms: list[Term], where: Expr | None = None) -> list[Term]:
    """Collect like terms (same scalars, chain and gates), dropping those that cancel. The first
    of like terms keeps its place, so that collecting as terms are produced keeps the order
    collecting once at the end gives (but where terms cancel). `where` is the expression they
    come from, for an error."""
    out: dict[tuple, Term] = {}
    for t in terms:
        k = t.key()
        out[k] = replace(out[k], coeff=finite(out[k].coeff + t.coeff, where)) if k in out else t
    return [t for t in out.values() if t.coeff != 0]


_BINARY: dict[str, Callable[[Expander, Binary, bool], list[Term]]] = {
    "+": Expander._sum,
    "-": Expander._sum,
    "@": Expander._matmul,
    "*": Expander._hadamard,
    "/": Expander._div,
    ".": Expander._dot,
    "^": Expander._pow,
}


#: The lets and per-token values of the mixer `inline` was last given, by name: it is called
#: once per equation, and building them anew each time is quadratic in a spec's equations.
_last_tables: tuple[Mixer, dict[str, LetFn], dict[str, Expr]] | None = None


def _tables(mixer: Mixer) -> tuple[dict[str, LetFn], dict[str, Expr]]:
    global _last_tables
    tables = _last_tables
    if tables is None or tables[0] is not mixer:
        lets = {fn.name: fn for fn in mixer.lets}
        states = {s.name for s in mixer.states}
        values = {eq.target: eq.value for eq in mixer.equations if eq.target not in states}
        tables = _last_tables = (mixer, lets, values)
    return tables[1], tables[2]


def inline(mixer: Mixer, e: Expr) -> Expr:
    """Substitute let functions and per-token values (equations that are not state updates)."""
    lets, values = _tables(mixer)
    cache: dict[str, Expr] = {}

    def go(e: Expr, env: dict[str, Expr]) -> Expr:
        if isinstance(e, Name) and e.name in env:
            return env[e.name]
        if isinstance(e, Timed) and e.offset == 0 and e.name in values:
            if e.name not in cache:
                cache[e.name] = go(values[e.name], {})
            return cache[e.name]
        if isinstance(e, Call):
            args = tuple(go(a, env) for a in e.args)
            if e.func in lets:
                fn = lets[e.func]
                return go(fn.body, dict(zip(fn.args, args, strict=True)))
            return Call(e.func, args, span=e.span)
        if isinstance(e, Neg):
            return Neg(go(e.operand, env), span=e.span)
        if isinstance(e, Transpose):
            return Transpose(go(e.operand, env), span=e.span)
        if isinstance(e, Binary):
            return Binary(e.op, go(e.left, env), go(e.right, env), span=e.span)
        return e

    return go(e, {})
