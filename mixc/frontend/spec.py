"""Load a spec from a path or text, parse and verify it: the front door of the compiler."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from mixc.errors import MixcError, Source, SpecError
from mixc.frontend.ir import Mixer
from mixc.frontend.parser import MAX_SPEC_BYTES, decode, parse
from mixc.frontend.shapes import Shape
from mixc.frontend.verify import errors, verify


@dataclass(frozen=True)
class Spec:
    """A parsed and verified spec: its IR, its source text, and the shape of every equation."""

    mixer: Mixer
    source: Source
    shapes: dict[str, Shape]


def read_source(spec: str | os.PathLike) -> Source:
    """A path to a spec file, or spec text itself (anything containing a newline or 'mixer ',
    or nothing but blanks)."""
    if isinstance(spec, str) and (
        "\n" in spec or spec.lstrip().startswith("mixer ") or not spec.strip()
    ):
        return Source(spec, "<string>")
    path = Path(spec)
    try:
        with path.open("rb") as f:
            data = f.read(MAX_SPEC_BYTES + 1)  # enough to refuse a huge file without reading it all
    except FileNotFoundError:
        raise MixcError(f"{path}: no such spec file") from None
    except IsADirectoryError:
        raise MixcError(f"{path}: is a directory, not a spec file") from None
    except OSError as exc:
        raise MixcError(f"{path}: cannot read: {exc.strerror}") from None
    except ValueError:  # a NUL in the path
        raise MixcError(f"{str(spec)!r}: not a spec file name, and not spec text") from None
    return decode(data, str(spec))


def load_spec(spec: str | os.PathLike | Source) -> Spec:
    """Parse and verify a spec given as a path, text, or Source. Raises located SpecErrors."""
    source = spec if isinstance(spec, Source) else read_source(spec)
    try:
        mixer = parse(source)
        shapes = verify(mixer)
    except SpecError as exc:
        raise exc.located(source) from None
    return Spec(mixer, source, shapes)


def spec_errors(source: Source) -> list[SpecError]:
    """Every error of a spec's front end, located: those of the verifier that do not follow from
    another (`mixc.frontend.verify.errors`), or its one syntax error (parsing stops at the
    first). The first is the one `load_spec` raises; none when the spec loads."""
    try:
        mixer = parse(source)
    except SpecError as exc:
        return [exc.located(source)]
    return [exc.located(source) for exc in errors(mixer)]
