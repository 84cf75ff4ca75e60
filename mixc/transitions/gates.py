"""Log-gates: the logarithm of a decay factor, in a form that is safe to evaluate.

A decay written `sigmoid(a)` has the log `logsigmoid(a)` (never log(sigmoid(a)), which underflows),
`exp(dt A)` has `dt A`, a constant gamma has log(gamma). Each log-gate records whether the decay
is proven to lie in (0, 1], and the factors it takes the log of whose sign is not proven >= 0
(`unsigned`): the chunked and parallel forms, which work in log space, are NaN where one of them
is negative (a decay of exactly 0 is handled: the runtime's `_log_gate`).
"""

from __future__ import annotations

from dataclasses import dataclass

from mixc.algebra.intervals import bounds, nonpositive
from mixc.frontend.constants import constant
from mixc.frontend.ir import Binary, Call, Expr, Neg, Number, Transpose

__all__ = ["LogGate", "log_gate"]


@dataclass(frozen=True)
class LogGate:
    """One decay factor and its logarithm in a numerically safe form."""

    side: str  # "scalar" | "key" | "value"
    decay: Expr  # as written (for a vector gate: the vector of decays)
    log: Expr  # log of the decay, safe to evaluate (logsigmoid(a), dt A, log(gamma)); canonical
    proven: bool  # provably in (0, 1]
    note: str
    #: The factors of the decay whose log `log` takes and that interval arithmetic does not
    #: prove >= 0 (`q_t . k_t`, `tanh(a_t)`, a raw input `a_t`): where one is negative, the log is
    #: NaN. Empty for a sigmoid, an exp, a relu, a constant >= 0, and products of them.
    unsigned: tuple[Expr, ...] = ()


def log_gate(decay: Expr, side: str, params: dict[str, Expr]) -> LogGate:
    """The log of one decay factor, in a form that never computes log(sigmoid(.)): the safe log
    its form has (`_log_of_form`), else its plain log, proven by the values it takes
    (`_log_of_values`)."""
    inner = decay.operand if isinstance(decay, Transpose) else decay
    if isinstance(inner, Call) and inner.func == "diag":
        inner = inner.args[0]
        inner = inner.operand if isinstance(inner, Transpose) else inner
    return _log_of_form(inner, decay, side, params) or _log_of_values(inner, decay, side, params)


def _log_of_form(inner: Expr, decay: Expr, side: str, params: dict[str, Expr]) -> LogGate | None:
    """The log of a decay (`inner`, its entries) whose form has one: a sigmoid's logsigmoid,
    1 - sigmoid(x) = sigmoid(-x), an exp's argument, a product's sum; None for another form."""
    if isinstance(inner, Call) and inner.func == "sigmoid":
        return LogGate(side, decay, Call("logsigmoid", inner.args), True, "sigmoid(x) is in (0, 1)")
    if (
        isinstance(inner, Binary)
        and inner.op == "-"
        and isinstance(inner.left, Number)
        and inner.left.text == "1"
        and isinstance(inner.right, Call)
        and inner.right.func == "sigmoid"
    ):
        arg = inner.right.args[0]
        return LogGate(
            side,
            decay,
            Call("logsigmoid", (Neg(arg),)),
            True,
            "1 - sigmoid(x) = sigmoid(-x) is in (0, 1)",
        )
    if isinstance(inner, Call) and inner.func == "exp":
        arg = inner.args[0]
        proven = nonpositive(arg, params)
        note = f"{arg} <= 0 always" if proven else f"in (0, 1] only if {arg} <= 0"
        return LogGate(side, decay, arg, proven, note)
    if isinstance(inner, Binary) and inner.op in ("*", "@"):
        a, b = log_gate(inner.left, side, params), log_gate(inner.right, side, params)
        notes = a.note if a.note == b.note else f"{a.note}; {b.note}"
        return LogGate(
            side,
            decay,
            Binary("+", a.log, b.log),
            a.proven and b.proven,
            notes,
            a.unsigned + b.unsigned,
        )
    return None


def _log_of_values(inner: Expr, decay: Expr, side: str, params: dict[str, Expr]) -> LogGate:
    """The log of a decay (`inner`, its entries) as log(decay), in (0, 1] where the values it
    takes are: a constant, 1/x with x >= 1, or any expression by interval arithmetic."""
    value = constant(inner)
    if value is not None:
        ok = 0 < value <= 1
        return LogGate(
            side,
            decay,
            Call("log", (inner,)),
            ok,
            "a constant in (0, 1]" if ok else f"the constant {value:g} is not in (0, 1]",
            () if value >= 0 else (inner,),
        )
    if (
        isinstance(inner, Binary)
        and inner.op == "/"
        and isinstance(inner.left, Number)
        and inner.left.text == "1"
    ):
        sub = log_gate(inner.right, side, params)
        lo = bounds(inner.right, defaults=params)[0]
        return LogGate(
            side,
            decay,
            Neg(sub.log),
            lo >= 1,
            f"1/x with x >= 1 {'always' if lo >= 1 else 'not proven'}",
            sub.unsigned,
        )
    lo, hi = bounds(inner, defaults=params)
    ok = lo > 0 and hi <= 1
    note = f"in [{lo:.6g}, {hi:.6g}] for every head" if ok else "not provably in (0, 1]"
    return LogGate(side, decay, Call("log", (inner,)), ok, note, () if lo >= 0 else (inner,))
