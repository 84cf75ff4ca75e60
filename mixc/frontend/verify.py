"""The verifier: names, time indices and shapes. Runs before any analysis; raises located errors.

Shapes and their rules live in `mixc.frontend.shapes`, the checks of names and time indices in
`mixc.frontend.names`; this module checks a whole mixer with them, piece by piece, and finds the
order one time step computes its equations in (`equation_order`).
"""

from __future__ import annotations

from dataclasses import dataclass

from mixc.errors import (
    SpecAnalysisError,
    SpecError,
    SpecNameError,
    SpecShapeError,
    SpecSyntaxError,
)
from mixc.frontend.constants import Constants
from mixc.frontend.ir import (
    CHANNEL,
    Call,
    Decl,
    Equation,
    Expr,
    LetFn,
    Mixer,
    Param,
    Timed,
    children,
    walk,
)
from mixc.frontend.limits import InlinedSizes
from mixc.frontend.names import (
    FORM_OPTIONS,
    LANGUAGE_WORDS,
    LAYOUT_SIZES,
    RESERVED,
    Known,
    Names,
    check_let_calls,
    check_mixer_name,
    check_names,
    check_target,
    check_times,
    declare,
    declare_let,
)
from mixc.frontend.parser import DEPTH_HINT, MAX_DEPTH
from mixc.frontend.shapes import IDENTITY, SCALAR, Shape, Symbol, Typer, declared, show, symbols_of

#: The reserved words are defined with the other name checks (`mixc.frontend.names`) and
#: exported here too, where the rest of mixc has always found them.
__all__ = [
    "FORM_OPTIONS",
    "LANGUAGE_WORDS",
    "LAYOUT_SIZES",
    "RESERVED",
    "Verified",
    "equation_order",
    "errors",
    "verify",
]


@dataclass(frozen=True)
class Verified:
    """What verifying a mixer computed, kept for every later stage to read rather than compute
    again: the shape of every equation's target, every name's symbol (inputs, parameters,
    states, lets and per-token values, each with its kind and shape), and the equations in the
    order one time step computes them (`equation_order`)."""

    shapes: dict[str, Shape]
    symbols: dict[str, Symbol]
    order: tuple[Equation, ...]


def verify(mixer: Mixer) -> Verified:
    """Check names, time indices, shapes, sizes and constants. Returns what the checks computed;
    raises the first error `errors` finds."""
    checked = _Verifier(mixer)
    if checked.errors:
        raise checked.errors[0]
    return Verified(checked.shapes, checked.symbols, checked.order)


def errors(mixer: Mixer) -> list[SpecError]:
    """Every error `verify` finds, not only the first, in the order it finds them.

    Each declaration, let, default and equation is checked on its own. A let or a per-token
    value with an error is left out of what reads it: what calls or reads it is not checked, as
    its errors could follow from the first. An error in the declarations stops the checks
    there, since everything after them reads the names they declare."""
    return _Verifier(mixer).errors


