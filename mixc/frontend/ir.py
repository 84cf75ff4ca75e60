"""The mixc IR: small immutable values, one per grammar rule.

Every node is a frozen dataclass with slots. Its `span` (where it came from in the spec) does not
take part in equality, so the same math written twice compares equal. `str(node)` prints valid
spec text, and `parse(str(mixer)) == mixer`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from mixc.errors import Span
from mixc.frontend.builtins import BUILTINS, ROTATIONS

__all__ = [
    "ANGLE_ARGUMENTS",
    "BINARY_OPS",
    "CHANNEL",
    "FUNCTIONS",
    "POSITION",
    "Binary",
    "Call",
    "Decl",
    "Equation",
    "Expr",
    "Identity",
    "LetFn",
    "Mixer",
    "Name",
    "Neg",
    "Number",
    "Param",
    "Timed",
    "Transpose",
    "walk",
]

#: Binary operators, by their canonical ASCII spelling.
#: "*" is the elementwise product (also written ⊙), "@" the matrix product (also juxtaposition),
#: "." the dot product (also written ·).
BINARY_OPS = ("+", "-", "*", "/", "@", ".", "^")

#: Built-in functions: name -> number of arguments (a view of the table in builtins.py). All act
#: elementwise except l2norm (a vector divided by its Euclidean norm) and diag (a vector to a
#: diagonal matrix).
FUNCTIONS = {name: builtin.arity for name, builtin in BUILTINS.items()}

#: The token's position, read as `pos_t`: 0, 1, 2, ... from the first token (or from the
#: position a carried state says), the same in every head.
POSITION = "pos"

#: The channel index of a vector parameter's default (`param w[K] = 10000^(-2 idx / K)`).
CHANNEL = "idx"

#: The functions whose argument at the given position is an angle (computed in float64 where
#: it reads a position: see backends/pytorch/kernels/functions.py).
ANGLE_ARGUMENTS = {"cos": 0, "sin": 0} | dict.fromkeys(ROTATIONS, 1)


@dataclass(frozen=True, slots=True)
class Node:
    span: Span | None = field(default=None, compare=False, repr=False, kw_only=True)


class Expr(Node):
    """Base of expression nodes."""

    __slots__ = ()

    def __str__(self) -> str:
        return format_expr(self)


@dataclass(frozen=True, slots=True)
class Number(Expr):
    """A numeric literal, kept as canonical text (`1`, `0.5`, `1e-06`) so printing is exact."""

    text: str


@dataclass(frozen=True, slots=True)
class Name(Expr):
    """A name without a time index: a parameter, a let argument, or the head index `h`."""

    name: str


@dataclass(frozen=True, slots=True)
class Timed(Expr):
    """A per-token quantity at a time offset: `q_t` is offset 0, `H_{t-1}` offset -1."""

    name: str
    offset: int


@dataclass(frozen=True, slots=True)
class Identity(Expr):
    """`I`, the identity matrix; its size comes from context."""


@dataclass(frozen=True, slots=True)
class Neg(Expr):
    """`-x`."""

    operand: Expr


@dataclass(frozen=True, slots=True)
class Binary(Expr):
    """`left op right` for op in BINARY_OPS."""

    op: str
    left: Expr
    right: Expr


@dataclass(frozen=True, slots=True)
class Transpose(Expr):
    """`x^T` (also written xᵀ)."""

    operand: Expr


@dataclass(frozen=True, slots=True)
class Call(Expr):
    """`f(x, ...)`: a built-in function or a `let` function."""

    func: str
    args: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Decl(Node):
    """`q[K]` in an `in` or `state` line: a name and its symbolic shape (empty for a scalar)."""

    name: str
    shape: tuple[str, ...] = ()

    def __str__(self) -> str:
        return self.name + (f"[{', '.join(self.shape)}]" if self.shape else "")


@dataclass(frozen=True, slots=True)
class Param(Node):
    """`gamma = 1 - 2^(-5 - h)` in a `param` line: per-head, with an optional default."""

    name: str
    shape: tuple[str, ...] = ()
    default: Expr | None = None

    def __str__(self) -> str:
        text = self.name + (f"[{', '.join(self.shape)}]" if self.shape else "")
        return text if self.default is None else f"{text} = {self.default}"


@dataclass(frozen=True, slots=True)
class LetFn(Node):
    """`let phi(x) = elu(x) + 1`: a helper function, inlined where it is called."""

    name: str
    args: tuple[str, ...]
    body: Expr

    def __str__(self) -> str:
        return f"let {self.name}({', '.join(self.args)}) = {self.body}"


@dataclass(frozen=True, slots=True)
class Equation(Node):
    """`H_t = ...` (a state update) or `y_t = ...` (an output or a derived per-token value)."""

    target: str
    value: Expr

    def __str__(self) -> str:
        return f"{self.target}_t = {self.value}"


@dataclass(frozen=True, slots=True)
class Mixer(Node):
    """A whole spec."""

    name: str
    description: str | None = None
    inputs: tuple[Decl, ...] = ()
    params: tuple[Param, ...] = ()
    states: tuple[Decl, ...] = ()
    lets: tuple[LetFn, ...] = ()
    equations: tuple[Equation, ...] = ()

    def __str__(self) -> str:
        return format_mixer(self)

    def state(self, name: str) -> Decl | None:
        return next((s for s in self.states if s.name == name), None)

    def update(self, name: str) -> Equation | None:
        return next((e for e in self.equations if e.target == name), None)

    @property
    def lagged(self) -> tuple[Decl, ...]:
        """The inputs some equation reads at t-1 (`x_{t-1}`, a token shift), in declaration
        order."""
        read = {
            n.name
            for e in self.equations
            for n in walk(e.value)
            if isinstance(n, Timed) and n.offset == -1
        }
        return tuple(d for d in self.inputs if d.name in read)

    @property
    def positioned(self) -> bool:
        """Whether an equation reads the token's position `pos_t`."""
        return any(
            isinstance(n, Timed) and n.name == POSITION
            for e in self.equations
            for n in walk(e.value)
        )

    @property
    def backward(self) -> tuple[str, ...]:
        """The states updated from the next token (`G_t = a_t G_{t+1} + ...`), which run
        backward in time from an initial state at the end of the sequence, in declaration
        order. A mixer with one is non-causal."""
        ahead = {
            e.target
            for e in self.equations
            for n in walk(e.value)
            if isinstance(n, Timed) and n.offset == 1 and n.name == e.target
        }
        return tuple(s.name for s in self.states if s.name in ahead)

    @property
    def causal(self) -> bool:
        """Whether every output at t reads tokens up to t only (no backward state)."""
        return not self.backward

    @property
    def carried(self) -> tuple[Decl, ...]:
        """What the compiled forms carry from one token to the next, in the order of their
        states: the declared states, then the last token of every lagged input, named as it is
        read (`x_{t-1}`) and shaped as the input, then, if the spec reads `pos_t`, `pos`: the
        position of the next token (a scalar per head)."""
        last = tuple(Decl(f"{d.name}_{{t-1}}", d.shape, span=d.span) for d in self.lagged)
        position = (Decl(POSITION, ()),) if self.positioned else ()
        return self.states + last + position

    @property
    def outputs(self) -> tuple[Equation, ...]:
        """Equations of non-state values that no other equation reads."""
        states = {s.name for s in self.states}
        read = {n.name for e in self.equations for n in walk(e.value) if isinstance(n, Timed)}
        return tuple(e for e in self.equations if e.target not in states and e.target not in read)


