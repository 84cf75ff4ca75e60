"""Transition classes, one module each, and the registry that orders them.

`REGISTRY` is the rule table: `classify` tries each class's rule in this order and the first
match wins, so a more specific class (the scalar decay) comes before a more general one that
would also match (the diagonal gate). Adding a class is adding its module, its kernel file in
each backend that runs it chunked, and one line here (see docs/adding-a-class.md).
"""

from __future__ import annotations

from mixc.transitions.base import RuleContext, StateTerms, Transition, TransitionClass
from mixc.transitions.delta import DELTA
from mixc.transitions.dense import DENSE, NOT_AFFINE
from mixc.transitions.diagonal import DIAGONAL
from mixc.transitions.dplr import DPLR
from mixc.transitions.elementwise import ELEMENTWISE
from mixc.transitions.scalar_decay import SCALAR_DECAY
from mixc.transitions.value_side import VALUE_SIDE

__all__ = [
    "CLASSES",
    "DENSE",
    "NOT_AFFINE",
    "REGISTRY",
    "TransitionClass",
    "classify",
    "rule_table",
]


def rule_table(*classes: TransitionClass) -> tuple[TransitionClass, ...]:
    """The classes as a rule table, in match order. Raises TypeError for a class that inherits
    what it must define (`TransitionClass.missing`), naming the class and what it lacks, so that
    a class without its maths or its cost is refused here rather than explained as nothing."""
    for c in classes:
        missing = c.missing()
        if missing:
            name = c.name or type(c).__name__
            raise TypeError(f"transition class {name} does not define {', '.join(missing)}")
    return classes


#: The rule table, in match order; the last rule matches any linear transition.
REGISTRY = rule_table(SCALAR_DECAY, DIAGONAL, ELEMENTWISE, DELTA, DPLR, VALUE_SIDE, DENSE)

#: Every class a state can be in: the registry, and updates that are not affine.
CLASSES: tuple[TransitionClass, ...] = (*REGISTRY, NOT_AFFINE)


def classify(
    terms: StateTerms, ctx: RuleContext, after: TransitionClass | None = None
) -> Transition:
    """The first class whose rule matches the state's terms, as a Transition of that class
    (after: the first of the classes that follow that one in the rule order)."""
    start = 0 if after is None else REGISTRY.index(after) + 1
    for cls in REGISTRY[start:]:
        found = cls.match(terms, ctx)
        if found is not None:
            return found
    raise AssertionError("the last rule matches every linear transition")