class _Verifier:
    """The checks of one mixer, piece by piece, with the errors they found."""

    def __init__(self, mixer: Mixer) -> None:
        self.mixer = mixer
        self.states = {s.name for s in mixer.states}
        self.symbols = symbols_of(mixer)
        self.errors: list[SpecError] = []
        self.failed: set[str] = set()  # lets, defaults and targets with an error, or skipped
        self.shapes: dict[str, Shape] = {}
        self.order: tuple[Equation, ...] = ()
        self.let_depth: dict[str, int] = {}
        self.value_depth: dict[str, int] = {}
        self.sizes = InlinedSizes()
        self.constants = Constants(mixer.lets)
        self.known = Known(mixer, self.symbols)
        self.given_sizes = frozenset(
            [d for decl in mixer.inputs for d in decl.shape]
            + [d for q in mixer.params if q.default is None for d in q.shape]
        )
        if self._declarations():
            self._names()
            self._types()

    def attempt(self, owner: str | None, check, *args) -> None:
        """`check(*args)`; on a SpecError, record it and mark `owner` failed."""
        try:
            check(*args)
        except SpecError as exc:
            self.errors.append(exc)
            if owner is not None:
                self.failed.add(owner)

    def reads_failed(self, e: Expr) -> bool:
        """Whether `e` calls a let or reads a per-token value that failed."""
        return any(
            (isinstance(n, Call) and n.func in self.failed)
            or (isinstance(n, Timed) and n.name in self.failed and n.name not in self.states)
            for n in walk(e)
        )

    def _declarations(self) -> bool:
        """Names free and declared once, sizes well-formed, one equation per target; whether
        all of that holds."""
        mixer, names, targets = self.mixer, Names(), {}
        self.attempt(None, check_mixer_name, mixer)
        for kind, decls in (
            ("an input", mixer.inputs),
            ("a parameter", mixer.params),
            ("a state", mixer.states),
        ):
            for d in decls:
                self.attempt(None, declare, names, d, kind)
        for fn in mixer.lets:
            self.attempt(None, declare_let, names, fn)
        for eq in mixer.equations:
            self.attempt(None, check_target, mixer, names, targets, eq)
        self.attempt(None, _check_some_equation, mixer)
        self.attempt(None, _check_defaults_count, mixer)
        return not self.errors

    def _names(self) -> None:
        """Names, time indices and nesting depth of each let, default and equation, the lets'
        sizes and constants, and which updates and outputs there are. Only a let that calls a
        let with an error is left out: a name is right or wrong whatever the lets and values it
        reads turn out to be."""
        mixer = self.mixer
        for eq in mixer.equations:
            if eq.target not in self.states:  # refined by _types, in dependency order
                self.symbols[eq.target] = Symbol("value", SCALAR)
        above: set[str] = set()
        for fn in mixer.lets:
            self._unless_failed(fn.name, fn.body, self._let, fn, above)
            above.add(fn.name)
        for p in mixer.params:
            if p.default is not None:
                self.attempt(p.name, self._default_names, p)
        for eq in mixer.equations:
            self.attempt(eq.target, self._equation_names, eq)
        for s in mixer.states:
            self.attempt(None, _check_updated, mixer, s)
        self.attempt(None, _check_output, mixer, self.states)

    def _unless_failed(self, owner: str, e: Expr, check, *args) -> None:
        """`check(*args)` for the piece `owner` whose expression is `e`, unless `e` reads a
        piece that failed (then `owner` fails too, silently)."""
        if self.reads_failed(e):
            self.failed.add(owner)
        else:
            self.attempt(owner, check, *args)

    def _let(self, fn: LetFn, above: set[str]) -> None:
        check_let_calls(self.known.lets, fn, above)
        self.let_depth[fn.name] = _check_depth(fn.body, self.let_depth)
        check_names(self.known, fn.body, set(fn.args), "let", fn.name)
        self.sizes.check(fn.body, "lets", dict.fromkeys(fn.args, 1))
        self.sizes.add_let(fn.name, fn.args, fn.body)
        self.constants.check(fn.body)

    def _default_names(self, p: Param) -> None:
        check_names(
            self.known, p.default, {"h", CHANNEL} if len(p.shape) == 1 else {"h"}, "param", p.name
        )
        _check_depth(p.default, self.let_depth)

    def _equation_names(self, eq: Equation) -> None:
        check_names(self.known, eq.value, set(), "equation", eq.target)
        check_times(self.mixer, eq, self.states)
        _check_depth(eq.value, self.let_depth)

    def _types(self) -> None:
        """Shapes, inlined sizes and constants of each default and equation, in the order a
        time step computes them, and the shapes of lets nobody calls."""
        mixer = self.mixer
        typer = Typer(mixer, self.symbols)
        for p in mixer.params:
            if p.default is not None and p.name not in self.failed:
                self.attempt(p.name, self._default, typer, p)
        try:
            self.order = tuple(equation_order(mixer))
        except SpecError as exc:  # a cycle: there is no order to type the equations in
            self.errors.append(exc)
            return
        for eq in self.order:
            if eq.target not in self.failed:
                self._unless_failed(eq.target, eq.value, self._equation, typer, eq)
        called = {n.func for e in mixer.equations for n in walk(e.value) if isinstance(n, Call)}
        for fn in mixer.lets:  # a let that nobody calls is still type-checked, with scalar args
            if fn.name not in called and fn.name not in self.failed:
                self.attempt(fn.name, typer.shape_of, fn.body, dict.fromkeys(fn.args, SCALAR))
        values = {e.target: e.value for e in mixer.equations if e.target not in self.states}
        for eq in mixer.outputs:
            if eq.target not in self.failed:
                self._unless_failed(eq.target, eq.value, _check_output_reads, values, eq)

    def _default(self, typer: Typer, p: Param) -> None:
        self.sizes.check(p.default, "lets")
        got = typer.shape_of(p.default)
        if got != declared(p.shape) and got != SCALAR:
            raise SpecShapeError(
                f"default of {p.name} is {show(got)} but {p.name} is declared "
                f"{show(declared(p.shape))}",
                p.default.span,
            )
        self.constants.check(p.default)
        self.constants.check_heads(p.default, p.name)
        _check_default_sizes(self.mixer, p, self.given_sizes)

    def _equation(self, typer: Typer, eq: Equation) -> None:
        size = self.sizes.check(eq.value, "lets and per-token values")
        depth = _check_depth(eq.value, self.let_depth, self.value_depth)
        got = typer.shape_of(eq.value)
        if got == IDENTITY:
            raise SpecShapeError(f"{eq.target}_t = I: the size of I is unknown here", eq.value.span)
        if eq.target in self.states:
            want = declared(self.mixer.state(eq.target).shape)
            if got != want and got != SCALAR:
                raise SpecShapeError(
                    f"the update of {eq.target} is {show(got)} but {eq.target} is declared "
                    f"{show(want)}",
                    eq.value.span,
                    hint=_update_hint(got, want, eq.target),
                )
            got = want
        self.constants.check(eq.value)
        if eq.target not in self.states:
            self.symbols[eq.target] = Symbol("value", got)
            self.sizes.add_value(eq.target, size)
            self.value_depth[eq.target] = depth
        self.shapes[eq.target] = got


