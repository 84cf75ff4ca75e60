"""The cost model: FLOPs and bytes per token and head of each form, as formulas in the sizes.

`costs(plan)` is a pure function of the plan. Each transition class computes its own chunked and
quadratic cost (`TransitionClass.cost`) from the dimensions of its group (`GroupDims`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mixc.analysis.plan import GroupPlan, Plan

__all__ = ["ClassCost", "Costs", "FormCost", "Formula", "GroupCost", "GroupDims", "costs"]


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



@dataclass(frozen=True)
class GroupDims:
    """The sizes a class's cost depends on, for one group of states sharing a chunked pass: d_k
    the key size, d_v the summed value widths (a vector state adds 1), r the write rank, n_q the
    number of distinct readout queries, d_g the gated size (d_k for a key-side gate, d_v
    value-side, both for an outer product), C the chunk size and T the sequence length."""

    dk: Formula
    dv: Formula
    r: int
    nq: int
    dg: Formula
    C: Formula
    T: Formula

    @property
    def kv(self) -> Formula:
        return self.dk * self.dv

    @property
    def state_bytes(self) -> Formula:
        """Reading and writing the group's state once, in fp32."""
        return 2 * ACC_BYTES * self.kv


@dataclass(frozen=True)
class ClassCost:
    """What a class's chunked kernel costs per token (and its quadratic form, if it has one)."""

    chunked: FormCost
    quadratic: FormCost | None
    note: str


def _numel(shape: tuple[str, ...]) -> Formula:
    out = Formula.const(1)
    for d in shape:
        out = out * Formula.size(d)
    return out


def costs(plan: Plan) -> Costs:
    """Per-token, per-head cost of the recurrent, chunked and quadratic forms, as formulas in the
    spec's sizes, the chunk size C and the sequence length T. A pure function of the plan.

    Conventions: a multiply-add is 2 FLOPs, an elementwise op (exp included) 1; a matrix product
    (m x n)(n x p) is 2 m n p. Per state group, d_k is the key size, d_v the summed value widths
    (a vector state adds 1), r the write rank, n_q the number of distinct readout queries, and
    d_g the gated size (d_k for a key-side gate, d_v value-side, both for an outer product).
    Lower-order FLOPs (O(d) or O(1) per token, such as cumulative sums of gates) are dropped.

    FLOPs per token:

    - Recurrent (O(d_k d_v) per token): decay d_k d_v (2 d_k d_v for an
      outer-product gate, none for the identity), write 2 r d_k d_v, readout 2 n_q d_k d_v; the
      delta rule's erase S^T k and rank-1 update add 4 d_k d_v. A transition in no class (general
      dense, full gate, not affine) is not modelled: its count is a lower bound.
    - Chunked, scalar decay: n_q (2 C r (d_k + d_v) + (2 or 1) C r) for Q K^T, the decay mask
      and P V inside the chunk, 2 n_q d_k d_v for Q S_0, 2 r d_k d_v for K^T V, d_k d_v / C to
      decay the state once per chunk: O(C (d_k + d_v) + d_k d_v).
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
    mixer = plan.mixer
    dims = {d for decl in (*mixer.inputs, *mixer.params, *mixer.states) for d in decl.shape}
    chunk = "C" if "C" not in dims else "C_chunk"
    seq = "T" if "T" not in dims else "T_seq"
    C, T = Formula.size(chunk), Formula.size(seq)
    io = Formula()
    for d in mixer.inputs:
        io = io + IO_BYTES * _numel(d.shape)
    for o in plan.outputs:
        io = io + IO_BYTES * _numel(tuple(x for x in o.shape if x != "1"))
    groups = []
    for group in plan.groups:
        groups.append(_group_cost(plan, group, C, T))
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




def _group_cost(plan: Plan, group: GroupPlan, C: Formula, T: Formula) -> GroupCost:
    states = [plan.state(n) for n in group.states]
    lead = states[0]
    tr = lead.transition
    dv = Formula()
    for s in states:
        dv = dv + Formula.size(s.width)
    dk = Formula.size(lead.key_size)
    dg = Formula()
    if "key" in tr.sides:
        dg = dg + dk
    if "value" in tr.sides:
        dg = dg + dv
    d = GroupDims(dk, dv, max(1, lead.rank), len(group.queries), dg, C, T)
    recurrent = FormCost(tr.kind.recurrent_flops(tr, d), d.state_bytes)
    if not tr.kind.modelled:
        note = (
            "recurrent only; the transition itself is not modelled (no class), so its count is "
            "a lower bound"
        )
        return GroupCost(group.states, tr.cls, recurrent, None, None, note)
    if not tr.chunkable:
        return GroupCost(group.states, tr.cls, recurrent, None, None, f"recurrent only: {tr.reason}")
    found = tr.kind.cost(tr, d)
    return GroupCost(group.states, tr.cls, recurrent, found.chunked, found.quadratic, found.note)
