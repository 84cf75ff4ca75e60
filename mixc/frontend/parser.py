"""Spec text -> IR. Lark (LALR, no recursion) parses to a tree, which `_ToIR` turns into IR
bottom-up with an explicit stack; every lark error becomes a located `SpecSyntaxError`."""

from __future__ import annotations

import math
import re
import threading
import unicodedata
from collections import OrderedDict
from functools import cache
from pathlib import Path

import lark
from lark import Lark, Tree

from mixc.errors import MixcError, Source, Span, SpecSyntaxError
from mixc.frontend.ir import (
    Binary,
    Call,
    Decl,
    Equation,
    Identity,
    LetFn,
    Mixer,
    Name,
    Neg,
    Number,
    Param,
    Timed,
    Transpose,
    children,
)

MAX_SPEC_BYTES = 64_000  # a spec is a few lines; this bounds the parse to well under a second
MAX_DEPTH = 200

#: What to do about an expression nested more than MAX_DEPTH levels. Not "split it into per-token
#: values": the analysis inlines those where they are read, so the depth comes back.
DEPTH_HINT = "parenthesise a long sum or product: (a + b) + (c + d) nests less than a + b + c + d"

_GRAMMAR_PLACES = (
    Path(__file__).parent.parent / "grammar" / "mixer.lark",  # installed wheel
    Path(__file__).parent.parent.parent / "grammar" / "mixer.lark",  # source checkout
)

# Characters that look like ASCII ones; an error about them says which ASCII to type instead.
# fmt: off
_CONFUSABLES = {
    "а": "a", "е": "e", "о": "o", "р": "p", "с": "c", "х": "x", "у": "y", "і": "i", "ј": "j",
    "ο": "o", "ν": "v", "α": "alpha", "β": "beta", "γ": "gamma", "φ": "phi", "σ": "sigmoid",
    "∗": "*", "×": "* or juxtaposition", "‐": "-", "–": "-", "—": "-", "＋": "+", "＝": "=",
    "（": "(", "）": ")", "，": ",", "’": "'", "“": '"', "”": '"', "\u00a0": "a space",
    "\u200b": "nothing (zero-width space)", "∘": "*", "⋅": ".", "•": ".", "⊤": "^T", "ᵗ": "^T",
}
# fmt: on

_TOKEN_WORDS = {
    "NAME": "a name",
    "CALLEE": "a function call",
    "NUMBER": "a number",
    "TIME": "a time index (_t or _{t-1})",
    "TRANSPOSE": "^T",
    "STRING": 'a "description"',
    "_NL": "end of line",
    "$END": "end of file",
}


@cache
def _lark() -> Lark:
    for place in _GRAMMAR_PLACES:
        if place.is_file():
            return Lark(
                place.read_text(encoding="utf-8"),
                parser="lalr",
                propagate_positions=True,
                maybe_placeholders=False,
            )
    raise MixcError("mixc is installed without grammar/mixer.lark; reinstall it")


def _span(meta) -> Span | None:
    if getattr(meta, "empty", True):
        return None
    return Span(meta.line, meta.column, meta.end_line, max(meta.column, meta.end_column - 1))


def _token_span(tok: lark.Token) -> Span:
    return Span(tok.line, tok.column, tok.end_line, max(tok.column, tok.end_column - 1))


def _time_offset(tok: lark.Token) -> int:
    text = re.sub(r"\s", "", str(tok)).replace("−", "-")
    if text == "_t":
        return 0
    m = re.fullmatch(r"_\{t([+-][0-9]+)?\}", text)
    assert m, text
    offset = m.group(1) or "0"
    if len(offset) > 7:
        raise SpecSyntaxError(
            "time offset too large",
            _token_span(tok),
            hint="a mixer reads tokens at t, states at t-1",
        )
    return int(offset)


def _number_text(tok: lark.Token) -> str:
    """A literal's canonical text. Refuses one beyond float64 (1e999, or 309 digits), which the
    generated code computes in."""
    text = str(tok)
    if math.isinf(float(text)):
        shown = text if len(text) <= 24 else f"{text[:20]}... ({len(text):,} digits)"
        raise SpecSyntaxError(
            f"number {shown} is too large",
            _token_span(tok),
            hint="numbers are computed in float64, whose largest is about 1.8e308",
        )
    if text.isdigit():
        return text.lstrip("0") or "0"  # as str(int(text)), without Python's limit on digits
    return repr(float(text))