def _check_default_sizes(mixer: Mixer, p: Param, given: frozenset[str]) -> None:
    """A shaped parameter's default (one value per head, broadcast over the parameter's entries)
    takes its sizes from the inputs and the parameters without a default (`given`): each size
    must be one of theirs."""
    unknown = [d for d in p.shape if not d.isdigit() and d not in given]
    if unknown:
        raise SpecShapeError(
            f"the size {unknown[0]} of {p.name} is unknown where its default is used: no input "
            "and no parameter without a default has it",
            p.default.span,
            expected=f"a size of an input or of a parameter without a default (or a number, "
            f"{p.name}[4])",
            hint=f"declare {p.name} without a default, so that the caller's tensor gives "
            f"{unknown[0]}",
        )


def _update_hint(got: Shape, want: Shape, name: str) -> str | None:
    if got == (want[1], want[0]):
        return (
            f"the update is transposed; {name}'s write is usually v_t k_t^T for {name}{show(want)}"
        )
    return None


#: The most parameters with a default a spec may declare. Each is a keyword argument of the
#: calls the compiled module makes between its functions, and Python compiles a call in time
#: quadratic in its keyword arguments (thousands take seconds). Real mixers have a handful.
MAX_DEFAULTED_PARAMS = 1_000


def _check_defaults_count(mixer: Mixer) -> None:
    defaulted = [p for p in mixer.params if p.default is not None]
    if len(defaulted) > MAX_DEFAULTED_PARAMS:
        raise SpecAnalysisError(
            f"too many parameters with a default: {len(defaulted):,} (at most "
            f"{MAX_DEFAULTED_PARAMS:,})",
            defaulted[MAX_DEFAULTED_PARAMS].span,
            hint="declare parameters without a default (the caller gives them), or fewer",
        )


