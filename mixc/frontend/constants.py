"""The one constant folder: the value of an expression where it is known before the inputs are.

Every stage folds constants, and all of them fold with `Folder`, so that they agree on what is
constant and what its value is. They differ only in the arithmetic the folder applies to the
operands' values at each node:

- the verifier (`Constants`) computes in float64 as the generated code does and refuses what
  gives no finite real number. A spec can write such constants: `H_{t-1} / 0`, `2^1024`,
  `exp(1000)`, `(0 - 1)^0.5`, or `1 / x` in a let that is called as `f(0)`. Left alone, the
  analysis divides by zero, and the generated module fails or returns inf and NaN when called.
  It raises a located `SpecAnalysisError` at the node whose value stops being a finite real: a
  division by zero, an overflow, a negative base to a fractional power, a function outside its
  domain. It also knows what holds whatever the inputs: a product with 0 is 0, so
  `1 / (0 H_{t-1})` divides by zero at every token.
- the analysis and the code generator (`constant`, `FLOATS`) want the value of an expression of
  numbers only, and None for anything else, a value that is not a finite real included (the
  generated code then computes it as written). A folder remembers each node's value, so that
  asking at every level of an expression, as the emitter does, costs the expression's size:
  walking each level's whole subtree again made a product of 40 sums take 5 s to compile.
- `mixc.nn` evaluates a decay's log and a default at every head on float64 tensors (an
  arithmetic of its own, since torch is not imported here).

The folder is iterative, so a deep expression needs no deep recursion; only a let call folds its
body in a frame of its own, and lets nest no deeper than a spec's depth limit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Generic, Protocol, TypeVar

from mixc.errors import SpecAnalysisError
from mixc.frontend.builtins import BUILTINS
from mixc.frontend.ir import (
    Binary,
    Call,
    Expr,
    LetFn,
    Name,
    Neg,
    Number,
    Timed,
    Transpose,
    children,
    walk,
)
from mixc.frontend.limits import brief

__all__ = [
    "FLOATS",
    "HEADS_CHECKED",
    "Arithmetic",
    "Constants",
    "Folder",
    "Undefined",
    "constant",
    "refuse_undefined",
]

#: A parameter default that reads the head index h is checked at heads 0 to HEADS_CHECKED - 1.
HEADS_CHECKED = 64

_HINT = "constants are computed in float64, whose numbers are finite and at most about 1.8e308"

V = TypeVar("V")


class Undefined(Exception):  # noqa: N818 - a signal between an arithmetic and the folder
    """An arithmetic's answer where a node has no value that is a finite real: `why` completes
    the sentence that begins with the node ("divides by zero"); `hint`, when given, replaces the
    folder's."""

    def __init__(self, why: str, hint: str | None = None) -> None:
        super().__init__(why)
        self.why = why
        self.hint = hint


class Arithmetic(Protocol[V]):
    """What a folder applies at each node, given its operands' values; None is a value not known
    before the inputs are (an operand may be None). A method raises `Undefined` where the node
    has no value at all, or returns None to leave it unknown."""

    def number(self, e: Number) -> V: ...

    def call(self, e: Call, args: tuple[V | None, ...]) -> V | None: ...

    def binary(self, e: Binary, left: V | None, right: V | None) -> V | None: ...


