"""Compile a spec to source, write it atomically, or load it in-process."""

from __future__ import annotations

import hashlib
import linecache
import os
import secrets
import stat
import sys
import types
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path

from mixc.analysis.plan import Plan, analyze
from mixc.backends import get as get_backend
from mixc.errors import MixcError, NotYetImplemented, SpecError
from mixc.files import kind as _kind
from mixc.frontend.limits import with_recursion_room
from mixc.frontend.spec import Spec, load_spec, source_of
from mixc.lowering import lower

#: How many modules `load` keeps (least recently used first out). A cached module is
#: registered in sys.modules (torch.compile looks its functions' module up by name) and its
#: source in linecache (tracebacks show the generated lines); one evicted, or cleared by
#: `clear_cache`, is unregistered from both, and a later `load` of its spec compiles it again.
CACHE_SIZE = 128

_CACHE: OrderedDict[tuple[str, str, str], types.ModuleType] = OrderedDict()


@with_recursion_room
def plan(spec=None, backend: str = "pytorch", *, text: str | None = None) -> Plan:
    """A spec (a path, a Source, a loaded Spec, or `text=` spec text) -> its plan, after every
    check `compile` makes: parsing, verification, analysis and the backend's own refusals.
    `mixc check`, `mixc explain` and `mixc compile` all start here, so they accept and refuse
    the same specs."""
    loaded = spec if isinstance(spec, Spec) else load_spec(spec, text=text)
    plan = analyze(loaded)
    reason = get_backend(backend).supports(lower(plan))
    if reason is not None:
        outputs = loaded.mixer.outputs
        where = outputs[-1].span if outputs else None
        raise NotYetImplemented(reason, where).located(loaded.source)
    return plan


def compile_source(spec=None, backend: str = "pytorch", *, text: str | None = None) -> str:
    """A spec (as `plan` takes it) -> the generated module's source."""
    return _emit(plan(spec, backend, text=text), backend)


@with_recursion_room
def _emit(plan: Plan, backend: str) -> str:
    """The source `backend` generates for `plan`; an error it raises is located in the spec."""
    try:
        return get_backend(backend).render(lower(plan))
    except SpecError as exc:
        raise exc.located(plan.spec.source) from None


def output_file(path: str | os.PathLike, keep: Iterable[str | os.PathLike] = ()) -> Path:
    """The regular file that writing `path` replaces, or a one-line MixcError saying why mixc
    will not write there. A symbolic link is followed (the link stays and its target gets the
    new contents); a directory, a device (/dev/full, /dev/stdout's terminal), a pipe or a
    socket is refused, since the rename that makes the write atomic would put a regular file
    in its place; so is any of the files in `keep` (the input spec), under any name, and a
    read-only file."""
    path = Path(path)
    try:
        target = path.resolve(strict=True) if path.is_symlink() else path
        found = target.stat() if os.path.lexists(target) else None
    except FileNotFoundError:
        raise MixcError(f"{path}: a symbolic link to a missing file; give a regular file") from None
    except (OSError, RuntimeError) as exc:  # a loop of links: RuntimeError up to Python 3.12
        raise MixcError(f"{path}: cannot write: {getattr(exc, 'strerror', None) or exc}") from None
    except ValueError:  # a NUL in the path
        raise MixcError(f"{str(path)!r}: not a file name") from None
    if found is not None and stat.S_ISDIR(found.st_mode):
        raise MixcError(f"{path}: is a directory; give a file name such as {path / 'mixer.py'}")
    if found is not None and not stat.S_ISREG(found.st_mode):
        raise MixcError(f"{path}: is {_kind(found.st_mode)}; mixc writes regular files only")
    for spec in keep:
        if found is not None and os.path.lexists(spec) and os.path.samefile(target, spec):
            raise MixcError(f"{path}: is the input spec {spec}; give another output file")
    # the rename would replace a read-only file as if it were writable (root's access() says
    # every file is, so its mode's write bits decide too)
    if found is not None and (not found.st_mode & 0o222 or not os.access(target, os.W_OK)):
        raise MixcError(
            f"{path}: the file is read-only; make it writable (chmod u+w) or give another "
            "output file"
        )
    directory = target.parent
    if not directory.is_dir():
        raise MixcError(f"{path}: directory {directory} does not exist")
    return target


def write_atomically(
    path: str | os.PathLike, data: str | bytes, keep: Iterable[str | os.PathLike] = ()
) -> None:
    """Write `data` (text as UTF-8) to the regular file `output_file(path, keep)` through a
    temporary file beside it and a rename: never a partial file. The file keeps the mode it had;
    a new one gets what the umask leaves of 0o666, as any program's new file does. An OSError
    (a read-only directory, a full disk) is a one-line MixcError naming `path`."""
    target = output_file(path, keep)
    temporary = target.with_name(f".{target.name}.{secrets.token_hex(8)}.tmp")
    try:
        mode = stat.S_IMODE(target.stat().st_mode) if target.exists() else None
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # umask applies
    except OSError as exc:
        raise MixcError(f"{path}: cannot write: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())  # the contents are on disk before the rename makes them visible
        os.replace(temporary, target)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise MixcError(f"{path}: cannot write: {exc.strerror or exc}") from None
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def load(spec=None, backend: str = "pytorch", *, text: str | None = None) -> types.ModuleType:
    """Compile in-process and return the module (chunk, recurrent, step, and parallel where the
    class has one). `spec` is a path (str or os.PathLike), a Source or a loaded Spec; spec text
    is given as `text=`. Cached by spec text, file name and backend; the source is registered
    with linecache so tracebacks show the generated lines. The cache keeps the CACHE_SIZE
    modules used last; `clear_cache` empties it."""
    source = spec.source if isinstance(spec, Spec) else source_of(spec, text=text)
    key = (source.text, source.filename, backend)
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    text = compile_source(source, backend)
    name = load_spec(source).mixer.name
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]
    filename = f"<mixc:{name}:{digest}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)
    module = types.ModuleType(f"mixc_compiled_{name}_{digest}")
    module.__file__ = filename
    try:
        exec(compile(text, filename, "exec"), module.__dict__)
    except ModuleNotFoundError as exc:  # a backend's optional package (triton) is missing
        _forget(module)
        raise MixcError(
            f"the {backend} backend's modules import {exc.name}, which is not installed: "
            f"pip install 'mixc[{backend}]'"
        ) from None
    except BaseException:
        _forget(module)
        raise
    sys.modules[module.__name__] = module  # torch.compile looks modules up by name
    _CACHE[key] = module
    while len(_CACHE) > max(CACHE_SIZE, 1):
        _forget(_CACHE.popitem(last=False)[1])
    return module


def clear_cache() -> None:
    """Forget every module `load` compiled: the cache empties, and each module leaves sys.modules
    and linecache. Modules already returned keep working; a later `load` compiles again."""
    while _CACHE:
        _forget(_CACHE.popitem(last=False)[1])


def _forget(module: types.ModuleType) -> None:
    """Unregister a module `load` made (no longer cached) from sys.modules and linecache, unless
    a cached module still holds the same name (the same generated text)."""
    if any(m.__name__ == module.__name__ for m in _CACHE.values()):
        return
    if sys.modules.get(module.__name__) is module:
        del sys.modules[module.__name__]
    linecache.cache.pop(module.__file__, None)