class _ToIR:
    """Lark tree -> IR, post-order with an explicit stack (no recursion, so deep input cannot
    overflow Python's stack); tracks depth to refuse absurdly nested expressions."""

    def __init__(self) -> None:
        self.depth: dict[int, int] = {}

    def convert(self, tree: Tree):
        done: list = []
        stack: list = [(tree, False)]
        while stack:
            node, expanded = stack.pop()
            if not isinstance(node, Tree):
                done.append(node)
            elif expanded:
                n = len(node.children)
                items = done[len(done) - n :] if n else []
                del done[len(done) - n :]
                done.append(getattr(self, node.data)(node.meta, items))
            else:
                stack.append((node, True))
                stack.extend((c, False) for c in reversed(node.children))
        return done[0]

    def _node(self, cls, meta, *fields):
        node = cls(*fields, span=_span(meta))
        depth = 1 + max((self.depth.get(id(c), 0) for c in children(node)), default=0)
        if depth > MAX_DEPTH:
            raise SpecSyntaxError(
                f"expression nested too deeply (more than {MAX_DEPTH} levels)",
                node.span,
                hint=DEPTH_HINT,
            )
        self.depth[id(node)] = depth
        return node

    # expressions
    def number(self, meta, items):
        return self._node(Number, meta, _number_text(items[0]))

    def name(self, meta, items):
        if items[0] == "I":
            return self._node(Identity, meta)
        return self._node(Name, meta, str(items[0]))

    def timed(self, meta, items):
        return self._node(Timed, meta, str(items[0]), _time_offset(items[1]))

    def call(self, meta, items):
        return self._node(Call, meta, str(items[0]), tuple(items[1:]))

    def neg(self, meta, items):
        return self._node(Neg, meta, items[0])

    def transpose(self, meta, items):
        return self._node(Transpose, meta, items[0])

    def _binary(op):  # noqa: N805 - a rule-method factory
        def rule(self, meta, items):
            return self._node(Binary, meta, op, items[0], items[1])

        return rule

    add = _binary("+")
    sub = _binary("-")
    hadamard = _binary("*")
    div = _binary("/")
    matmul = _binary("@")
    dot = _binary(".")
    pow = _binary("^")

    # declarations and statements
    def shape(self, meta, items):
        return tuple(str(i) for i in items)

    def decl(self, meta, items):
        return Decl(str(items[0]), items[1] if len(items) > 1 else (), span=_span(meta))

    def param(self, meta, items):
        name, rest = str(items[0]), items[1:]
        shape = rest.pop(0) if rest and isinstance(rest[0], tuple) else ()
        return Param(name, shape, rest[0] if rest else None, span=_span(meta))

    def input_decls(self, meta, items):
        return ("inputs", items)

    def state_decls(self, meta, items):
        return ("states", items)

    def param_decls(self, meta, items):
        return ("params", items)

    def let_fn(self, meta, items):
        name, *args, body = items
        return ("lets", [LetFn(str(name), tuple(str(a) for a in args), body, span=_span(meta))])

    def equation(self, meta, items):
        target, time, value = items
        if _time_offset(time) != 0:
            raise SpecSyntaxError(
                f"the left-hand side must be at time t, not {target}{time}",
                Span(target.line, target.column, time.end_line, time.end_column - 1),
                expected=f"{target}_t = ...",
                hint="an update defines the new value from the old: H_t = ... H_{t-1} ...",
            )
        return ("equations", [Equation(str(target), value, span=_span(meta))])

    def header(self, meta, items):
        description = str(items[1])[1:-1] if len(items) > 1 else None
        return ("header", (str(items[0]), description, _span(meta)))

    def start(self, meta, items):
        (name, description, span), groups = items[0][1], {}
        for kind, nodes in items[1:]:
            groups.setdefault(kind, []).extend(nodes)
        return Mixer(name, description, **{k: tuple(v) for k, v in groups.items()}, span=span)


