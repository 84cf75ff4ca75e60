"""The constants of a spec, computed as the generated code computes them, and refused where
that gives no finite real number.

A spec can write constants no module can compute: `H_{t-1} / 0`, `2^1024`, `exp(1000)`,
`(0 - 1)^0.5`, or `1 / x` in a let that is called as `f(0)`. Left alone, the analysis divides by
zero, and the generated module fails or returns inf and NaN when called. `Constants` folds every
constant subexpression in float64 with the built-ins' float versions (`mixc.frontend.builtins`),
binding a let's arguments to the constants a call passes, and raises a located
`SpecAnalysisError` at the node whose value stops being a finite real: a division by zero, an
overflow, a negative base to a fractional power, a function outside its domain.
"""

from __future__ import annotations

import math

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
    walk,
)
from mixc.frontend.limits import brief

__all__ = ["HEADS_CHECKED", "Constants", "refuse_undefined"]

#: A parameter default that reads the head index h is checked at heads 0 to HEADS_CHECKED - 1.
HEADS_CHECKED = 64

_HINT = "constants are computed in float64, whose numbers are finite and at most about 1.8e308"

#: A value while folding: a float, or None for one not known before the inputs are.
Value = float | None


class Constants:
    """Folds the constant parts of a mixer's expressions. `check` raises at the first value that
    is not a finite real."""

    def __init__(self, lets: tuple[LetFn, ...]) -> None:
        self.lets = {fn.name: fn for fn in lets}
        self.known: dict[tuple[str, tuple[Value, ...]], Value] = {}

    def check(self, e: Expr) -> Value:
        """Fold `e` (a let's body, a default or an equation's value); its value, or None."""
        return self._fold(e, {}, None)

    def check_heads(self, e: Expr, name: str, heads: int = HEADS_CHECKED) -> None:
        """A parameter's default `e` that reads the head index h, folded at each head
        h = 0, ..., heads - 1 (every module has head 0, most have several): raises at the first
        head where its value is not a finite real (`1 / h`, `sqrt(h - 1)`)."""
        if not any(isinstance(n, Name) and n.name == "h" for n in walk(e)):
            return
        for head in range(heads):
            try:
                self._fold(e, {"h": float(head)}, None)
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

    def _fold(self, e: Expr, env: dict[str, Value], call: Call | None) -> Value:
        """`e` folded with let arguments bound by `env`; `call` is the let call whose arguments
        they are (named in an error that depends on them)."""
        if isinstance(e, Number):
            return float(e.text)
        if isinstance(e, Name):
            return env.get(e.name)
        if isinstance(e, Neg):
            value = self._fold(e.operand, env, call)
            return None if value is None else -value
        if isinstance(e, Transpose):
            return self._fold(e.operand, env, call)
        if isinstance(e, Call):
            args = tuple(self._fold(a, env, call) for a in e.args)
            if e.func in self.lets:
                return self._let(e, args)
            return self._builtin(e, args, call)
        if isinstance(e, Binary):
            left, right = self._fold(e.left, env, call), self._fold(e.right, env, call)
            return self._binary(e, left, right, call)
        return None  # a per-token value, a state, I: known only at run time

    def _let(self, e: Call, args: tuple[Value, ...]) -> Value:
        """A let call: its body folded with the arguments' values, once per distinct values."""
        key = (e.func, args)
        if key not in self.known:
            fn = self.lets[e.func]
            env = dict(zip(fn.args, args, strict=False))
            self.known[key] = self._fold(
                fn.body, env, e if any(a is not None for a in args) else None
            )
        return self.known[key]

    def _builtin(self, e: Call, args: tuple[Value, ...], call: Call | None) -> Value:
        evaluate = BUILTINS[e.func].evaluate if e.func in BUILTINS else None
        if evaluate is None or len(args) != BUILTINS[e.func].arity or None in args:
            return None
        value = evaluate(*args)
        if math.isnan(value):
            at = ", ".join(f"{x:g}" for x in args)
            why = f"is not a real number: {at} is outside the domain of {e.func}"
            raise _error(why, e, call)
        return _finite(value, e, call)

    def _binary(self, e: Binary, left: Value, right: Value, call: Call | None) -> Value:
        if e.op == "/" and right == 0:
            if any(isinstance(n, Timed) for n in walk(e.right)):  # a product with 0
                raise _UndefinedError(
                    f"divides by zero: {brief(e.right)} is 0 whatever the inputs and states",
                    e,
                    "a product with 0 is 0 in every entry, at every token",
                )
            raise _error("divides by zero", e, call)
        if e.op == "^" and left == 0 and right is not None and right < 0:
            raise _error("divides by zero (0 to a negative power)", e, call)
        if left is None or right is None:
            # a product with a 0 (or 0 divided by anything) is 0 in every entry, whatever the
            # other operand: `1 / (0 H_{t-1})` divides by zero at every token
            if (e.op in "*@." and 0 in (left, right)) or (e.op == "/" and left == 0):
                return 0.0
            return None
        if e.op == "^":
            if left < 0 and not right.is_integer():
                why = "is not a real number: a negative base to a fractional power"
                raise _error(why, e, call)
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
        return _finite(value, e, call)


def refuse_undefined(e: Binary | Call, written: Expr) -> None:
    """Raise where `e`, whose operands are literals or not constant, has no finite value; the
    error names `written`, the expression `e` was made from.

    For the analysis, which builds expressions of its own: a canonical form may hold a constant
    the spec does not write (`H / (a_t - a_t)` divides by 0, `exp(1000 + a_t - a_t)` is
    exp(1000)). Only the operands are looked at, so checking each node the analysis builds costs
    what building it does."""
    operands = e.args if isinstance(e, Call) else (e.left, e.right)
    values = tuple(_literal(x) for x in operands)
    folder = Constants(())
    try:
        if isinstance(e, Call):
            folder._builtin(e, values, None)
        else:
            folder._binary(e, *values, None)
    except _UndefinedError as exc:
        raise SpecAnalysisError(
            f"{brief(written)} {exc.why}",
            written.span,
            hint=f"{brief(written)} is {brief(e)} once simplified, whatever the inputs",
        ) from None


def _literal(e: Expr) -> Value:
    """The value of a number or a negated number, else None."""
    if isinstance(e, Neg):
        value = _literal(e.operand)
        return None if value is None else -value
    return float(e.text) if isinstance(e, Number) else None


def _finite(value: float, e: Expr, call: Call | None) -> float:
    if math.isinf(value):
        raise _error(f"is not finite: it is {value} in float64", e, call)
    return value


class _UndefinedError(SpecAnalysisError):
    """A constant with no finite value: `e` and `why` ("divides by zero", ...)."""

    def __init__(self, why: str, e: Expr, hint: str) -> None:
        super().__init__(f"{brief(e)} {why}", e.span, hint=hint)
        self.why = why


def _error(why: str, e: Expr, call: Call | None) -> _UndefinedError:
    """The error at `e`; when it depends on the constants a let call passes, the hint names the
    call, which is where the spec would change."""
    hint = _HINT
    if call is not None:
        where = f" at line {call.span.line}" if call.span else ""
        hint = f"in the call {brief(call)}{where}; {hint}"
    return _UndefinedError(why, e, hint)
