"""What a transition class answers for the cost model (`TransitionClass.cost`): the FLOPs and
bytes of one form (`FormCost`), per token and head, as formulas in the sizes of its group
(`GroupDims`). `mixc.analysis.cost` adds them up over a plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from mixc.algebra.formula import Formula

__all__ = ["ACC_BYTES", "IO_BYTES", "ClassCost", "FormCost", "GroupDims"]

#: Bytes of one element: inputs and outputs in a 16-bit type, states and intermediates in fp32.
IO_BYTES = 2
ACC_BYTES = 4


@dataclass(frozen=True)
class FormCost:
    """FLOPs and bytes moved per token and head of one form (a multiply-add is 2 FLOPs)."""

    flops: Formula
    bytes: Formula

    def __add__(self, other: FormCost) -> FormCost:
        return FormCost(self.flops + other.flops, self.bytes + other.bytes)

    @staticmethod
    def total(costs) -> FormCost:
        """The sum of `costs` (see Formula.total)."""
        costs = list(costs)
        return FormCost(
            Formula.total(c.flops for c in costs), Formula.total(c.bytes for c in costs)
        )


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
