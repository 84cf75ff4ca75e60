"""Print IR as canonical spec text (ASCII spellings, matrix products as juxtaposition)."""

from __future__ import annotations

import re

from mixc.frontend.ir import (
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

# Binding strength, as in grammar/mixer.lark: sum < product < unary < juxtaposition < power < postfix.
_SUM, _PRODUCT, _UNARY, _JUXT, _POWER, _POSTFIX, _ATOM = range(1, 8)
_LEVEL = {
    "+": _SUM,
    "-": _SUM,
    "*": _PRODUCT,
    "/": _PRODUCT,
    ".": _PRODUCT,
    "@": _JUXT,
    "^": _POWER,
}


def _level(e: Expr) -> int:
    if isinstance(e, Binary):
        return _LEVEL[e.op]
    if isinstance(e, Neg):
        return _UNARY
    if isinstance(e, Transpose):
        return _POSTFIX
    return _ATOM


def _wrap(e: Expr, min_level: int) -> str:
    text = format_expr(e)
    return f"({text})" if _level(e) < min_level else text


def _time(offset: int) -> str:
    if offset == 0:
        return "_t"
    return f"_{{t{offset:+d}}}"


def format_expr(e: Expr) -> str:
    if isinstance(e, Number):
        return e.text
    if isinstance(e, Name):
        return e.name
    if isinstance(e, Timed):
        return e.name + _time(e.offset)
    if isinstance(e, Identity):
        return "I"
    if isinstance(e, Neg):
        return "-" + _wrap(e.operand, _UNARY)
    if isinstance(e, Transpose):
        return _wrap(e.operand, _POSTFIX) + "^T"
    if isinstance(e, Call):
        return f"{e.func}({', '.join(format_expr(a) for a in e.args)})"
    assert isinstance(e, Binary)
    level = _LEVEL[e.op]
    if e.op == "@":
        return f"{_wrap(e.left, _JUXT)} {_wrap(e.right, _POWER)}"
    if e.op == "^":
        return f"{_wrap(e.left, _POSTFIX)}^{_exponent(e.right)}"
    return f"{_wrap(e.left, level)} {e.op} {_wrap(e.right, level + 1)}"


def _exponent(e: Expr) -> str:
    if isinstance(e, Neg):
        return "-" + _exponent(e.operand)
    text = _wrap(e, _POWER)
    # a^T would read as a transpose: an exponent starting with the name T needs parentheses
    return f"({text})" if re.match(r"T(?![A-Za-z0-9_])", text) else text


def format_mixer(m: Mixer) -> str:
    lines = [f"mixer {m.name}" + (f' "{m.description}"' if m.description is not None else "")]
    if m.inputs:
        lines.append("in    " + ", ".join(str(d) for d in m.inputs))
    if m.params:
        lines.append("param " + ", ".join(str(p) for p in m.params))
    if m.states:
        lines.append("state " + ", ".join(str(s) for s in m.states))
    lines += [str(fn) for fn in m.lets]
    lines += [str(eq) for eq in m.equations]
    return "\n".join(lines) + "\n"
