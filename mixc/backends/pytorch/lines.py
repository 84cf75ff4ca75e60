"""Lines of generated Python, laid out as a person would: within the project's line length.

`Lines` collects the generated module line by line. A line longer than `WIDTH` is wrapped the
way a formatter would: a trailing comment moves above its statement, a call or signature puts
one argument per line, and a long sum breaks before its top-level `+` and `-`.

Text from outside (a spec's path, names, description, text and numbers) enters generated code
only through `string` (a quoted literal) and `comment`: both escape every character that is not
printable, and with it every line break Python's tokenizer or `str.splitlines` knows (`\r`,
`\x0b`, `\x0c`, `\x1c`-`\x1e`, `\x85`, `\u2028`, `\u2029`), so neither can end early and let
the rest of the text run as code. `Lines` refuses a line that holds a line break.
"""

from __future__ import annotations

import ast
import functools
import re
import textwrap

WIDTH = 100
_INDENT = "    "


class Lines:
    """Lines of code; `wrapped=False` leaves long lines as they are (the same code, and the same
    names in it, for a run of the emitter that only reads them)."""

    def __init__(self, wrapped: bool = True) -> None:
        self.lines: list[str] = []
        self.wrapped = wrapped

    def __call__(self, text: str = "", indent: int = 1) -> None:
        """Add one line of code at `indent` levels (wrapped to WIDTH): never several, since a
        line break inside `text` could come from outside text that `string` or `comment` did
        not escape."""
        if text and text.splitlines() != [text]:
            raise ValueError(f"one line of generated code at a time, got {text!r}")
        if not text:
            self.lines.append("")
            return
        line = _INDENT * indent + text
        if self.wrapped:
            self.lines.extend(wrap(line))
        else:
            self.lines.append(line)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _escape(c: str) -> str:
    """The escape of a character that is not printable (`\\r`, `\\x00`, `\\u2028`): itself
    printable, so never a line break."""
    return repr(c)[1:-1]


def string(text: str) -> str:
    """`text` as a double-quoted Python string literal on one line, equal to `text` when read
    back: quotes and backslashes are escaped, and so is every character that is not printable."""
    body = "".join("\\" + c if c in '"\\' else c if c.isprintable() else _escape(c) for c in text)
    return f'"{body}"'


def doc_line(text: str) -> str:
    """`text` for a line of a docstring: escaped as in a string literal (`string`), so that no
    quote, backslash or line break in it ends the docstring or the line."""
    return string(text)[1:-1]


def comment(text: str) -> str:
    """`# text` as a comment that ends where its line does: every character that is not
    printable but a tab is shown as its escape (a carriage return reads `\\r`)."""
    return "# " + "".join(c if c.isprintable() or c == "\t" else _escape(c) for c in text)


def wrap(line: str) -> list[str]:
    """`line` as one or more lines of at most WIDTH characters where it can be split; a line
    that is not one whole statement (a comment, a docstring line) stays as it is."""
    if len(line) <= WIDTH or not _statement(line.strip()):
        return [line]
    indent = line[: len(line) - len(line.lstrip())]
    code, comment = _split_comment(line.strip())
    if comment is not None:
        return [f"{indent}# {comment}", *wrap(indent + code)]
    return (
        _wrap_string(indent, code) or _wrap_call(indent, code) or _wrap_sum(indent, code) or [line]
    )


def _statement(code: str) -> bool:
    """Whether `code` is one Python statement (or the header of a block)."""
    if code.startswith("#"):
        return False
    try:
        compile(code + ("\n    pass" if code.endswith(":") else ""), "<line>", "exec")
    except SyntaxError:
        return False
    return True


#: A string literal from its opening quote to the closing one (or the end of the code), or a
#: bracket: what a scan of a line outside string literals must see. Ordinary characters between
#: them are skipped at C speed, so a scan is linear in the line with a small constant (a line may
#: hold a 63,000-character name, a call of 9,000 arguments).
_STRING_OR_BRACKET = r"""("[^"\\]*(?:\\.?[^"\\]*)*"?|'[^'\\]*(?:\\.?[^'\\]*)*'?)|([()\[\]{}])"""


@functools.cache
def _scanner(seps: tuple[str, ...]) -> re.Pattern:
    """A pattern whose matches are, in order: string literals (group 1), brackets (group 2) and
    the empty match before each separator of `seps` (group 3 empty), overlapping ones included."""
    found = "|".join(re.escape(s) for s in seps)
    return re.compile(_STRING_OR_BRACKET + (f"|(?=(?:{found}))()" if seps else ""), re.DOTALL)


