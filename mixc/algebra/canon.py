"""Canonical spelling of state-free expressions: the same math gives the same text.

Facts hold canonical expressions, so `gamma H` and `H gamma`, `exp(dt A)` and `exp(A dt)`, or
`H - b H k k^T` and `H (I - b k k^T)` give the same facts, and the transition rules compare
canonical text, never the spelling.
"""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal
from fractions import Fraction

from mixc.algebra.expand import Expander, NotAffine, Term, finite, product
from mixc.errors import SpecShapeError
from mixc.frontend.constants import refuse_undefined
from mixc.frontend.ir import Binary, Call, Expr, Name, Neg, Number, Timed, Transpose, walk
from mixc.frontend.limits import MAX_TERMS, SpecSizeError, brief
from mixc.frontend.parser import MAX_DEPTH
from mixc.frontend.shapes import SCALAR

__all__ = ["Canon", "number", "signed"]


def number(value: Fraction | float) -> Expr:
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


def signed(value: Fraction | float) -> Expr:
    return Neg(number(-value)) if value < 0 else number(value)


def _constant(e: Expr) -> Fraction | None:
    """The exact value of a canonical constant (`3`, `-0.5`, `1 / 3`), else None."""
    if isinstance(e, Number):
        try:
            return Fraction(e.text)
        except ValueError:
            return None
    if isinstance(e, Neg):
        value = _constant(e.operand)
        return None if value is None else -value
    if isinstance(e, Binary) and e.op == "/":
        num, den = _constant(e.left), _constant(e.right)
        return None if num is None or not den else num / den
    return None


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


def _refuse_undefined(e: Binary | Call, written: Expr) -> None:
    """Refuse a canonical form with no value (`refuse_undefined`) when it comes from the spec:
    from an expression with a place in it. The analysis builds expressions of its own, such as
    log(-0.5), the log-gate of a negative decay, which it keeps from the chunked form with a
    reason of its own."""
    if written.span is not None:
        refuse_undefined(e, written)


