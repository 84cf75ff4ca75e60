"""The names and time indices of a spec, as the verifier (`mixc.frontend.verify`) checks them:
what a spec declares (each name free, not reserved, declared once, with well-formed sizes) and
what its expressions read (each name declared, called or read at a time it has), every error
with a hint toward the likely fix. The words a spec may not declare are here too (`RESERVED`).
"""

from __future__ import annotations

import keyword
import re

from mixc.errors import NotYetImplemented, Span, SpecAnalysisError, SpecNameError, SpecShapeError
from mixc.frontend.constants import constant
from mixc.frontend.ir import (
    CHANNEL,
    FUNCTIONS,
    POSITION,
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
    walk,
)
from mixc.frontend.shapes import Symbol
from mixc.frontend.suggest import Suggestions

__all__ = [
    "FORM_OPTIONS",
    "LANGUAGE_WORDS",
    "LAYOUT_SIZES",
    "MAX_LITERAL_SIZE",
    "RESERVED",
    "Known",
    "Names",
    "check_let_calls",
    "check_mixer_name",
    "check_names",
    "check_target",
    "check_times",
    "declare",
    "declare_let",
    "renamings",
]


#: Sizes the compiled modules' layout uses for batch, tokens and heads: a spec cannot reuse them.
LAYOUT_SIZES = frozenset({"B", "T", "NH"})

#: Words of the spec language: the keywords that start its lines, the time index t, the head
#: index h of parameter defaults and the identity I.
LANGUAGE_WORDS = frozenset(
    {"mixer", "in", "param", "state", "let", "t", "h", "I", POSITION, CHANNEL}
)

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

