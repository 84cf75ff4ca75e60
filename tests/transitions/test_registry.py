"""The rule table refuses a class that lacks what it must define: a class with a kernel whose
maths or cost is missing would otherwise be explained as nothing and costed as nothing."""

from __future__ import annotations

import pytest

from mixc.transitions import REGISTRY, rule_table
from mixc.transitions.base import Maths, Rule, TransitionClass
from mixc.transitions.cost import ClassCost, FormCost


class _Chunked(TransitionClass):
    """A class with a kernel and its rule, algorithm, maths and cost."""

    name = "chunked"
    rules = (Rule("chunked", "chunked", "S_{t-1} alone"),)
    kernel = "chunked"
    algorithm = "a chunked form"

    def match(self, terms, ctx):
        return None

    def maths(self, tr):
        return Maths((), ())

    def cost(self, tr, d):
        return ClassCost(FormCost(d.kv, d.kv), None, "")


class _NoMaths(_Chunked):
    maths = TransitionClass.maths


class _NoMathsNorCost(_Chunked):
    maths, cost = TransitionClass.maths, TransitionClass.cost


class _NoStableAlgorithm(_Chunked):
    stable_kernel = "chunked_stable"


class _Recurrent(TransitionClass):
    """A class without a kernel: token by token only, it needs no maths nor cost."""

    name = "recurrent"
    rules = (Rule("recurrent", "recurrent", "any S_{t-1}"),)

    def match(self, terms, ctx):
        return None


def test_complete_classes_are_taken_in_their_order():
    complete = (*REGISTRY, _Chunked(), _Recurrent())
    assert rule_table(*complete) == complete


@pytest.mark.parametrize(
    ("cls", "missing"),
    [
        (_NoMaths, "maths"),
        (_NoMathsNorCost, "maths, cost"),
        (_NoStableAlgorithm, "stable_algorithm"),
    ],
)
def test_a_class_with_a_kernel_and_without_its_maths_or_cost_is_refused(cls, missing):
    broken = cls()
    with pytest.raises(TypeError, match=f"^transition class chunked does not define {missing}$"):
        rule_table(broken)


def test_a_class_without_a_name_or_a_rule_is_refused():
    class Nameless(TransitionClass):
        pass

    with pytest.raises(
        TypeError, match=r"^transition class Nameless does not define name, rules, match$"
    ):
        rule_table(Nameless())
