"""Load a spec from a path, a Source or text, parse and verify it: the compiler's front door."""

from __future__ import annotations

import os
from dataclasses import dataclass

from mixc.errors import ArgumentError, MixcError, Source, SpecError
from mixc.files import read_regular
from mixc.frontend.ir import Equation, Mixer
from mixc.frontend.lags import lower_lags
from mixc.frontend.limits import with_recursion_room
from mixc.frontend.parser import MAX_SPEC_BYTES, decode, parse
from mixc.frontend.shapes import Shape, Symbol
from mixc.frontend.verify import errors, verify


@dataclass(frozen=True)
class Spec:
    """A parsed and verified spec: its IR, its source text, and what the verifier computed
    (`mixc.frontend.verify.Verified`), which the analysis and the oracle read rather than
    compute again: the shape of every equation's target, every name's symbol, and the
    equations in the order one time step computes them."""

    mixer: Mixer
    source: Source
    shapes: dict[str, Shape]
    symbols: dict[str, Symbol]
    order: tuple[Equation, ...]


def read_source(path: str | os.PathLike) -> Source:
    """The spec file at `path`. A str is always a path, never spec text: the caller says which
    it gives (`source_of`), so that no file name is taken for text or text for a file name."""
    try:
        # enough to refuse a huge file without reading it all; a pipe, a device or a directory
        # is refused before it is read (a pipe would block until a writer came)
        data = read_regular(path, MAX_SPEC_BYTES + 1, "spec file")
    except FileNotFoundError:
        raise MixcError(f"{path}: no such spec file{_text_hint(path)}") from None
    except OSError as exc:
        raise MixcError(f"{path}: cannot read: {exc.strerror}{_text_hint(path)}") from None
    except ValueError:  # a NUL in the path
        raise MixcError(f"{str(path)!r}: not a spec file name{_text_hint(path)}") from None
    return decode(data, os.fsdecode(path))


def _text_hint(path: str | os.PathLike) -> str:
    """For a missing file whose name reads like spec text: how to pass spec text instead."""
    name = os.fsdecode(path)
    if "\n" in name or name.lstrip().startswith("mixer "):
        return " (to give spec text rather than a path, pass text=... or a Source)"
    return ""


def source_of(spec: str | os.PathLike | Source | None = None, *, text: str | None = None) -> Source:
    """The spec a caller gives, as a Source: a path (str or os.PathLike) names a file to read,
    `text=` is spec text itself, and a Source passes through. Exactly one of `spec` and `text`."""
    if (spec is None) == (text is None):
        raise ArgumentError("spec: give a spec path or Source, or text=..., and not both")
    if text is not None:
        if not isinstance(text, str):
            raise ArgumentError(f"text: expected spec text as a str, got {type(text).__name__}")
        return Source(text)
    if isinstance(spec, Source):
        return spec
    if not isinstance(spec, str | os.PathLike):
        raise ArgumentError(
            f"spec: expected a spec path, a Source or text=..., got {type(spec).__name__}"
        )
    return read_source(spec)


@with_recursion_room
def load_spec(spec: str | os.PathLike | Source | None = None, *, text: str | None = None) -> Spec:
    """Parse and verify a spec: a path (str or os.PathLike), a Source, or `text=` spec text.
    Raises located SpecErrors."""
    source = source_of(spec, text=text)
    try:
        mixer = parse(source)
        verified = verify(mixer)
        lowered = lower_lags(mixer)  # values read at t-1, written out once verified
        if lowered is not mixer:
            mixer, verified = lowered, verify(lowered)
    except SpecError as exc:
        raise exc.located(source) from None
    return Spec(mixer, source, verified.shapes, verified.symbols, verified.order)


def spec_errors(source: Source) -> list[SpecError]:
    """Every error of a spec's front end, located: those of the verifier that do not follow from
    another (`mixc.frontend.verify.errors`), or its one syntax error (parsing stops at the
    first). The first is the one `load_spec` raises; none when the spec loads."""
    try:
        mixer = parse(source)
    except SpecError as exc:
        return [exc.located(source)]
    found = errors(mixer)
    if not found:
        try:
            found = errors(lower_lags(mixer))
        except SpecError as exc:
            found = [exc]
    return [exc.located(source) for exc in found]