#: What a name may look like (the grammar's NAME token).
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9]*(_(?!t(?![A-Za-z0-9_])|\{)[A-Za-z0-9]+)*")


def renamings(name: str) -> list[str]:
    """Two names close to a refused `name` that the language accepts (free of reserved words)."""
    candidates = [f"{name}1", f"my_{name}", f"{name}_1", f"{name}2", f"{name}x"]
    return [c for c in candidates if _NAME.fullmatch(c) and c not in RESERVED][:2]


def _rename_hint(name: str) -> str:
    """A hint for a refused name: two it could be renamed to."""
    return "rename it, e.g. " + " or ".join(renamings(name))


# ----------------------------------------------------------------------------- declarations


def check_mixer_name(mixer: Mixer) -> None:
    """The mixer's name is none of the RESERVED words, as every name the spec declares."""
    if mixer.name in RESERVED:
        raise SpecNameError(
            f"mixer name {mixer.name!r} is reserved",
            mixer.span,
            hint=_rename_hint(mixer.name),
        )


def declare(names: Names, d: Decl | Param, kind: str) -> None:
    """Claim the name of an input, parameter or state (`kind` says which) and check its sizes."""
    names.claim(d.name, kind, d.span)
    _check_sizes(d)


def declare_let(names: Names, fn: LetFn) -> None:
    """Claim a let's name and check its arguments' names."""
    names.claim(fn.name, "a let function", fn.span)
    _check_let_arguments(fn)


class Names:
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


def check_target(mixer: Mixer, names: Names, targets: dict[str, Span | None], eq: Equation) -> None:
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


# ----------------------------------------------------------------------------- reads


def check_let_calls(lets: frozenset[str], fn: LetFn, above: set[str]) -> None:
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


def _callee_span(call: Call) -> Span | None:
    """The span of a call's function name, where an error about the function belongs."""
    if call.span is None:
        return None
    return Span(
        call.span.line, call.span.column, call.span.line, call.span.column + len(call.func) - 1
    )


class Known:
    """A mixer's names (`symbols`, its lets) and the closest of them to a misspelt one."""

    def __init__(self, mixer: Mixer, symbols: dict[str, Symbol]) -> None:
        self.symbols = symbols
        self.lets = frozenset(fn.name for fn in mixer.lets)
        self.backward = frozenset(mixer.backward)
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


def check_names(known: Known, expr: Expr, args: set[str], where: str, owner: str) -> None:
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


def _check_untimed(node: Name, known: Known, args: set[str], where: str, owner: str) -> None:
    if node.name in args:
        return
    if node.name == "h":
        raise SpecNameError(
            "h (the head index) can only be used in a parameter default",
            node.span,
            hint="declare a parameter: param gamma = ... h ...",
        )
    if node.name == CHANNEL:
        raise SpecNameError(
            f"{CHANNEL} (the channel index) can only be used in the default of a vector parameter",
            node.span,
            hint=f"declare one: param w[K] = 10000^(-2 {CHANNEL} / K)",
        )
    if node.name == POSITION:
        raise SpecNameError(
            f"{POSITION} is the token's position and needs the time index: {POSITION}_t",
            node.span,
            hint=f"did you mean {POSITION}_t?",
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
    if sym.kind == "size":
        return
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


def _check_timed(node: Timed, known: Known, args: set[str], where: str, owner: str) -> None:
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
    _check_size_or_position(node, sym)
    if where == "param":
        _per_token_in_param(node)
    if where == "let":
        raise SpecNameError(
            f"let {owner} cannot read {node}: a let sees only its arguments and parameters",
            node.span,
            hint=f"pass {node} to {owner} as an argument",
        )
    if node.offset > 0 or (sym.kind == "state" and node.name in known.backward):
        _check_ahead(node, sym.kind, known)
    if sym.kind == "input" and node.offset == -1 and known.backward:
        raise NotYetImplemented(
            f"{node}: a non-causal mixer (with the backward state {min(known.backward)}) reads "
            "its inputs at t only",
            node.span,
            hint=f"keep {node.name}_{{t-1}} in a forward state, or drop the token shift",
        )
    if sym.kind == "input" and node.offset < -1:
        raise NotYetImplemented(
            f"{node.name} at t{node.offset:+d}: an input is read at t or t-1",
            node.span,
            hint="to use an older token, keep it in a state",
        )
    if sym.kind == "value" and node.offset < -1:  # at t-1: mixc.frontend.lags
        raise NotYetImplemented(
            f"{node.name} at t{node.offset:+d}: a per-token value is read at t or t-1",
            node.span,
            hint="to use an older token, keep it in a state",
        )
    if sym.kind == "state" and node.offset < -1:
        raise NotYetImplemented(
            f"{node.name} at t{node.offset:+d}: a state is read at t or t-1", node.span
        )


def _check_size_or_position(node: Timed, sym: Symbol) -> None:
    """A size has no time index; the position is read at t only."""
    if sym.kind == "size":
        raise SpecNameError(
            f"{node.name} is a size and has no time index", node.span, hint=f"write {node.name}"
        )
    if sym.kind == "position" and node.offset != 0:
        raise SpecNameError(
            f"{node}: the position is read at t only",
            node.span,
            hint=f"the position of token t{node.offset:+d} is "
            f"{POSITION}_t {'-' if node.offset < 0 else '+'} {abs(node.offset)}",
        )


def _check_ahead(node: Timed, kind: str, known: Known) -> None:
    """A read at t+1 is of a backward state (one updated from G_{t+1}), which is read at t or
    t+1 only; nothing else is read at a later token."""
    backward = node.name in known.backward
    if kind == "state" and backward and node.offset not in (0, 1):
        raise NotYetImplemented(
            f"{node}: {node.name} runs backward in time (its update reads {node.name}_{{t+1}}); "
            "a backward state is read at t or t+1",
            node.span,
            hint=f"did you mean {node.name}_{{t+1}}?",
        )
    if kind == "state" and node.offset == 1 and not backward:
        raise SpecAnalysisError(
            f"{node} refers to a later token, but {node.name} runs forward in time (its update "
            f"does not read {node.name}_{{t+1}})",
            node.span,
            hint=f"read {node.name}_t or {node.name}_{{t-1}}; to read later tokens, declare a "
            f"backward state: G_t = a_t G_{{t+1}} + v_t k_t^T",
        )
    if kind != "state":
        raise SpecAnalysisError(
            f"{node} refers to a later token",
            node.span,
            hint="read inputs and per-token values at t; a mixer reads later tokens through a "
            "backward state (G_t = a_t G_{t+1} + v_t k_t^T, read as G_t or G_{t+1})",
        )


def check_times(mixer: Mixer, eq, states: set[str]) -> None:
    """The time indices of one equation: no target read at t on its own right-hand side. A
    state at t-1 may be read anywhere, in another state's update too (a pipeline reads
    `H_{t-1} q_t`, and the recurrence holds every state before the token's updates)."""
    for node in walk(eq.value):
        if not isinstance(node, Timed):
            continue
        if (
            node.name in states
            and node.offset == 1
            and node.name != eq.target
            and eq.target in states
        ):
            raise SpecNameError(
                f"{node.name}_{{t+1}} can appear in its own update ({node.name}_t = ...) and in "
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


def called(base: str, operands) -> str:
    """A readable local name (for generated code and the lowered program): `base` followed by the names among `operands` where each is a name or a constant
    (`kk_kappa` for kk(kappa_t)); `base` alone otherwise."""
    names = [x.name for x in operands if isinstance(x, Name | Timed)]
    if names and all(isinstance(x, Name | Timed) or constant(x) is not None for x in operands):
        return "_".join([base, *names])
    return base