def decode(data: bytes, filename: str = "<string>") -> Source:
    """Bytes of a spec file -> Source, refusing what is not UTF-8 text."""
    if len(data) > MAX_SPEC_BYTES:
        text = data.decode("utf-8", "replace")  # the text to show the line from
        raise _too_long(
            _offset_span(text, len(data[:MAX_SPEC_BYTES].decode("utf-8", "replace")))
        ).located(Source(text, filename))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = data[: exc.start].decode("utf-8", "replace")
        line = before.count("\n") + 1
        col = len(before) - (before.rfind("\n") + 1) + 1
        raise SpecSyntaxError(
            f"spec is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})",
            Span.point(line, col),
            Source(data.decode("utf-8", "replace"), filename),
            hint="is this the right file? specs are plain text files, usually *.mix",
        ) from None
    return Source(text.removeprefix("\ufeff"), filename)


def parse(source: Source | str) -> Mixer:
    """Parse spec text into an (unverified) Mixer. Raises SpecSyntaxError on malformed input.

    The Mixers of the texts parsed last are kept (`_PARSED`): loading a layer parses its spec
    for the layer, the plan and the module, and a spec of 64 KB takes a second to parse. A
    Mixer is immutable, so one can be shared."""
    if isinstance(source, str):
        source = Source(source)
    with _PARSED_LOCK:
        mixer = _PARSED.get(source.text)
        if mixer is not None:
            _PARSED.move_to_end(source.text)
            return mixer
    try:
        mixer = _parse(source)
    except SpecSyntaxError as exc:
        raise exc.located(source) from None
    with _PARSED_LOCK:
        _PARSED[source.text] = mixer
        while len(_PARSED) > 8:
            _PARSED.popitem(last=False)
    return mixer


_PARSED: OrderedDict[str, Mixer] = OrderedDict()
_PARSED_LOCK = threading.Lock()


def _parse(source: Source) -> Mixer:
    text = source.text
    if len(text.encode("utf-8", "surrogatepass")) > MAX_SPEC_BYTES:
        size = 0
        for offset, ch in enumerate(text):  # the first character past the limit
            size += len(ch.encode("utf-8", "surrogatepass"))
            if size > MAX_SPEC_BYTES:
                raise _too_long(_offset_span(text, offset))
    if not text.strip() or not re.sub(r"#[^\n]*", "", text).strip():
        raise SpecSyntaxError(
            "empty spec",
            expected="a header line: mixer NAME",
            hint='a spec starts with `mixer my_mixer "what it is"`',
        )
    bad = re.search(r"[\x00-\x08\x0b\x0e-\x1f\x7f-\x9f]", text)
    if bad:
        raise SpecSyntaxError(
            f"control character U+{ord(bad.group()):04X} in the spec",
            _offset_span(text, bad.start()),
            hint="is this the right file? specs are plain text",
        )
    # shown raw by a terminal (check reprints the description; the module's header comments
    # hold every line), these would make the text display otherwise than it reads
    shown = re.search(r"\r(?!\n)|[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]", text)
    if shown:
        ch = shown.group()
        lone_cr = ch == "\r"
        raise SpecSyntaxError(
            "a carriage return (U+000D) not followed by a line feed"
            if lone_cr
            else f"bidirectional control character U+{ord(ch):04X} in the spec",
            _offset_span(text, shown.start()),
            hint="lines end with \\n or \\r\\n; a lone \\r sends a terminal back to the start "
            "of the line"
            if lone_cr
            else "it makes a terminal or an editor show the text in another order than it "
            "reads; delete it",
        )
    try:
        tree = _lark().parse(text)
    except lark.exceptions.UnexpectedCharacters as exc:
        raise _unexpected_character(exc, text) from None
    except lark.exceptions.UnexpectedToken as exc:
        raise _unexpected_token(exc, text) from None
    except lark.exceptions.UnexpectedEOF as exc:
        raise _unexpected_token(exc, text) from None
    return _ToIR().convert(tree)


def _too_long(where: Span) -> SpecSyntaxError:
    """The error for a spec over MAX_SPEC_BYTES, at the first character past the limit."""
    return SpecSyntaxError(
        f"spec is longer than {MAX_SPEC_BYTES:,} bytes",
        where,
        hint="is this the right file? a spec is a few lines of text",
    )


