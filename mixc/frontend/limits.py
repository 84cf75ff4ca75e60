"""How large a spec may grow inside the compiler, and the error for one that grows larger.

The parser bounds a spec's text (`MAX_SPEC_BYTES`) and how deeply it nests (`MAX_DEPTH`), but
not what the compiler makes of it. Inlining copies a let's body into every call, so a let that
calls another twice doubles with each level; expanding multiplies sums out, so a product of n
sums of two terms has 2^n terms. A spec of a few hundred bytes could keep the compiler busy for
ever. The limits below bound that work, so that every spec the parser accepts is answered in
seconds; each is far above what a real mixer needs (the shipped and random specs stay below a
tenth of every one), and a spec that reaches one is refused with a located `SpecSizeError`.
"""

from __future__ import annotations

import functools
import sys

from mixc.errors import Span, SpecAnalysisError
from mixc.frontend.ir import Call, Expr, Name, Timed, children, walk

__all__ = [
    "MAX_FACTORS",
    "MAX_INLINED_NODES",
    "MAX_TERMS",
    "InlinedSizes",
    "SpecSizeError",
    "brief",
    "with_recursion_room",
]

#: Nodes an expression may have once its let calls and per-token values are inlined (the
#: analysis and the code generator work on the inlined tree).
MAX_INLINED_NODES = 10_000

#: Terms an expansion may hold (`mixc.algebra.expand`): a product's before its like terms are
#: collected (the work of multiplying it out), a sum's after.
MAX_TERMS = 100

#: Factors (scalars, matrices and gates) one expanded term may have.
MAX_FACTORS = 100


#: Python frames the compiler may stack above its caller's. The parser, analysis and code
#: generator recurse over expressions, a few frames a level (a canonical form nested in a call
#: nested in a canonical form...), so a spec nested MAX_DEPTH deep takes about 1,000: as many as
#: CPython allows a whole program by default, which a caller already deep in its own stack (a
#: test runner, a notebook, a training script) has partly used.
RECURSION_ROOM = 4_000


def with_recursion_room(fn):
    """fn, run with RECURSION_ROOM frames of recursion left above the caller's (the interpreter's
    limit raised for the call where it is lower, and put back after it unless the call changed
    it), so that whether a deep spec is answered does not depend on where it is compiled from."""

    @functools.wraps(fn)
    def roomy(*args, **kwargs):
        depth, frame = 0, sys._getframe()
        while frame is not None:
            depth, frame = depth + 1, frame.f_back
        limit, wanted = sys.getrecursionlimit(), depth + RECURSION_ROOM
        if limit >= wanted:
            return fn(*args, **kwargs)
        sys.setrecursionlimit(wanted)
        try:
            return fn(*args, **kwargs)
        finally:
            if sys.getrecursionlimit() == wanted:
                sys.setrecursionlimit(limit)

    return roomy


class SpecSizeError(SpecAnalysisError):
    """An expression grows beyond one of the limits above, or a constant beyond float64.

    Raised where the growth is found; that node may be one the analysis built (a canonical
    form), without a place in the spec. `at` then gives it the place of the expression being
    analysed, so that the error always points into the spec."""

    def __init__(self, message: str, span: Span | None = None, **kwargs) -> None:
        super().__init__(message, span, **kwargs)
        self.placed = span is not None

    def at(self, span: Span | None) -> SpecSizeError:
        """This error, placed at `span` unless it has a place already."""
        if not self.placed and span is not None:
            self.span, self.placed = span, True
            self.args = (self.render(),)
        return self


def brief(e: Expr, width: int = 60) -> str:
    """`e` as spec text, cut to about `width` characters: an error names an expression that may
    be a whole 60 KB line."""
    text = str(e)
    return text if len(text) <= width else text[: width - 5].rstrip() + " ..."


class InlinedSizes:
    """How many nodes expressions have once let calls and per-token values are inlined, found
    without inlining them (which is what the limit protects against).

    A let's inlined size is linear in the sizes of its arguments: `base + sum(count_i *
    size(arg_i))`, where count_i is how often argument i appears in the inlined body. Each let is
    reduced to that form once, each per-token value to its size once, so a whole spec is sized in
    time linear in its text however much inlining would multiply it.
    """

    def __init__(self) -> None:
        self.lets: dict[str, tuple[int, tuple[int, ...]]] = {}  # name -> (base, count per arg)
        self.values: dict[str, int] = {}  # per-token value -> its inlined size

    def add_let(self, name: str, args: tuple[str, ...], body: Expr) -> None:
        """Reduce a let (whose callees were added before it) to its linear form, in one walk of
        its body however many arguments it has."""
        base, counts = self._linear(body, dict.fromkeys(args))
        self.lets[name] = (base, tuple(counts.get(a, 0) for a in args))

    def add_value(self, name: str, size: int) -> None:
        self.values[name] = size

    def size(self, e: Expr, env: dict[str, int] | None = None) -> int:
        """Nodes of `e` inlined; `env` gives the size of each let argument in scope. A let or
        value not added yet counts as one node."""
        env = env or {}
        base, counts = self._linear(e, env)
        return base + sum(n * env[a] for a, n in counts.items())

    def _linear(self, e: Expr, args) -> tuple[int, dict[str, int]]:
        """`e`'s inlined size as `base + sum(counts[a] * size(a))` over the names `a` in `args`:
        each node of `e` is visited once, with how many copies of it inlining makes."""
        base, counts = 0, {}
        stack = [(e, 1)]
        while stack:
            node, copies = stack.pop()
            if isinstance(node, Name) and node.name in args:
                counts[node.name] = counts.get(node.name, 0) + copies
            elif isinstance(node, Timed) and node.offset == 0 and node.name in self.values:
                base += copies * self.values[node.name]
            elif isinstance(node, Call) and node.func in self.lets:
                let_base, let_counts = self.lets[node.func]
                base += copies * let_base
                stack.extend(
                    (a, copies * c) for c, a in zip(let_counts, node.args, strict=False) if c
                )
            else:
                base += copies
                stack.extend((c, copies) for c in children(node))
        return base, counts

    def check(self, e: Expr, what: str, env: dict[str, int] | None = None) -> int:
        """The inlined size of `e`; raises SpecSizeError at the smallest part of `e` over the
        limit. `what` says what is inlined ("lets", "lets and per-token values")."""
        size = self.size(e, env)
        if size <= MAX_INLINED_NODES:
            return size
        node, got = e, size
        while True:
            over = [(c, n) for c in children(node) if (n := self.size(c, env)) > MAX_INLINED_NODES]
            if not over:
                break
            (node, got), *_ = over
        written = sum(1 for _ in walk(node))
        if written > MAX_INLINED_NODES:
            message = f"it has {got:,} nodes"
            hint = "split the spec's work into fewer, shorter expressions"
        else:
            message = f"with its {what} inlined it has {got:,} nodes"
            hint = (
                "every call of a let copies its body, and every use of a per-token value its "
                "definition, so a let that calls another twice doubles with each level: call "
                "each let once, or nest fewer levels"
            )
        raise SpecSizeError(
            f"{brief(node)} is too large to analyse: {message} (the limit is "
            f"{MAX_INLINED_NODES:,})",
            node.span or e.span,
            hint=hint,
        )