def _outside_strings(code: str, start: int = 0, end: int | None = None, seps=()):
    """(position, bracket depth there) of each bracket of code[start:end] outside string
    literals, and of each place a separator of `seps` starts there; the depth counts the
    brackets opened since `start` and not yet closed (a closing bracket is at the depth it
    closes to)."""
    depth = 0
    for m in _scanner(tuple(seps)).finditer(code, start, len(code) if end is None else end):
        if m.group(1) is not None:
            continue
        c = m.group(2)
        if c is None:
            yield m.start(), depth
        elif c in ")]}":
            depth -= 1
            yield m.start(), depth
        else:
            yield m.start(), depth
            depth += 1


def _split_comment(code: str) -> tuple[str, str | None]:
    """(code, comment) for a line ending in `  # comment` outside any string."""
    if "  # " not in code:
        return code, None
    for i, _ in _outside_strings(code, seps=("  # ",)):
        if code.startswith("  # ", i):
            return code[:i], code[i + 4 :]
    return code, None


def _top_level(code: str, start: int, end: int, seps: tuple[str, ...]) -> list[int]:
    """Positions in code[start:end] of separators outside brackets and strings."""
    return [
        i
        for i, depth in _outside_strings(code, start, end, seps)
        if depth == 0 and code[i] not in "()[]{}"
    ]


def _matching(code: str, open_at: int) -> int:
    """The position of the bracket closing the one at `open_at`, or -1."""
    for i, depth in _outside_strings(code, open_at):
        if depth == 0 and i > open_at and code[i] in ")]}":
            return i
    return -1


_OPENING = re.compile(r"[(\[]")


def _wrap_call(indent: str, code: str) -> list[str] | None:
    """`f(a, b, c)` (the last bracket of the line closing the first one opened after any
    assignment) with one argument per line and a trailing comma."""
    eq = _top_level(code, 0, len(code), (" = ",))
    begin = eq[0] + 3 if eq else 0
    found = _OPENING.search(code, begin)
    if found is None:
        return None
    open_at = found.start()
    close = _matching(code, open_at)
    tail = code[close + 1 :]
    if close < 0 or tail not in ("", ":", ")", "):"):
        return None
    inner = code[open_at + 1 : close]
    commas = _top_level(inner, 0, len(inner), (",",))
    if not commas:
        return None
    starts, ends = [0, *(c + 1 for c in commas)], [*commas, len(inner)]
    args = [inner[a:b].strip() for a, b in zip(starts, ends, strict=True)]
    args = [a for a in args if a]
    together = indent + _INDENT + ", ".join(args)
    if len(together) <= WIDTH:
        body = [together]
    else:
        body = [line for a in args for line in wrap(indent + _INDENT + a + ",")]
    return [indent + code[: open_at + 1], *body, indent + code[close] + tail]


def _wrap_sum(indent: str, code: str) -> list[str] | None:
    """`x = a + b - c` as `x = (` then one term a line, breaking before top-level + and -."""
    eq = _top_level(code, 0, len(code), (" = ",))
    if not eq:
        return None
    start = eq[0] + 3
    ops = _top_level(code, start, len(code), (" + ", " - "))
    if not ops:
        return None
    inner = indent + _INDENT
    pieces = [code[start : ops[0]]]
    pieces += [code[a + 1 : b] for a, b in zip(ops, [*ops[1:], len(code)], strict=False)]
    return [f"{indent}{code[:start]}(", *(inner + p.strip() for p in pieces), f"{indent})"]


def _wrap_string(indent: str, code: str) -> list[str] | None:
    """`f("a long message")` as `f(` then the message in adjacent literals, split at spaces."""
    open_at = code.find("(")
    if open_at < 0 or not code.endswith(")") or code[open_at + 1 : open_at + 2] not in "\"'":
        return None  # the argument is not one string literal (read as Python, it could be long)
    try:
        text = ast.literal_eval(code[open_at + 1 : -1])
    except (ValueError, SyntaxError):
        return None
    if not isinstance(text, str):
        return None
    inner = indent + _INDENT
    pieces = textwrap.wrap(
        text,
        WIDTH - len(inner) - 2,
        drop_whitespace=False,
        replace_whitespace=False,
        break_long_words=False,
        break_on_hyphens=False,
    )
    if "".join(pieces) != text:
        return None
    return [indent + code[: open_at + 1], *(inner + repr(p) for p in pieces), indent + ")"]
