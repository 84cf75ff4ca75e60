"""Shapes of spec expressions: the Typer and the rules of each operator.

Shapes are two-dimensional: a scalar is (1, 1), a vector x[K] is the column (K, 1), x^T the row
(1, K), a matrix H[V, K] is (V, K). `I` has the shape its context needs.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, fields, is_dataclass
from types import MappingProxyType

from mixc.errors import SpecShapeError
from mixc.frontend.builtins import ROTATIONS
from mixc.frontend.ir import (
    CHANNEL,
    FUNCTIONS,
    POSITION,
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
)

__all__ = [
    "IDENTITY",
    "SCALAR",
    "Shape",
    "Symbol",
    "Typer",
    "declared",
    "show",
    "symbols_of",
]

Shape = tuple[str, str]
SCALAR: Shape = ("1", "1")
IDENTITY: Shape = ("I", "I")  # square, size from context


def show(shape: Shape) -> str:
    """A shape as a person writes it: scalar, [K], [K]^T, [V, K]."""
    if shape == SCALAR:
        return "scalar"
    if shape == IDENTITY:
        return "I"
    if shape[1] == "1":
        return f"[{shape[0]}]"
    if shape[0] == "1":
        return f"[{shape[1]}]^T"
    return f"[{shape[0]}, {shape[1]}]"


def declared(dims: tuple[str, ...]) -> Shape:
    if len(dims) == 0:
        return SCALAR
    if len(dims) == 1:
        return (dims[0], "1")
    return (dims[0], dims[1])


@dataclass(frozen=True)
class Symbol:
    kind: str  # "input" | "param" | "state" | "value" | "arg" | "let"
    shape: Shape


class Typer:
    """Shapes of expressions in one mixer. `shape_of` raises located errors on mismatches.

    A plan's Typer is frozen once the analysis has built it (`freeze`): the backends and tools
    that read the plan, perhaps several at once, leave it as they found it."""

    def __init__(self, mixer: Mixer, symbols: dict[str, Symbol]) -> None:
        self.mixer = mixer
        self.symbols = symbols
        self.lets = {fn.name: fn for fn in mixer.lets}
        # Shapes outside let bodies, by the id of the expression (held, so that its id is not
        # reused). The analysis and the code generator ask for the shape of every node of a
        # tree, which without this costs its size times its depth.
        self._known: dict[int, tuple[Expr, Shape]] = {}
        self._frozen = False

    def freeze(self, *held: object) -> None:
        """Type every expression `held` holds, then keep the symbols and the shapes found, and
        no more: a shape not found yet is computed each time it is asked for.

        `held` is what the backends will ask the shapes of: expressions, in dataclasses,
        tuples, lists and dicts (a plan's facts). Typed here, each node once, asking at every
        level of a large one costs nothing later; the code generator's own nodes, built over
        these, cost a step or two each."""
        for e in _expressions(held):
            self.shape_of(e)
        self.symbols = MappingProxyType(dict(self.symbols))
        self._frozen = True

    def shape_of(self, e: Expr, env: dict[str, Shape] | None = None) -> Shape:
        if not env:
            known = self._known.get(id(e))
            if known is not None and known[0] is e:
                return known[1]
        shape = self._shape(e, env or {})
        if not env and not self._frozen:
            self._known[id(e)] = (e, shape)
        return shape

    def _shape(self, e: Expr, env: dict[str, Shape]) -> Shape:
        if isinstance(e, Number):
            return SCALAR
        if isinstance(e, Identity):
            return IDENTITY
        if isinstance(e, Name):
            if e.name in env:
                return env[e.name]
            if e.name in ("h", CHANNEL):
                return SCALAR
            return self.symbols[e.name].shape
        if isinstance(e, Timed):
            return self.symbols[e.name].shape
        if isinstance(e, Neg):
            return self.shape_of(e.operand, env)
        if isinstance(e, Transpose):
            a = self.shape_of(e.operand, env)
            return (a[1], a[0])
        if isinstance(e, Call):
            return self._call(e, env)
        assert isinstance(e, Binary)
        a, b = self.shape_of(e.left, env), self.shape_of(e.right, env)
        return _BINARY_RULES[e.op](e, a, b)

    def _call(self, e: Call, env) -> Shape:
        args = [self.shape_of(a, env) for a in e.args]
        if e.func in self.lets:
            fn = self.lets[e.func]
            if len(args) != len(fn.args):
                raise SpecShapeError(
                    f"{fn.name} takes {_count(len(fn.args), 'argument')}, got {len(args)}",
                    e.span,
                    expected=f"{fn.name}({', '.join(fn.args)})",
                )
            return self.shape_of(fn.body, dict(zip(fn.args, args, strict=True)))
        arity = FUNCTIONS[e.func]
        if len(args) != arity:
            raise SpecShapeError(
                f"{e.func} takes {_count(arity, 'argument')}, got {len(args)}",
                e.span,
                expected=f"{e.func}({', '.join('xyz'[:arity])})",
            )
        if e.func in ROTATIONS:
            return _rotation(e, args[0], args[1])
        if arity == 2:  # max, min: elementwise, broadcasting as * does
            pair = Binary("*", e.args[0], e.args[1], span=e.span)
            return _same_or_broadcast(pair, args[0], args[1], f"take the {e.func} of")
        (a,) = args
        if e.func == "diag":
            if "1" not in a or a in (SCALAR, IDENTITY):
                raise SpecShapeError(
                    f"diag needs a vector, got {show(a)}", e.span, expected="diag(g_t) with g[K]"
                )
            n = a[0] if a[1] == "1" else a[1]
            return (n, n)
        if e.func in ("l2norm", "softmax", "onehot_argmax") and ("1" not in a or a == SCALAR):
            raise SpecShapeError(f"{e.func} needs a vector, got {show(a)}", e.span)
        if a == IDENTITY:
            raise SpecShapeError(f"{e.func}(I) is not defined", e.span, hint="write I on its own")
        return SCALAR if e.func == "sum" else a


def _rotation(e: Call, x: Shape, theta: Shape) -> Shape:
    """rotate(x, theta): x a column [d], theta a column of angles [p], p <= d / 2 (the leading
    2p entries turn) or p = d (the first d / 2 angles are read)."""
    column = "a column vector"
    for arg, shape in zip(e.args, (x, theta), strict=True):
        if shape[1] != "1" or shape in (SCALAR, IDENTITY) or shape[0] == "1":
            raise SpecShapeError(
                f"{e.func} needs two column vectors, got {arg} {show(shape)}",
                arg.span or e.span,
                expected=f"{e.func}(x, theta): x {column} [K], theta the angles [P] of its pairs",
                hint=f"turn the column and transpose after: {e.func}(k_t, theta)^T",
            )
    d, p = x[0], theta[0]
    if d.isdigit() and p.isdigit() and p != d and 2 * int(p) > int(d):
        raise SpecShapeError(
            f"{e.func} of a vector [{d}] by {p} angles: a pair takes one angle",
            e.args[1].span or e.span,
            expected=f"at most {int(d) // 2} angles (the leading pairs turn), or {d}",
        )
    return x


def _expressions(held: object) -> Iterator[Expr]:
    """The expressions in `held`, found through the fields of dataclasses and the items of
    tuples, lists, sets and dicts (their values); one held in two places is found twice."""
    stack = [held]
    while stack:
        x = stack.pop()
        if isinstance(x, Expr):
            yield x
        elif isinstance(x, tuple | list | set | frozenset):
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
        else:
            stack.extend([getattr(x, name) for name in _field_names(type(x))])


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    """The fields of a dataclass; none for any other type."""
    return tuple(f.name for f in fields(cls)) if is_dataclass(cls) else ()


def _same_or_broadcast(e: Binary, a: Shape, b: Shape, what: str) -> Shape:
    if a == IDENTITY and b == IDENTITY:
        return IDENTITY
    if a == IDENTITY or b == IDENTITY:
        other = b if a == IDENTITY else a
        if other[0] == other[1] and other != SCALAR:
            return other
        raise SpecShapeError(
            f"cannot {what} I and {show(other)}: I is square, so its size cannot match",
            e.span,
        )
    if a == b or b == SCALAR:
        return a
    if a == SCALAR:
        return b
    out = []
    for x, y in zip(a, b, strict=True):
        if x != y and "1" not in (x, y):
            raise SpecShapeError(
                f"cannot {what} {e.left} {show(a)} and {e.right} {show(b)}",
                e.span,
                expected="operands of the same shape, or one that broadcasts "
                "(a scalar, row or column)",
                hint=_transpose_hint(e, a, b),
            )
        out.append(y if x == "1" else x)
    return (out[0], out[1])


def _transpose_hint(e: Binary, a: Shape, b: Shape) -> str | None:
    if a == (b[1], b[0]):
        fixed = Binary(e.op, e.left, Transpose(e.right))
        return f"{e.right} is {show(b)}, the transpose of {show(a)}; did you mean {fixed}?"
    return None


def _count(n: int | str, word: str) -> str:
    return f"{n} {word}" + ("" if str(n) == "1" else "s")


def _add(e, a, b):
    return _same_or_broadcast(e, a, b, "add" if e.op == "+" else "subtract")


def _hadamard(e, a, b):
    return _same_or_broadcast(e, a, b, "multiply elementwise")


def _div(e, a, b):
    if b == IDENTITY:
        raise SpecShapeError("cannot divide by I", e.span)
    return _same_or_broadcast(e, a, b, "divide")


def _pow(e, a, b):
    if b != SCALAR:
        raise SpecShapeError(f"the exponent must be a scalar, got {show(b)}", e.right.span)
    return a


def _matmul(e, a, b):
    if a == SCALAR:
        return b
    if b == SCALAR:
        return a
    if a == IDENTITY:
        return b if b == IDENTITY else (b[0], b[1])
    if b == IDENTITY:
        return a
    if a[1] != b[0]:
        hint = _transpose_hint(e, a, b)
        if a[1] == "1" and b[1] == "1":
            fixed = Binary("@", e.left, Transpose(e.right))
            hint = f"{e.left} and {e.right} are both vectors; did you mean {fixed}?"
            if a[0] == b[0]:
                both = Binary("*", e.left, e.right)
                hint = (
                    f"{e.left} and {e.right} are both vectors {show(a)}; did you mean {both} "
                    f"(elementwise, {show(a)}) or {fixed} (an outer product, {show((a[0], a[0]))})?"
                )
        elif b[1] == "1" and a[1] != "1" and a[0] == b[0]:
            fixed = Binary("@", Transpose(e.left), e.right)
            hint = f"{e.right} has as many rows as {e.left}; did you mean {fixed}?"
        elif a[0] == "1" and b[0] == "1":
            fixed = Binary("@", Transpose(e.left), e.right)
            hint = f"did you mean {fixed}? or use . for a dot product"
        raise SpecShapeError(
            f"cannot multiply {e.left} {show(a)} by {e.right} {show(b)}",
            e.span,
            expected=f"a matrix product whose inner sizes agree ({e.left} has "
            f"{_count(a[1], 'column')}, {e.right} has {_count(b[0], 'row')})",
            hint=hint,
        )
    out = (a[0], b[1])
    return out


def _dot(e, a, b):
    def vec(s):
        return s != SCALAR and s != IDENTITY and "1" in s

    if not (vec(a) and vec(b)):
        raise SpecShapeError(
            f"a dot product needs two vectors, got {show(a)} . {show(b)}",
            e.span,
            hint=f"for a matrix product, write them side by side: {Binary('@', e.left, e.right)}",
        )
    n, m = (a[0] if a[1] == "1" else a[1]), (b[0] if b[1] == "1" else b[1])
    if n != m:
        raise SpecShapeError(f"dot product of vectors of sizes {n} and {m}", e.span)
    return SCALAR


_BINARY_RULES = {
    "+": _add,
    "-": _add,
    "*": _hadamard,
    "/": _div,
    "@": _matmul,
    ".": _dot,
    "^": _pow,
}


def symbols_of(mixer: Mixer) -> dict[str, Symbol]:
    """Declared names (inputs, params, states, lets) and equation targets, with their kinds."""
    symbols: dict[str, Symbol] = {}
    for kind, decls in (("input", mixer.inputs), ("param", mixer.params), ("state", mixer.states)):
        for d in decls:
            symbols[d.name] = Symbol(kind, declared(d.shape))
    for fn in mixer.lets:
        symbols[fn.name] = Symbol("let", SCALAR)
    for d in (*mixer.inputs, *mixer.params, *mixer.states):
        for size in d.shape:  # a size read as a number: sum(o_t^2) / V
            if not size.isdigit() and size not in symbols:
                symbols[size] = Symbol("size", SCALAR)
    symbols[POSITION] = Symbol("position", SCALAR)
    return symbols