def angle_reads(mixer: Mixer, e: Expr) -> tuple[set[str], set[str]]:
    """The names `e` reads inside angle arguments (`ANGLE_ARGUMENTS`) and those it reads
    elsewhere, looking inside the let functions it calls."""
    lets = {fn.name: fn for fn in mixer.lets}
    inside: set[str] = set()
    outside: set[str] = set()
    stack = [(e, False)]
    while stack:
        node, angle = stack.pop()
        if isinstance(node, Name | Timed):
            (inside if angle else outside).add(node.name)
        elif isinstance(node, Call) and node.func in lets:
            # each argument where the body reads its parameter: inside an angle or not
            fn = lets[node.func]
            body_inside, body_outside = angle_reads(mixer, fn.body)
            for param, arg in zip(fn.args, node.args, strict=True):
                if param in body_inside:
                    stack.append((arg, True))
                if param in body_outside:
                    stack.append((arg, angle))
            inside.update(body_inside - set(fn.args))
            (inside if angle else outside).update(body_outside - set(fn.args))
        else:
            which = ANGLE_ARGUMENTS.get(node.func) if isinstance(node, Call) else None
            stack.extend((c, angle or i == which) for i, c in enumerate(children(node)))
    return inside, outside


def angle_only(mixer: Mixer) -> frozenset[str]:
    """The names every read of which (in the equations) lies inside an angle argument."""
    inside: set[str] = set()
    outside: set[str] = set()
    for eq in mixer.equations:
        i, o = angle_reads(mixer, eq.value)
        inside |= i
        outside |= o
    return frozenset(inside - outside)


