"""The verifier: names, time indices and shapes. Runs before any analysis; raises located errors.

Shapes and their rules live in `mixc.frontend.shapes`; this module checks a whole mixer with them.
"""

from __future__ import annotations

import keyword
import re

from mixc.errors import (
    NotYetImplemented,
    Span,
    SpecAnalysisError,
    SpecError,
    SpecNameError,
    SpecShapeError,
    SpecSyntaxError,
)
from mixc.frontend.constants import Constants
from mixc.frontend.ir import (
    FUNCTIONS,
    Call,
    Decl,
    Equation,
    Expr,
    Identity,
    LetFn,
    Mixer,
    Name,
    Param,
    Timed,
    children,
    walk,
)
from mixc.frontend.limits import InlinedSizes
from mixc.frontend.parser import DEPTH_HINT, MAX_DEPTH
from mixc.frontend.shapes import IDENTITY, SCALAR, Shape, Symbol, Typer, declared, show, symbols_of
from mixc.frontend.suggest import Suggestions

__all__ = [
    "FORM_OPTIONS",
    "LANGUAGE_WORDS",
    "LAYOUT_SIZES",
    "RESERVED",
    "equation_order",
    "errors",
    "verify",
]

#: Sizes the compiled modules' layout uses for batch, tokens and heads: a spec cannot reuse them.
LAYOUT_SIZES = frozenset({"B", "T", "NH"})

#: Words of the spec language: the keywords that start its lines, the time index t, the head
#: index h of parameter defaults and the identity I.
LANGUAGE_WORDS = frozenset({"mixer", "in", "param", "state", "let", "t", "h", "I"})

#: The keyword arguments of a compiled module's forms, beside the spec's names in their
#: signatures (`chunk(q, k, v, *, initial_state=None, ...)`).
FORM_OPTIONS = frozenset(
    {"initial_state", "output_final_state", "chunk_size", "cu_seqlens", "state"}
)

#: The names a spec may not declare: the language's own words and functions, Python's keywords
#: (a spec's names are the parameters of the compiled forms) and the forms' options. Nothing the
#: generated code defines or imports is here: it reads each of its globals by a name starting
#: with an underscore, which no spec name can (see the PyTorch emitter).
RESERVED = frozenset(keyword.kwlist) | LANGUAGE_WORDS | FORM_OPTIONS | frozenset(FUNCTIONS)


def verify(mixer: Mixer) -> dict[str, Shape]:
    """Check names, time indices, shapes, sizes and constants. Returns the shape of every
    equation's target; raises the first error `errors` finds."""
    checked = _Verifier(mixer)
    if checked.errors:
        raise checked.errors[0]
    return checked.shapes


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
        self.let_depth: dict[str, int] = {}
        self.value_depth: dict[str, int] = {}
        self.sizes = InlinedSizes()
        self.constants = Constants(mixer.lets)
        self.known = _Known(mixer, self.symbols)
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
        mixer, names, targets = self.mixer, _Names(), {}
        self.attempt(None, _check_mixer_name, mixer)
        for kind, decls in (
            ("an input", mixer.inputs),
            ("a parameter", mixer.params),
            ("a state", mixer.states),
        ):
            for d in decls:
                self.attempt(None, _declare, names, d, kind)
        for fn in mixer.lets:
            self.attempt(None, _declare_let, names, fn)
        for eq in mixer.equations:
            self.attempt(None, _check_target, mixer, names, targets, eq)
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
        _check_let_calls(self.known.lets, fn, above)
        self.let_depth[fn.name] = _check_depth(fn.body, self.let_depth)
        _check_names(self.known, fn.body, set(fn.args), "let", fn.name)
        self.sizes.check(fn.body, "lets", dict.fromkeys(fn.args, 1))
        self.sizes.add_let(fn.name, fn.args, fn.body)
        self.constants.check(fn.body)

    def _default_names(self, p: Param) -> None:
        _check_names(self.known, p.default, {"h"}, "param", p.name)
        _check_depth(p.default, self.let_depth)

    def _equation_names(self, eq: Equation) -> None:
        _check_names(self.known, eq.value, set(), "equation", eq.target)
        _check_times(self.mixer, eq, self.states)
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
            order = equation_order(mixer)
        except SpecError as exc:  # a cycle: there is no order to type the equations in
            self.errors.append(exc)
            return
        for eq in order:
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


