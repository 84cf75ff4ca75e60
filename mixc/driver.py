"""Compile a spec to source, write it atomically, or load it in-process."""

from __future__ import annotations

import hashlib
import linecache
import os
import sys
import tempfile
import types
from pathlib import Path

from mixc.analysis.plan import Plan, analyze
from mixc.backends import get as get_backend
from mixc.errors import MixcError, NotYetImplemented, SpecError
from mixc.frontend.spec import Spec, load_spec, source_of

_CACHE: dict[tuple[str, str, str], types.ModuleType] = {}


def plan(spec=None, backend: str = "pytorch", *, text: str | None = None) -> Plan:
    """A spec (a path, a Source, a loaded Spec, or `text=` spec text) -> its plan, after every
    check `compile` makes: parsing, verification, analysis and the backend's own refusals.
    `mixc check`, `mixc explain` and `mixc compile` all start here, so they accept and refuse
    the same specs."""
    loaded = spec if isinstance(spec, Spec) else load_spec(spec, text=text)
    result = analyze(loaded)
    reason = get_backend(backend).supports(result)
    if reason is not None:
        outputs = loaded.mixer.outputs
        where = outputs[-1].span if outputs else None
        raise NotYetImplemented(reason, where).located(loaded.source)
    return result


def compile_source(spec=None, backend: str = "pytorch", *, text: str | None = None) -> str:
    """A spec (as `plan` takes it) -> the generated module's source."""
    result = plan(spec, backend, text=text)
    try:
        return get_backend(backend).emit(result)
    except SpecError as exc:
        raise exc.located(result.spec.source) from None


def write_atomically(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` via a temporary file and a rename: never a partial file."""
    path = Path(path)
    if path.is_dir():
        raise MixcError(f"{path}: is a directory; give a file name such as {path / 'mixer.py'}")
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise MixcError(f"{path}: directory {directory} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load(spec=None, backend: str = "pytorch", *, text: str | None = None) -> types.ModuleType:
    """Compile in-process and return the module (chunk, recurrent, step, and parallel where the
    class has one). `spec` is a path (str or os.PathLike), a Source or a loaded Spec; spec text
    is given as `text=`. Cached by spec text, file name and backend; the source is registered
    with linecache so tracebacks show the generated lines."""
    source = spec.source if isinstance(spec, Spec) else source_of(spec, text=text)
    key = (source.text, source.filename, backend)
    if key in _CACHE:
        return _CACHE[key]
    text = compile_source(source, backend)
    name = load_spec(source).mixer.name
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]
    filename = f"<mixc:{name}:{digest}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)
    module = types.ModuleType(f"mixc_compiled_{name}_{digest}")
    module.__file__ = filename
    exec(compile(text, filename, "exec"), module.__dict__)
    sys.modules[module.__name__] = module  # torch.compile looks modules up by name
    _CACHE[key] = module
    return module