def angle_params(mixer: Mixer) -> frozenset[str]:
    """The parameters every read of which lies inside an angle argument: the forms keep them
    in float64, as the positions (a frequency rounded to float32 is off by up to 6e-8 of
    itself, which at position 10^6 turns by up to 0.06 rad more or less for a frequency of 1)."""
    return frozenset(p.name for p in mixer.params) & angle_only(mixer)


def angle_states(mixer: Mixer) -> frozenset[str]:
    """The states that only feed angles, summed: vectors updated as `S_{t-1} + e` (e not reading
    S) whose every read outside the updates of such states (its own, another's) lies inside an
    angle argument, as Mamba-3's summed angles `Th`. The
    forms keep them in float64 whatever the inputs' dtype: a float32 sum of T angles is off by
    about T ulps of the sum, 0.03 rad per ulp at 3 * 10^5 rad."""
    read = {  # a state no other equation reads is no angle
        n for eq in mixer.equations for n in set.union(*angle_reads(mixer, eq.value)) - {eq.target}
    }
    found = {s.name for s in mixer.states if len(s.shape) == 1 and _summed(mixer, s.name)} & read
    changed = True
    while changed:  # a state read outside an angle by an equation not of a found state goes
        changed = False
        for eq in mixer.equations:
            dropped = set() if eq.target in found else found & angle_reads(mixer, eq.value)[1]
            found -= dropped
            changed = changed or bool(dropped)
    return frozenset(found)


def _summed(mixer: Mixer, state: str) -> bool:
    """Whether the update of `state` is `state_{t-1} + e` (either order), e not reading it."""
    eq = mixer.update(state)
    if eq is None or not isinstance(eq.value, Binary) or eq.value.op != "+":
        return False
    for kept, added in ((eq.value.left, eq.value.right), (eq.value.right, eq.value.left)):
        if kept == Timed(state, -1) and all(
            not (isinstance(n, Timed) and n.name == state) for n in walk(added)
        ):
            return True
    return False


def children(expr: Expr) -> tuple[Expr, ...]:
    if isinstance(expr, Neg | Transpose):
        return (expr.operand,)
    if isinstance(expr, Binary):
        return (expr.left, expr.right)
    if isinstance(expr, Call):
        return expr.args
    return ()


def walk(expr: Expr):
    """Every node of `expr`, parents before children (iterative: safe on deep trees)."""
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(children(node)))


# ----------------------------------------------------------------------------- printing
# Here rather than in a module of its own, so that the nodes' __str__ needs no import (a printer
# module would import the nodes, and the nodes the printer).

# Binding strength, as in grammar/mixer.lark:
# sum < product < unary < juxtaposition < power < postfix.
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
    """Canonical spec text of `e`: ASCII spellings, matrix products as juxtaposition, and only
    the parentheses the grammar needs."""
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
    """A whole spec in canonical form, one declaration kind per line."""
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
