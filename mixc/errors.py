"""mixc's errors: one root, `MixcError`, and located subclasses that point into a spec.

A located message reads like a compiler's::

    specs/bad.mix:5:21: error: cannot multiply v_t [V] by k_t [K]
      5 | H_t = H_{t-1} + v_t k_t
        |                 ^^^^^^^
      expected: a matrix product whose inner sizes agree
      hint: v_t k_t is [V] times [K]; did you mean v_t k_t^T?
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

__all__ = [
    "ArgumentError",
    "InputError",
    "MixcError",
    "NotYetImplemented",
    "Source",
    "Span",
    "SpecAnalysisError",
    "SpecError",
    "SpecNameError",
    "SpecShapeError",
    "SpecSyntaxError",
]


@dataclass(frozen=True, slots=True)
class Span:
    """A region of spec text: 1-based line and column of its first and last character."""

    line: int
    column: int
    end_line: int
    end_column: int

    @staticmethod
    def point(line: int, column: int) -> Span:
        return Span(line, column, line, column)


@dataclass(frozen=True, slots=True)
class Source:
    """Spec text and the name it came from (a path, or '<string>')."""

    text: str
    filename: str = "<string>"

    def line(self, number: int) -> str:
        """Line `number` (1-based) without its ending. Lines end at '\n' only, as in the lexer."""
        lines = _lines(self.text)
        return lines[number - 1].removesuffix("\r") if 0 < number <= len(lines) else ""


@functools.lru_cache(maxsize=4)
def _lines(text: str) -> tuple[str, ...]:
    """`text` split at '\n', once for all the errors of one spec (a spec may have thousands)."""
    return tuple(text.split("\n"))


class MixcError(Exception):
    """Root of every error mixc raises on purpose. The CLI prints it without a traceback."""


class SpecError(MixcError):
    """An error located in a spec: file:line:col, the line, a caret, what was expected, a hint."""

    kind = "error"

    def __init__(
        self,
        message: str,
        span: Span | None = None,
        source: Source | None = None,
        *,
        expected: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.message = message
        self.span = span or Span.point(1, 1)
        self.source = source
        self.expected = expected
        self.hint = hint
        super().__init__(self.render())

    def located(self, source: Source) -> SpecError:
        """The same error, attached to `source` (errors raised deep inside get their file here)."""
        if self.source is None:
            self.source = source
            self.args = (self.render(),)
        return self

    def render(self) -> str:
        span = self.span
        filename = self.source.filename if self.source else "<spec>"
        out = [f"{filename}:{span.line}:{span.column}: {self.kind}: {self.message}"]
        if self.source is not None and self.source.text:
            text, column = _window(self.source.line(span.line), span.column)
            text = _printable(text)  # one character for one: the column stays
            width = (span.end_column - span.column + 1) if span.end_line == span.line else 1
            width = max(1, min(width, len(text) - column + 1))
            pad = "".join("\t" if ch == "\t" else " " for ch in text[: column - 1])
            out.append(f"  {span.line} | {text}")
            out.append(f"  {' ' * len(str(span.line))} | {pad.ljust(column - 1)}{'^' * width}")
        if self.expected:
            out.append(f"  expected: {self.expected}")
        if self.hint:
            out.append(f"  hint: {self.hint}")
        return "\n".join(out)


def _printable(line: str) -> str:
    """A spec line safe to echo on a terminal: control characters shown as '?'."""
    return "".join(ch if ch.isprintable() or ch == "\t" else "?" for ch in line)


def _window(line: str, column: int, width: int = 100) -> tuple[str, int]:
    """At most `width` characters of a long line around `column`, and the column within them."""
    if len(line) <= width:
        return line, column
    start = max(0, min(column - 1 - width // 2, len(line) - width))
    text = ("..." if start else "") + line[start : start + width]
    text += "..." if start + width < len(line) else ""
    return text, column - start + (3 if start else 0)


class SpecSyntaxError(SpecError):
    """The text is not in the spec language."""


class SpecNameError(SpecError):
    """A name is undefined, defined twice, reserved, or used at the wrong time index."""


class SpecShapeError(SpecError):
    """Sizes do not agree: a product, a sum, an update or a readout has the wrong shape."""


class SpecAnalysisError(SpecError):
    """The spec is well-formed but its recurrence is not: non-causal, unread state, ..."""


class NotYetImplemented(SpecError):  # noqa: N818 (a public name)
    """Valid, but mixc cannot do this yet. Messages start with 'NYI:' and say what to do instead."""

    def __init__(self, message: str, *args, **kwargs) -> None:
        super().__init__(
            message if message.startswith("NYI:") else f"NYI: {message}", *args, **kwargs
        )


class InputError(MixcError, ValueError):
    """A compiled mixer was called with a wrong argument (shape, dtype, device)."""


class ArgumentError(MixcError, TypeError):
    """A public function was given an argument of the wrong kind (a number for a spec path)."""