class Folder(Generic[V]):
    """Folds expressions of one mixer with `arithmetic`: numbers, negation, transposes (the same
    entries), built-in calls and operations, and let calls (the body folded with the arguments'
    values, once per let and distinct values). A name, an input or a state is `env`'s value for
    its name, or unknown; I is unknown.

    `value(e)` remembers the value of every node below `e` by the node's id (holding the node,
    so that its id is not reused), so that asking again at any level costs nothing; with an
    `env`, it remembers them for that call only."""

    def __init__(self, arithmetic: Arithmetic[V], lets: Iterable[LetFn] = ()) -> None:
        self.arithmetic = arithmetic
        self.lets = {fn.name: fn for fn in lets}
        self._known: dict[int, tuple[Expr, V | None]] = {}
        self._calls: dict[tuple[str, tuple], V | None] = {}

    def value(self, e: Expr, env: Mapping[str, V] | None = None) -> V | None:
        """The value of `e`, None where it is not known before the inputs are. Raises a located
        SpecAnalysisError where the arithmetic finds no value (`Undefined`)."""
        if env:
            return self._fold(e, env, {}, None)
        hit = self._known.get(id(e))  # the emitter asks again and again: answer at once
        if hit is not None and hit[0] is e:
            return hit[1]
        return self._fold(e, {}, self._known, None)

    def _fold(
        self,
        e: Expr,
        env: Mapping[str, V],
        known: dict[int, tuple[Expr, V | None]],
        call: Call | None,
    ) -> V | None:
        """`e` folded bottom up, left operands first (so the first undefined node a person reads
        is the one refused), every node's value kept in `known`. `call` is the let call whose
        arguments `env` binds, named by an error that depends on them."""
        # (node, None) to fold, (node, its operands) once they are folded
        pending: list[tuple[Expr, tuple[Expr, ...] | None]] = [(e, None)]
        while pending:
            node, kids = pending.pop()
            if kids is None:
                hit = known.get(id(node))
                if hit is not None and hit[0] is node:
                    continue
                kids = children(node)
                if kids:  # its operands first, the left ones first
                    pending.append((node, kids))
                    pending.extend((k, None) for k in reversed(kids))
                    continue
            try:
                value = self._node(node, [known[id(k)][1] for k in kids], env)
            except Undefined as exc:
                raise _UndefinedError(exc.why, node, exc.hint or _call_hint(call)) from None
            known[id(node)] = (node, value)
        return known[id(e)][1]

    def _node(self, e: Expr, operands: list[V | None], env: Mapping[str, V]) -> V | None:
        """The value of `e` from its operands' values."""
        if isinstance(e, Number):
            return self.arithmetic.number(e)
        if isinstance(e, Name | Timed):
            return env.get(e.name)
        if isinstance(e, Neg):
            return None if operands[0] is None else -operands[0]
        if isinstance(e, Transpose):
            return operands[0]
        if isinstance(e, Call):
            if e.func in self.lets:
                return self._let(e, tuple(operands))
            return self.arithmetic.call(e, tuple(operands))
        if isinstance(e, Binary):
            return self.arithmetic.binary(e, *operands)
        return None  # I: its size, and so its value, comes from where it is used

    def _let(self, e: Call, args: tuple[V | None, ...]) -> V | None:
        """A let call: its body folded with the arguments' values, once per distinct values."""
        key = (e.func, args)
        if key not in self._calls:
            fn = self.lets[e.func]
            env = {name: a for name, a in zip(fn.args, args, strict=False) if a is not None}
            self._calls[key] = self._fold(fn.body, env, {}, e if env else None)
        return self._calls[key]


# ----------------------------------------------------------------------------- float64


def _call(e: Call, args: tuple[float | None, ...]) -> float | None:
    """A built-in at numbers, with its float version (`mixc.frontend.builtins`); None for one
    that is not a function of a number (l2norm, diag) or an argument not known."""
    builtin = BUILTINS.get(e.func)
    if builtin is None or builtin.evaluate is None or len(args) != builtin.arity or None in args:
        return None
    value = builtin.evaluate(*args)
    if math.isnan(value):
        at = ", ".join(f"{x:g}" for x in args)
        raise Undefined(f"is not a real number: {at} is outside the domain of {e.func}")
    return _finite(value)


def _binary(e: Binary, left: float | None, right: float | None) -> float | None:
    """An operation on numbers, as float64 computes it; a division by 0 is refused whatever
    the dividend."""
    if e.op == "/" and right == 0:
        raise Undefined("divides by zero")
    if left is None or right is None:
        return None
    if e.op == "^":
        if left == 0 and right < 0:
            raise Undefined("divides by zero (0 to a negative power)")
        if left < 0 and not right.is_integer():
            raise Undefined("is not a real number: a negative base to a fractional power")
        try:
            value = left**right
        except OverflowError:
            value = math.inf
    elif e.op == "+":
        value = left + right
    elif e.op == "-":
        value = left - right
    elif e.op == "/":
        value = left / right
    else:  # "*" and "@" (of scalars; "." takes vectors, never constants)
        value = left * right
    return _finite(value)


def _finite(value: float) -> float:
    if math.isinf(value):
        raise Undefined(f"is not finite: it is {value} in float64")
    return value


class _Floats:
    """float64 arithmetic on numbers: the value of an expression of numbers only, None for
    anything else, and None where the value is not a finite real (`1 / 0`, `exp(1000)`): the
    generated code computes such a node as written, and the verifier has refused any the spec
    writes."""

    def number(self, e: Number) -> float:
        return float(e.text)

    def call(self, e: Call, args: tuple[float | None, ...]) -> float | None:
        try:
            return _call(e, args)
        except Undefined:
            return None

    def binary(self, e: Binary, left: float | None, right: float | None) -> float | None:
        try:
            return _binary(e, left, right)
        except Undefined:
            return None


FLOATS = _Floats()