def _offset_span(text: str, offset: int) -> Span:
    line = text.count("\n", 0, offset) + 1
    return Span.point(line, offset - (text.rfind("\n", 0, offset) + 1) + 1)


def _unexpected_character(exc, text: str) -> SpecSyntaxError:
    ch = text[exc.pos_in_stream] if exc.pos_in_stream < len(text) else ""
    span = Span.point(exc.line, exc.column)
    if ch and not ch.isascii():
        name = unicodedata.name(ch, "unnamed character")
        looks = _CONFUSABLES.get(ch)
        return SpecSyntaxError(
            f"unexpected character {ch!r} (U+{ord(ch):04X} {name})",
            span,
            expected="ASCII names; the only non-ASCII symbols are ⊙ · ᵀ −",
            hint=f"type {looks} instead" if looks else "names and numbers are ASCII",
        )
    hint = None
    if ch == "_":
        hint = "names start with a letter; a time index is written x_t or x_{t-1}"
    elif ch == "{":
        hint = "time indices are written _{t-1}, right after a name"
    elif ch == '"':
        hint = 'a description is one line in double quotes: mixer NAME "description"'
    elif ch == "\r":
        hint = "lines end with \\n or \\r\\n; convert the file's line endings"
    return SpecSyntaxError(
        f"unexpected character {ch!r}", span, expected=_expected_words(_acceptable(exc)), hint=hint
    )


def _unexpected_token(exc, text: str) -> SpecSyntaxError:
    tok = getattr(exc, "token", None)
    if tok is None or tok.type == "$END" or getattr(tok, "line", None) is None:
        return SpecSyntaxError(
            "unexpected end of file",
            _offset_span(text, len(text.rstrip())),
            expected=_expected_words(_acceptable(exc)),
        )
    what = "end of line" if tok.type == "_NL" else repr(str(tok))
    span = _token_span(tok) if tok.type != "_NL" else Span.point(tok.line, tok.column)
    acceptable = _acceptable(exc)
    expected = _expected_words(acceptable)
    before = text[: tok.start_pos].rstrip(" \t")[-1:]
    hint = None
    if tok.type == "_NL" and before and before in "+-−*⊙/@.·^=(,":
        hint = "a line break ends a statement; to go on, end the line with \\"
    elif tok.type == "EQUAL":
        hint = "equations are written NAME_t = expression, one per line"
    elif "MIXER" in acceptable:
        hint = 'a spec starts with its header line: mixer NAME "description"'
    elif tok.type == "MIXER":
        hint = "a spec has one `mixer` line, at the top"
    elif str(tok) in ("in", "param", "state", "let"):
        hint = f"`{tok}` starts a new line"
    elif acceptable == {"CALLEE"}:
        hint = "a let defines a function: let phi(x) = elu(x) + 1"
    elif tok.type == "STAR" and before == "*":
        hint = "a power is written x^2"
    elif tok.type == "TIME":
        hint = "a time index follows a per-token name directly (q_t); declarations have none"
    return SpecSyntaxError(f"unexpected {what}", span, expected=expected, hint=hint)


def _acceptable(exc: lark.exceptions.UnexpectedInput) -> set[str]:
    """The terminals the parser takes at the error. Lark's own `expected` lists come from LALR
    states shared by several contexts, so they may name tokens (a ')' outside parentheses) that
    cannot come next; asking the parser state is exact."""
    parser = getattr(exc, "interactive_parser", None)
    if parser is not None:
        return set(parser.accepts())
    return set(getattr(exc, "expected", None) or getattr(exc, "allowed", None) or ())


def _expected_words(names) -> str:
    parser = _lark()
    words = set()
    for name in names or ():
        if name in _TOKEN_WORDS:
            words.add(_TOKEN_WORDS[name])
            continue
        try:
            pattern = parser.get_terminal(name).pattern
        except KeyError:
            words.add(name)
            continue
        if isinstance(pattern, lark.lexer.PatternStr):
            if pattern.value.isascii():
                words.add(repr(pattern.value))
        else:
            words.add(name.lower())
    return (
        "one of " + ", ".join(sorted(words))
        if len(words) > 1
        else "".join(words) or "something else"
    )