def _check_some_equation(mixer: Mixer) -> None:
    if not mixer.equations:
        raise SpecAnalysisError(
            f"mixer {mixer.name} has no equations",
            mixer.span,
            expected="state updates like H_t = ... and an output like y_t = H_t q_t",
        )


def _check_depth(
    expr: Expr, let_depth: dict[str, int], value_depth: dict[str, int] | None = None
) -> int:
    """How deeply `expr` nests with its let calls inlined, and its per-token values where their
    depths are given; refuses more than MAX_DEPTH levels (the analysis recurses that deep)."""
    values = value_depth or {}
    deepest, stack = 0, [(expr, 1)]
    while stack:
        node, d = stack.pop()
        if isinstance(node, Call):
            d += let_depth.get(node.func, 0)
        elif isinstance(node, Timed) and node.offset == 0:
            d += values.get(node.name, 0)
        if d > MAX_DEPTH:
            what = "lets" if value_depth is None else "lets and per-token values"
            raise SpecSyntaxError(
                f"expression nested too deeply (more than {MAX_DEPTH} levels, with {what} inlined)",
                node.span,
                hint=DEPTH_HINT,
            )
        deepest = max(deepest, d)
        stack.extend((c, d + 1) for c in children(node))
    return deepest


def _check_updated(mixer: Mixer, s: Decl) -> None:
    if mixer.update(s.name) is None:
        raise SpecNameError(
            f"state {s.name} has no update",
            s.span,
            expected=f"an equation {s.name}_t = ... {s.name}_{{t-1}} ...",
        )


def _check_output(mixer: Mixer, states: set[str]) -> None:
    if not [e for e in mixer.equations if e.target not in states]:
        raise SpecAnalysisError(
            f"mixer {mixer.name} has no output",
            mixer.span,
            expected="an output equation such as y_t = H_t q_t",
        )


def _check_output_reads(values: dict[str, Expr], eq: Equation) -> None:
    """An output reads some input or state (directly, or through the per-token `values`, by
    name): one that reads neither is the same at every token, and would have no token axis."""
    seen, todo = set(), [eq.value]
    while todo:
        for n in walk(todo.pop()):
            if not isinstance(n, Timed) or n.name in seen:
                continue
            seen.add(n.name)
            if n.name not in values:
                return  # an input (at t or t-1) or a state
            todo.append(values[n.name])
    raise SpecAnalysisError(
        f"the output {eq.target}_t reads no input and no state, so it is the same at every token",
        eq.value.span,
        expected="an output that reads an input or a state, such as y_t = H_t q_t or "
        "y_t = sigmoid(g_t) * x_t",
        hint="multiply it by an input (declare one with `in`), or read a state",
    )


def equation_order(mixer: Mixer) -> list[Equation]:
    """The equations in the order one time step computes them: each after every equation whose
    value at t it reads. The one evaluation order of a mixer: a verified Spec carries it
    (`Spec.order`) for the analysis, the backends and the oracle. Raises a located error where a
    value depends on itself at the same step."""
    by_target = {e.target: e for e in mixer.equations}
    order, state_of = [], {}
    for start in by_target:
        stack = [(start, iter(_lag0_reads(by_target[start], by_target)))]
        if state_of.get(start) == "done":
            continue
        state_of[start] = "active"
        while stack:
            name, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                state_of[name] = "done"
                order.append(by_target[name])
                continue
            dep, span = nxt
            if state_of.get(dep) == "active":
                raise SpecAnalysisError(
                    f"{dep}_t depends on itself at the same time step (through "
                    f"{' -> '.join(n for n, _ in stack)})",
                    span,
                    hint="a value at time t may depend on earlier times only through a state "
                    "at t-1",
                )
            if state_of.get(dep) is None:
                state_of[dep] = "active"
                stack.append((dep, iter(_lag0_reads(by_target[dep], by_target))))
    return order


def _lag0_reads(eq, by_target):
    return [
        (n.name, n.span)
        for n in walk(eq.value)
        if isinstance(n, Timed) and n.offset == 0 and n.name in by_target and n.name != eq.target
    ]