def constant(e: Expr) -> float | None:
    """The value of an expression of numbers only, None for anything else or where the value is
    not a finite real. To ask at every node of a tree, keep a `Folder(FLOATS)` instead."""
    return Folder(FLOATS).value(e)


class _Checks:
    """float64 arithmetic that refuses every value that is not a finite real (`Undefined`), and
    knows what holds whatever the inputs: a product with 0 is 0 in every entry, at every token,
    and so is 0 divided by anything."""

    def number(self, e: Number) -> float:
        return float(e.text)

    def call(self, e: Call, args: tuple[float | None, ...]) -> float | None:
        return _call(e, args)

    def binary(self, e: Binary, left: float | None, right: float | None) -> float | None:
        if e.op == "/" and right == 0 and any(isinstance(n, Timed) for n in walk(e.right)):
            raise Undefined(
                f"divides by zero: {brief(e.right)} is 0 whatever the inputs and states",
                "a product with 0 is 0 in every entry, at every token",
            )
        if (left is None or right is None) and (
            (e.op in "*@." and 0 in (left, right)) or (e.op == "/" and left == 0)
        ):
            return 0.0  # `1 / (0 H_{t-1})` divides by zero at every token
        return _binary(e, left, right)


_CHECKS = _Checks()


class Constants:
    """The verifier's folder: `check` raises at the first value of a mixer's expressions that
    is not a finite real."""

    def __init__(self, lets: tuple[LetFn, ...]) -> None:
        self.folder = Folder(_CHECKS, lets)

    def check(self, e: Expr) -> float | None:
        """Fold `e` (a let's body, a default or an equation's value); its value, or None."""
        return self.folder.value(e)

    def check_heads(self, e: Expr, name: str, heads: int = HEADS_CHECKED) -> None:
        """A parameter's default `e` that reads the head index h, folded at each head
        h = 0, ..., heads - 1 (every module has head 0, most have several): raises at the first
        head where its value is not a finite real (`1 / h`, `sqrt(h - 1)`)."""
        if not any(isinstance(n, Name) and n.name == "h" for n in walk(e)):
            return
        for head in range(heads):
            try:
                self.folder.value(e, {"h": float(head)})
            except _UndefinedError as exc:
                inside = exc.span.line != e.span.line  # in a let the default calls
                where = f"in the default {brief(e)} at line {e.span.line}: " if inside else ""
                raise SpecAnalysisError(
                    f"the default of {name} is not finite at head h = {head}: {exc.message}",
                    exc.span,
                    expected=f"a default finite at every head h = 0, 1, ... (checked up to "
                    f"h = {heads - 1})",
                    hint=f"{where}every head computes the default with its own h, starting at "
                    "0; shift or bound h (1 / (h + 1), sqrt(h + 1), log(h + 2))",
                ) from None


def refuse_undefined(e: Binary | Call, written: Expr) -> None:
    """Raise where `e`, whose operands are literals or not constant, has no finite value; the
    error names `written`, the expression `e` was made from.

    For the analysis, which builds expressions of its own: a canonical form may hold a constant
    the spec does not write (`H / (a_t - a_t)` divides by 0, `exp(1000 + a_t - a_t)` is
    exp(1000)). Only the operands are looked at, so checking each node the analysis builds costs
    what building it does."""
    operands = e.args if isinstance(e, Call) else (e.left, e.right)
    values = tuple(_literal(x) for x in operands)
    try:
        if isinstance(e, Call):
            _CHECKS.call(e, values)
        else:
            _CHECKS.binary(e, *values)
    except Undefined as exc:
        raise SpecAnalysisError(
            f"{brief(written)} {exc.why}",
            written.span,
            hint=f"{brief(written)} is {brief(e)} once simplified, whatever the inputs",
        ) from None


def _literal(e: Expr) -> float | None:
    """The value of a number or a negated number, else None."""
    if isinstance(e, Neg):
        value = _literal(e.operand)
        return None if value is None else -value
    return float(e.text) if isinstance(e, Number) else None


class _UndefinedError(SpecAnalysisError):
    """A constant with no finite value: the node `e`, what is wrong with it and a hint."""

    def __init__(self, why: str, e: Expr, hint: str) -> None:
        super().__init__(f"{brief(e)} {why}", e.span, hint=hint)


def _call_hint(call: Call | None) -> str:
    """The hint of an error; when it depends on the constants a let call passes, it names the
    call, which is where the spec would change."""
    if call is None:
        return _HINT
    where = f" at line {call.span.line}" if call.span else ""
    return f"in the call {brief(call)}{where}; {_HINT}"
