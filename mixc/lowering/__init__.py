"""Lowering: a plan becomes a program, each form as the kernel calls it makes, which every
backend renders (`mixc.lowering.program` holds its types, `mixc.lowering.lower` builds it)."""

from mixc.lowering.lower import lower
from mixc.lowering.program import Program, dump

__all__ = ["Program", "dump", "lower"]
