"""Load a spec from a path or text, parse and verify it: the front door of the compiler."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ._parser import decode, parse
from ._verify import Shape, verify
from .errors import MixcError, Source, SpecError
from .ir import Mixer


@dataclass(frozen=True)
class Spec:
    """A parsed and verified spec: its IR, its source text, and the shape of every equation."""

    mixer: Mixer
    source: Source
    shapes: dict[str, Shape]


def read_source(spec: str | os.PathLike) -> Source:
    """A path to a spec file, or spec text itself (anything containing a newline or 'mixer ')."""
    if isinstance(spec, str) and ("\n" in spec or spec.lstrip().startswith("mixer ")):
        return Source(spec, "<string>")
    path = Path(spec)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise MixcError(f"{path}: no such spec file") from None
    except IsADirectoryError:
        raise MixcError(f"{path}: is a directory, not a spec file") from None
    except OSError as exc:
        raise MixcError(f"{path}: cannot read: {exc.strerror}") from None
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