#: What a name may look like (the grammar's NAME token).
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9]*(_(?!t(?![A-Za-z0-9_])|\{)[A-Za-z0-9]+)*")


def renamings(name: str) -> list[str]:
    """Two names close to a refused `name` that the language accepts (free of reserved words)."""
    candidates = [f"{name}1", f"my_{name}", f"{name}_1", f"{name}2", f"{name}x"]
    return [c for c in candidates if _NAME.fullmatch(c) and c not in RESERVED][:2]


def _rename_hint(name: str) -> str:
    return "rename it, e.g. " + " or ".join(renamings(name))


def _check_mixer_name(mixer: Mixer) -> None:
    if mixer.name in RESERVED:
        raise SpecNameError(
            f"mixer name {mixer.name!r} is reserved",
            mixer.span,
            hint=_rename_hint(mixer.name),
        )


def _declare(names: _Names, d: Decl | Param, kind: str) -> None:
    names.claim(d.name, kind, d.span)
    _check_sizes(d)


def _declare_let(names: _Names, fn: LetFn) -> None:
    names.claim(fn.name, "a let function", fn.span)
    _check_let_arguments(fn)


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


class _Names:
    """The names declared so far, each with what it is and the line it was declared on."""

    def __init__(self) -> None:
        self.what: dict[str, str] = {}
        self.line: dict[str, int] = {}

    def claim(self, name: str, what: str, span: Span | None) -> None:
        """Declare `name` as `what`; refuses reserved names and second declarations."""
        if name in RESERVED:
            raise SpecNameError(
                f"{name!r} is reserved ({_reserved_why(name)})",
                span,
                hint=_rename_hint(name),
            )
        if name in self.what:
            first = self.line[name]
            raise SpecNameError(
                f"{name} is already declared as {self.what[name]}",
                span,
                hint=f"the first is at line {first}; rename one of them" if first else None,
            )
        self.what[name], self.line[name] = what, span.line if span else 0


def _reserved_why(name: str) -> str:
    if keyword.iskeyword(name):
        return "a Python keyword"
    if name in FUNCTIONS:
        return "a built-in function of the language"
    if name in LANGUAGE_WORDS:
        return "a word of the spec language"
    return "a keyword argument of the compiled forms"


#: The largest size a spec may write as a number (`q[64]`): far above a head's width, and small
#: enough that the fuzzer, bench, synth and a layer can allocate what a spec declares.
MAX_LITERAL_SIZE = 65_536
_MAX_TEXT = str(MAX_LITERAL_SIZE)


def _check_sizes(d: Decl | Param) -> None:
    """Sizes are names or whole numbers of at least 1, not I or a layout dimension; at most two."""
    for size in d.shape:
        if not (size.isdigit() or size[:1].isalpha()):
            raise SpecShapeError(
                f"size {size} of {d.name} is not a whole number",
                d.span,
                hint="a size is a name, like K, or a whole number, like 64",
            )
        if size.isdigit() and not size.strip("0"):
            raise SpecShapeError(f"size {size} of {d.name} must be at least 1", d.span)
        digits = size.lstrip("0")  # compared as text: int() refuses 4,300 digits and more
        if size.isdigit() and (len(digits), digits) > (len(_MAX_TEXT), _MAX_TEXT):
            shown = size if len(size) <= 24 else f"{size[:20]}... ({len(size):,} digits)"
            raise SpecShapeError(
                f"size {shown} of {d.name} is too large",
                d.span,
                expected=f"a size from 1 to {MAX_LITERAL_SIZE:,} (per head)",
                hint="name the size (q[K]) and give it when the module is called",
            )
        if size == "I":
            raise SpecNameError(
                f"size I of {d.name}: I is the identity matrix",
                d.span,
                hint="name the size something else, e.g. D",
            )
        if size in LAYOUT_SIZES:
            raise SpecNameError(
                f"size {size} of {d.name}: {size} is a dimension of the compiled layout "
                "[B, T, NH, ...] (batch, tokens, heads)",
                d.span,
                hint="name the size something else, e.g. D",
            )
    if len(d.shape) > 2:
        raise SpecShapeError(
            f"{d.name} has {len(d.shape)} dimensions; mixc handles scalars, vectors and matrices",
            d.span,
        )


def _check_let_arguments(fn: LetFn) -> None:
    for a in fn.args:
        if a in RESERVED:
            raise SpecNameError(f"argument name {a!r} of {fn.name} is reserved", fn.span)
    if len(set(fn.args)) != len(fn.args):
        raise SpecNameError(f"{fn.name} has two arguments with the same name", fn.span)


def _check_target(
    mixer: Mixer, names: _Names, targets: dict[str, Span | None], eq: Equation
) -> None:
    """One equation per target (`targets`: those seen so far); a state is updated, any other
    target is a new name."""
    states = {s.name for s in mixer.states}
    if eq.target in targets:
        what = "update" if eq.target in states else "definition"
        first = targets[eq.target]
        raise SpecNameError(
            f"second {what} of {eq.target}",
            eq.span,
            hint=f"the first is at line {first.line}; combine them into one equation"
            if first
            else None,
        )
    targets[eq.target] = eq.span
    if eq.target in names.what and eq.target not in states:
        raise SpecNameError(
            f"cannot assign to {eq.target}: it is {names.what[eq.target]}",
            eq.span,
            hint="only states are updated; other equations define new per-token values",
        )
    if eq.target not in states:
        names.claim(eq.target, "a per-token value", eq.span)


def _check_let_calls(lets: frozenset[str], fn: LetFn, above: set[str]) -> None:
    """A let calls only lets defined `above` it (of the mixer's `lets`), so there is no
    recursion."""
    for node in walk(fn.body):
        if isinstance(node, Call) and node.func in lets and node.func not in above:
            if node.func == fn.name:
                raise SpecNameError(
                    f"{fn.name} calls itself; let functions cannot be recursive",
                    _callee_span(node),
                )
            raise SpecNameError(
                f"{fn.name} calls {node.func}, which is defined below it",
                _callee_span(node),
                hint=f"move `let {node.func}(...)` above `let {fn.name}(...)`",
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


def _callee_span(call: Call) -> Span | None:
    """The span of a call's function name, where an error about the function belongs."""
    if call.span is None:
        return None
    return Span(
        call.span.line, call.span.column, call.span.line, call.span.column + len(call.func) - 1
    )


class _Known:
    """A mixer's names (`symbols`, its lets) and the closest of them to a misspelt one."""

    def __init__(self, mixer: Mixer, symbols: dict[str, Symbol]) -> None:
        self.symbols = symbols
        self.lets = frozenset(fn.name for fn in mixer.lets)
        self.suggestions = Suggestions()

    def function(self, name: str) -> str | None:
        """The built-in or let closest to the unknown function `name`."""
        return self.suggestions.closest(name, "function", lambda: [*FUNCTIONS, *self.lets])

    def untimed(self, name: str) -> str | None:
        """The declared name but a let closest to `name`."""
        symbols = self.symbols
        return self.suggestions.closest(
            name, "untimed", lambda: [n for n, s in symbols.items() if s.kind != "let"]
        )

    def timed(self, name: str) -> str | None:
        """The declared name or per-token value closest to `name`."""
        return self.suggestions.closest(name, "timed", lambda: list(self.symbols))


def _check_names(known: _Known, expr: Expr, args: set[str], where: str, owner: str) -> None:
    """`where` is "let", "param" or "equation"; `owner` names the let, parameter or target."""
    for node in walk(expr):
        if isinstance(node, Call):
            if node.func not in FUNCTIONS and node.func not in known.lets:
                close = known.function(node.func)
                raise SpecNameError(
                    f"unknown function {node.func}",
                    _callee_span(node),
                    expected="a built-in (" + ", ".join(FUNCTIONS) + ") or a let function",
                    hint=f"did you mean {close}?" if close else None,
                )
        elif isinstance(node, Name):
            _check_untimed(node, known, args, where, owner)
        elif isinstance(node, Timed):
            _check_timed(node, known, args, where, owner)
        elif isinstance(node, Identity) and where == "param":
            raise SpecShapeError("I cannot appear in a parameter default", node.span)


def _check_untimed(node: Name, known: _Known, args: set[str], where: str, owner: str) -> None:
    if node.name in args:
        return
    if node.name == "h":
        raise SpecNameError(
            "h (the head index) can only be used in a parameter default",
            node.span,
            hint="declare a parameter: param gamma = ... h ...",
        )
    sym = known.symbols.get(node.name)
    if sym is None:
        close = known.untimed(node.name)
        raise SpecNameError(
            f"undefined name {node.name}",
            node.span,
            expected="a declared input, parameter or state, or a let argument",
            hint=_undefined_hint(node.name, close),
        )
    if sym.kind == "let":
        raise SpecNameError(f"{node.name} is a function; call it: {node.name}(...)", node.span)
    if where == "param":
        if sym.kind == "param":
            raise SpecNameError(
                f"a parameter default cannot use another parameter ({node.name})",
                node.span,
                hint="defaults may use numbers and the head index h",
            )
        _per_token_in_param(node)
    if sym.kind in ("input", "value"):
        raise SpecNameError(
            f"{node.name} is per token and needs a time index",
            node.span,
            hint=f"did you mean {node.name}_t?",
        )
    if sym.kind == "state":
        suggestion = f"{node.name}_{{t-1}}" if owner == node.name else f"{node.name}_t"
        raise SpecNameError(
            f"state {node.name} needs a time index", node.span, hint=f"did you mean {suggestion}?"
        )


def _undefined_hint(name: str, close: str | None) -> str:
    if close:
        return f"did you mean {close}?"
    if name in ("mixer", "in", "param", "state", "let"):
        return f"`{name}` is a keyword that starts a line"
    if name in RESERVED:
        return f"{name} is reserved; declare a parameter with another name"
    return f"declare it: `param {name}`"


def _per_token_in_param(node: Name | Timed) -> None:
    raise SpecNameError(
        f"a parameter default cannot use the per-token {node.name}",
        node.span,
        hint="defaults may use numbers and the head index h; per-token values go in `in`",
    )


def _check_timed(node: Timed, known: _Known, args: set[str], where: str, owner: str) -> None:
    if node.name in args:
        raise SpecNameError(
            f"{node.name} is an argument of {owner} and has no time index",
            node.span,
            hint=f"write {node.name}",
        )
    sym = known.symbols.get(node.name)
    if sym is None:
        close = known.timed(node.name)
        raise SpecNameError(
            f"undefined name {node.name}",
            node.span,
            expected="a declared input or state, or a per-token value defined by an equation",
            hint=f"did you mean {close}_t?" if close else f"declare it: `in {node.name}`",
        )
    if sym.kind == "param":
        raise SpecNameError(
            f"{node.name} is a per-head parameter and has no time index",
            node.span,
            hint=f"write {node.name}",
        )
    if sym.kind == "let":
        raise SpecNameError(f"{node.name} is a function; call it: {node.name}(...)", node.span)
    if where == "param":
        _per_token_in_param(node)
    if where == "let":
        raise SpecNameError(
            f"let {owner} cannot read {node}: a let sees only its arguments and parameters",
            node.span,
            hint=f"pass {node} to {owner} as an argument",
        )
    if node.offset > 0:
        raise SpecAnalysisError(
            f"{node} refers to a later token: the mixer would not be causal",
            node.span,
            hint="a mixer may read tokens up to t only",
        )
    if sym.kind == "input" and node.offset < -1:
        raise NotYetImplemented(
            f"{node.name} at t{node.offset:+d}: an input is read at t or t-1",
            node.span,
            hint="to use an older token, keep it in a state",
        )
    if sym.kind == "value" and node.offset != 0:
        raise NotYetImplemented(
            f"{node.name} at t{node.offset:+d}: per-token values are read at t only",
            node.span,
            hint="read the inputs it is made of at t-1, or keep it in a state",
        )
    if sym.kind == "state" and node.offset < -1:
        raise NotYetImplemented(
            f"{node.name} at t{node.offset:+d}: a state is read at t or t-1", node.span
        )


def _check_times(mixer: Mixer, eq, states: set[str]) -> None:
    for node in walk(eq.value):
        if not isinstance(node, Timed):
            continue
        if (
            node.name in states
            and node.offset == -1
            and node.name != eq.target
            and eq.target in states
        ):
            raise SpecNameError(
                f"{node.name}_{{t-1}} can appear in its own update ({node.name}_t = ...) and in "
                f"outputs and per-token values, not in the update of {eq.target}",
                node.span,
                hint=f"did you mean {node.name}_t?",
            )
        if node.offset == 0 and node.name == eq.target:
            raise SpecAnalysisError(
                f"{node.name}_t on the right-hand side of its own "
                + ("update" if node.name in states else "definition"),
                node.span,
                hint=f"did you mean {node.name}_{{t-1}}?"
                if node.name in states
                else "a per-token value cannot depend on itself; carry it in a state",
            )


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
    value at t it reads. The one evaluation order of a mixer, for the analysis, the backends and
    the oracle. Raises a located error where a value depends on itself at the same step."""
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
