"""Reading the files a user names (a spec, a module to fuzz): regular files only, never a
blocking open. A named pipe opened for reading waits for a writer, a device may never end and
a directory cannot be read, so each is refused with a one-line MixcError saying what it is."""

from __future__ import annotations

import os
import stat

from mixc.errors import MixcError

__all__ = ["kind", "read_regular", "require_regular"]


def kind(mode: int) -> str:
    """What a file that is not a regular file is, for a message ("a named pipe (FIFO)")."""
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a named pipe (FIFO)"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((what for test, what in kinds if test(mode)), "not a regular file")


def require_regular(path: str | os.PathLike, what: str) -> None:
    """Refuse anything at `path` but a regular file (a link to one is followed), `what` naming
    the file the caller expected ("module file"). OSError (none there) and ValueError (a NUL
    in the path) are the caller's to word."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        _refuse(path, mode, what)


def read_regular(path: str | os.PathLike, limit: int, what: str) -> bytes:
    """At most `limit` bytes of the regular file at `path` (a link to one is followed). Anything
    else, `what` naming the file the caller expected ("spec file"), is refused before a byte
    is read: its kind is checked before it is opened, and again on the open descriptor, which
    is opened without blocking (a pipe replaced for the file in between cannot hang)."""
    require_regular(path, what)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            _refuse(path, mode, what)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        return f.read(limit)


def _refuse(path: str | os.PathLike, mode: int, what: str) -> None:
    raise MixcError(f"{os.fsdecode(path)}: is {kind(mode)}, not a {what}")
