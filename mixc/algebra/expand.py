"""Algebraic normal form of expressions, for recognising structure however a spec writes it.

`expand` turns an expression into a sum of `Term`s: a numeric coefficient, commuting scalar
factors, an ordered chain of matrix/vector factors (at most one of them a state), and
elementwise gates applied to the whole chain. `gamma H`, `H gamma`, `H (I - b k k^T)` and
`H - b H k k^T` all reach the same terms. Transposes are pushed down to atoms; state-free sums
whose operands broadcast (elu(x) + 1) stay whole, as one atom.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from fractions import Fraction

from mixc.frontend.builtins import BUILTINS
from mixc.frontend.ir import (
    Binary,
    Call,
    Expr,
    Identity,
    Mixer,
    Name,
    Neg,
    Number,
    Timed,
    Transpose,
    walk,
)
from mixc.frontend.shapes import IDENTITY, SCALAR, Shape, Typer

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
    """Expands expressions of one mixer. `states` are the names treated as linear unknowns."""

    def __init__(self, mixer: Mixer, typer: Typer, states: set[str]) -> None:
        self.mixer = mixer
        self.typer = typer
        self.states = states
        # keyed by id, holding the node itself so that its id is never reused for another node
        self._shape_cache: dict[int, tuple[Expr, Shape]] = {}

    def shape(self, e: Expr) -> Shape:
        got = self._shape_cache.get(id(e))
        if got is None or got[0] is not e:
            got = self._shape_cache[id(e)] = (e, self.typer.shape_of(e))
        return got[1]

    def has_state(self, e: Expr) -> bool:
        return any(isinstance(n, Timed) and n.name in self.states for n in walk(e))

    def expand(self, e: Expr, transposed: bool = False) -> list[Term]:
        return combine(self._expand(e, transposed))

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
                    Call(e.func, (transpose_atom(e.args[0], self.shape(e.args[0])),), span=e.span),
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
        return self._expand(e.left, tr) + [t.scale(sign) for t in self._expand(e.right, tr)]

    def _matmul(self, e: Binary, tr: bool) -> list[Term]:
        left, right = (e.right, e.left) if tr else (e.left, e.right)
        return [multiply(x, y, e) for x in self._expand(left, tr) for y in self._expand(right, tr)]

    def _hadamard(self, e: Binary, tr: bool) -> list[Term]:
        a, b = self.shape(e.left), self.shape(e.right)
        if SCALAR in (a, b):
            return [
                multiply(x, y, e)
                for x in self._expand(e.left, tr)
                for y in self._expand(e.right, tr)
            ]
        sl, sr = self.has_state(e.left), self.has_state(e.right)
        if sl and sr:
            raise NotAffine(
                e, "an elementwise product of two state terms is quadratic in the state"
            )
        if not (sl or sr):
            return self._atom(e, tr)
        gate_side, state_side = (e.right, e.left) if sl else (e.left, e.right)
        gate = gate_side
        if tr:
            gate = transpose_atom(gate, self.shape(gate))
        terms = self._expand(state_side, tr)
        return [replace(t, gates=_sorted((*t.gates, gate))) for t in terms]

    def _div(self, e: Binary, tr: bool) -> list[Term]:
        if self.has_state(e.right):
            raise NotAffine(e, "dividing by a state is not linear in it")
        if self.shape(e.right) != SCALAR:
            if self.has_state(e.left):
                raise NotAffine(e, "elementwise division of a state by a tensor is NYI")
            return self._atom(e, tr)
        if isinstance(e.right, Number):
            inv = 1 / number(e.right.text)
            return [t.scale(inv) for t in self._expand(e.left, tr)]
        recip = Binary("/", Number("1"), e.right, span=e.span)
        return [t.scale(1, (recip,)) for t in self._expand(e.left, tr)]

    def _dot(self, e: Binary, tr: bool) -> list[Term]:
        if not self.has_state(e):
            return self._atom(e, tr)
        a, b = self.shape(e.left), self.shape(e.right)
        row = e.left if a[0] == "1" else Transpose(e.left, span=e.left.span)
        col = e.right if b[1] == "1" else Transpose(e.right, span=e.right.span)
        terms = [
            multiply(x, y, e) for x in self._expand(row, False) for y in self._expand(col, False)
        ]
        # a scalar equals its transpose: put the state first so readouts read `S x`
        return [flip_scalar_chain(t, self) for t in terms]

    def _pow(self, e: Binary, tr: bool) -> list[Term]:
        if self.has_state(e):
            raise NotAffine(e, "a power of a state is not linear in it")
        if isinstance(e.right, Number) and e.right.text == "1":
            return self._expand(e.left, tr)
        return self._atom(e, tr)


def multiply(x: Term, y: Term, where: Expr) -> Term:
    if (x.gates and y.chain) or (y.gates and x.chain):
        raise NotAffine(where, "a matrix product of an elementwise-gated state is NYI")
    return Term(
        coeff=x.coeff * y.coeff,
        scalars=_sorted(x.scalars + y.scalars),
        chain=x.chain + y.chain,
        gates=_sorted(x.gates + y.gates),
    )


def flip_scalar_chain(t: Term, ex: Expander) -> Term:
    if not t.chain or (isinstance(t.chain[0], Transpose) and isinstance(t.chain[0].operand, Timed)):
        return t
    if not any(isinstance(a, Timed) and a.name in ex.states for a in t.chain):
        return t
    flipped = tuple(transpose_atom(a, ex.shape(a)) for a in reversed(t.chain))
    return replace(t, chain=flipped)


def combine(terms: list[Term]) -> list[Term]:
    """Collect like terms (same scalars, chain and gates), dropping those that cancel."""
    out: dict[tuple, Term] = {}
    for t in terms:
        k = t.key()
        out[k] = replace(out[k], coeff=out[k].coeff + t.coeff) if k in out else t
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


def inline(mixer: Mixer, e: Expr) -> Expr:
    """Substitute let functions and per-token values (equations that are not state updates)."""
    lets = {fn.name: fn for fn in mixer.lets}
    states = {s.name for s in mixer.states}
    values = {eq.target: eq.value for eq in mixer.equations if eq.target not in states}
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
