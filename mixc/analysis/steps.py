"""Several update steps per token (DeltaProduct): an update that composes steps, each in one
class whose kernel runs sub-tokens.

`H_t = (H_{t-1} (I - b1_t k1_t k1_t^T) + b1_t v1_t k1_t^T) (I - b2_t k2_t k2_t^T) + b2_t v2_t
k2_t^T` expands into a transition no class chunks (four terms read the state, one write is not
an outer product), but it is one delta step applied to the result of another. `split_steps`
finds that structure in the update as written (with its per-token values inlined, so
`U_t = ...; H_t = U_t (...) + ...` is the same update): a subexpression that reads the state and
has its shape is an inner step when the update with that subexpression replaced by the state is
itself one step, and the subexpression is one step or again a composition. Every step must be
in the same class, one whose kernel takes several steps a token as sub-tokens
(`TransitionClass.sub_tokens`): the plan lowers the n steps to n sub-tokens of that kernel.
"""

from __future__ import annotations

from collections.abc import Callable

from mixc.algebra.expand import Expander
from mixc.analysis.facts import WriteTerm
from mixc.frontend.ir import Binary, Call, Expr, Neg, Timed, Transpose, children, walk
from mixc.transitions.base import Transition

__all__ = ["Step", "split_steps"]

#: One step's transition and its write.
Step = tuple[Transition, WriteTerm]

#: The analysis of one step: the update `expr` of the state as if it were the whole update ->
#: its transition and writes, or None where it is no chunkable step of a sub-token class.
StepAnalysis = Callable[[Expr], Step | None]


def split_steps(update: Expr, state: str, ex: Expander, analyze: StepAnalysis) -> list[Step] | None:
    """The steps of `update` (per-token values inlined), innermost first, when it composes two
    or more chunkable steps of one sub-token class; None otherwise."""
    shape = ex.shape(Timed(state, -1))
    for inner in _candidates(update, state, ex, shape):
        outer = analyze(_substitute(update, inner, Timed(state, -1)))
        if outer is None:
            continue
        first = analyze(inner)
        steps = [first] if first is not None else split_steps(inner, state, ex, analyze)
        if steps and all(tr.transition_class is outer[0].transition_class for tr, _ in steps):
            return [*steps, outer]
    return None


def _candidates(update: Expr, state: str, ex: Expander, shape) -> list[Expr]:
    """The subexpressions of `update` that read the state, are not the state itself and have its
    shape, largest first (each node once)."""
    seen: set[int] = set()
    found = []
    for node in walk(update):
        if node is update or id(node) in seen or isinstance(node, Timed):
            continue
        seen.add(id(node))
        if any(isinstance(n, Timed) and n.name == state for n in walk(node)):
            if ex.shape(node) == shape:
                found.append(node)
    return sorted(found, key=lambda n: -sum(1 for _ in walk(n)))


def _substitute(e: Expr, old: Expr, new: Expr) -> Expr:
    """`e` with the node `old` (that very node) replaced by `new`."""
    if e is old:
        return new
    if not children(e):
        return e
    if isinstance(e, Binary):
        return Binary(
            e.op, _substitute(e.left, old, new), _substitute(e.right, old, new), span=e.span
        )
    if isinstance(e, Neg):
        return Neg(_substitute(e.operand, old, new), span=e.span)
    if isinstance(e, Transpose):
        return Transpose(_substitute(e.operand, old, new), span=e.span)
    if isinstance(e, Call):
        return Call(e.func, tuple(_substitute(a, old, new) for a in e.args), span=e.span)
    raise AssertionError(f"an expression node with children: {type(e).__name__}")
