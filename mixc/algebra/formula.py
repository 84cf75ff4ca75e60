"""Per-token counts as formulas in the spec's sizes: what the cost model computes with.

A `Formula` is a polynomial in size symbols (exponents may be negative: once per chunk of C
tokens is 1/C). The cost model's other terms (the FLOPs and bytes of a form, the sizes a class's
cost depends on) are in `mixc.transitions.cost`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

__all__ = ["Formula"]

Monomial = tuple[tuple[str, int], ...]


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

    @staticmethod
    def total(formulas) -> Formula:
        """The sum of `formulas`, combined once: adding n formulas one by one re-sorts the
        growing sum n times (a spec may declare thousands of inputs, each with its own size)."""
        return Formula()._combine(item for f in formulas for item in f.terms)

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