class Canon:
    """The canonical spelling of a state-free expression: the same math gives the same text.

    Expands into terms (so `a b` and `b a`, `x + y - y`, `(a b) c` and `a (b c)` meet), merges like
    terms, and orders scalars (per-token values first) and terms; arguments of functions are
    canonical too. Facts hold canonical expressions, so equal mixers give equal facts.
    """

    def __init__(self, ex: Expander) -> None:
        self.ex = ex
        # Canonical forms by the id of the expression, holding it so that its id is not reused.
        # Terms share their atoms rather than copy them, and canonicalising an atom canonicalises
        # every expression inside it: without this, an atom nested n deep in m terms would cost
        # m n^2 instead of about n^2.
        self._forms: dict[int, tuple[Expr, Expr]] = {}

    def __call__(self, e: Expr | None) -> Expr | None:
        if e is None:
            return None
        known = self._forms.get(id(e))
        if known is not None and known[0] is e:
            return known[1]
        try:
            terms = self.ex.expand(e)
        except (NotAffine, SpecShapeError):
            out = e
        else:
            out = self.terms(terms)  # here, not in a helper: a frame less per level of nesting
        self._forms[id(e)] = (e, out)
        return out

    def key(self, e: Expr) -> str:
        return str(self(e))

    def atom(self, a: Expr) -> Expr:
        if isinstance(a, Transpose):
            return Transpose(self.atom(a.operand), span=a.span)
        if isinstance(a, Call):
            call = Call(a.func, tuple(map(self, a.args)), span=a.span)
            _refuse_undefined(call, a)  # log(x - x) is log(0)
            return call
        if isinstance(a, Neg | Binary):
            try:
                terms = self.ex.expand(a)
            except (NotAffine, SpecShapeError):
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
            out = Binary(a.op, left, right, span=a.span)
            _refuse_undefined(out, a)  # H / (a - a) divides by 0
            return out
        return a

    def combine(self, terms: list[Term]) -> list[Term]:
        """Collect like terms whose factors are equal once canonical (`exp(a b) H` and
        `exp(b a) H`), which the expander's textual collection misses; the first spelling stays."""
        merged: dict[tuple, Term] = {}
        for t in (self._pull(piece) for term in terms for piece in self._split_gates(term)):
            key = (
                tuple(sorted(self.key(a) for a in t.scalars)),
                tuple(str(self.atom(a)) for a in t.chain),
                tuple(sorted(str(self.atom(g)) for g in t.gates)),
            )
            merged[key] = (
                replace(merged[key], coeff=finite(merged[key].coeff + t.coeff, None))
                if key in merged
                else t
            )
        return [t for t in merged.values() if t.coeff != 0]

    def _split_gates(self, t: Term) -> list[Term]:
        """`(a + b) ⊙ S` is `a ⊙ S + b ⊙ S`, and `(2 a) ⊙ S` is `2 (a ⊙ S)`: a gate that expands to
        more than one plain atom is distributed, so like terms meet."""
        out = [replace(t, gates=())]
        for g in t.gates:
            try:
                pieces = self.ex.expand(g)
            except (NotAffine, SpecShapeError):
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
            if len(out) * len(pieces) > MAX_TERMS:
                raise SpecSizeError(
                    f"{brief(g)} is too large to analyse: its gates distribute into "
                    f"{len(out) * len(pieces):,} terms (the limit is {MAX_TERMS})",
                    g.span,
                    hint="mixc distributes a gate that is a sum over the state's terms; "
                    "gate with fewer sums",
                )
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

    def _pull(self, t: Term) -> Term:
        """t with the numbers and scalars inside its state-free elementwise products moved out
        (`(2 s a) * b` is `2 s (a * b)`), and its constant scalars (`1 / 512`) in its coefficient,
        so that spellings that put them inside or outside meet."""
        coeff, scalars, chain = t.coeff, [], []
        for a in t.scalars:
            # a function's value is never a constant here: skip it before canonicalising, which
            # would cost a frame more per level of a nested call (exp(exp(...)))
            value = None if isinstance(a, Call | Transpose) else _constant(self.atom(a))
            if value is None:
                scalars.append(a)
            else:
                coeff *= value
        for a in t.chain:
            c, s, core = self._parts(a)
            coeff, chain = coeff * c, [*chain, core]
            scalars += s
        if coeff == t.coeff and len(scalars) == len(t.scalars):
            return t
        return Term(finite(coeff, None), tuple(sorted(scalars, key=str)), tuple(chain), t.gates)

    def _parts(self, e: Expr) -> tuple[Fraction | float, list[Expr], Expr]:
        """(number, scalars, rest) whose product is e, a factor of a term: the numbers and
        scalars of each side of a state-free elementwise product of non-scalars; e itself
        (1, [], e) otherwise."""
        if isinstance(e, Transpose):
            c, s, core = self._parts(e.operand)
            return (c, s, Transpose(core, span=e.span)) if s or c != 1 else (1, [], e)
        if not (isinstance(e, Binary) and e.op == "*") or self.ex.has_state(e):
            return 1, [], e
        if SCALAR in (self.ex.shape(e.left), self.ex.shape(e.right)):
            return 1, [], e
        sides = [self._side(x) for x in (e.left, e.right)]
        if all(c == 1 and not s for c, s, _ in sides):
            return 1, [], e
        core = Binary("*", sides[0][2], sides[1][2], span=e.span)
        return sides[0][0] * sides[1][0], sides[0][1] + sides[1][1], core

    def _side(self, e: Expr) -> tuple[Fraction | float, list[Expr], Expr]:
        """_parts of one side of an elementwise product: a product of one term of the
        expander's, or an elementwise product itself."""
        if isinstance(e, Binary) and e.op == "*":
            return self._parts(e)
        try:
            terms = self.ex.expand(e)
        except (NotAffine, SpecShapeError):
            return 1, [], e
        if len(terms) != 1 or terms[0].gates or not terms[0].chain:
            return 1, [], e
        t = terms[0]
        if t.coeff == 1 and not t.scalars:
            return 1, [], e
        c, s, core = self._parts(product(list(t.chain)))
        return t.coeff * c, [*t.scalars, *s], core

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
        for t in map(self._pull, terms):
            # map, not a generator: canonical forms nest as deeply as the spec (MAX_DEPTH), and
            # each level of the recursion must cost as few of Python's frames as it can
            scalars = sorted(map(self.atom, t.scalars), key=_factor_order)
            chain = list(map(self.atom, t.chain))
            gates = sorted(map(self.atom, t.gates), key=str)
            key = (tuple(map(str, chain)), tuple(map(str, scalars)), tuple(map(str, gates)))
            if key in merged:
                merged[key][0] = finite(merged[key][0] + t.coeff, None)
            else:
                merged[key] = [t.coeff, scalars, chain, gates]
        out: Expr | None = None
        for key in sorted(merged):
            coeff, scalars, chain, gates = merged[key]
            if coeff == 0:
                continue
            factors = list(scalars) + list(chain)
            if abs(coeff) != 1 or not factors:
                factors.insert(0, number(abs(coeff)))
            e = product(factors)
            for g in gates:
                e = Binary("*", g, e)
            if out is None:
                out = Neg(e) if coeff < 0 else e
            else:
                out = Binary("-" if coeff < 0 else "+", out, e)
        if out is None:
            return Number("0")
        levels = self.ex.depth(out)
        if levels > MAX_DEPTH:  # its atoms, canonical, may nest deeper than written
            raise SpecSizeError(
                f"{brief(out)} is too large to analyse: in canonical form it nests {levels} "
                f"levels deep (the limit is {MAX_DEPTH})",
                hint="the arguments of functions are expanded too: multiply fewer sums out "
                "inside deeply nested calls",
            )
        return out

    def column(self, e: Expr | None) -> Expr | None:
        """A vector as a column (for a per-channel gate or a key), canonical."""
        if e is None:
            return None
        shape = self.ex.shape(e)
        return self(Transpose(e, span=e.span) if shape[0] == "1" and shape != SCALAR else e)


# ----------------------------------------------------------------------------- graph
