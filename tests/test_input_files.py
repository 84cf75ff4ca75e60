"""What mixc reads: a spec path (check, compile, explain, fuzz, mixc.load, MixerLayer) and a
module to fuzz must be regular files. A named pipe (which would block until a writer came), a
device, a directory or a socket is refused at once with one line saying what it is; and a
read-only output file is refused rather than replaced."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import stat
from pathlib import Path

import pytest

import mixc
from mixc.nn import MixerLayer
from tests.test_output_files import _refused, _tree

ROOT = Path(__file__).resolve().parents[1]
DELTANET = ROOT / "specs" / "deltanet.mix"


@contextlib.contextmanager
def _deadline(seconds: int = 5):
    """Fail, rather than hang, where a read blocks (a pipe with no writer)."""

    def expired(signum, frame):
        raise TimeoutError(f"still blocked after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def specials(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """A file of every kind that is not regular, with the words that name its kind."""
    fifo = tmp_path / "pipe.mix"
    os.mkfifo(fifo)
    (tmp_path / "to_pipe.mix").symlink_to(fifo)
    directory = tmp_path / "folder.mix"
    directory.mkdir()
    out = {
        "fifo": (fifo, "a named pipe"),
        "link to a fifo": (tmp_path / "to_pipe.mix", "a named pipe"),
        "device": (Path(os.devnull), "a character device"),
        "directory": (directory, "a directory"),
    }
    sock_path = tmp_path / "sock.mix"
    with contextlib.suppress(OSError):  # AF_UNIX paths are short on some systems
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(sock_path))
        sock.close()
        out["socket"] = (sock_path, "a socket")
    return out


COMMANDS = [
    ["check"],
    ["compile", "-o", "{out}"],
    ["explain"],
    ["fuzz", "--examples", "1"],
    ["graph", "-o", "{out}.svg"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_a_spec_path_that_is_not_a_regular_file_is_one_line(
    command, specials, tmp_path, capsys
) -> None:
    out = tmp_path / "out.py"
    for path, words in specials.values():
        argv = [command[0], str(path), *(a.format(out=out) for a in command[1:])]
        before = _tree(tmp_path)
        with _deadline():
            _refused(capsys, argv, str(path), words, "not a spec file")
        assert _tree(tmp_path) == before


def test_load_and_layers_refuse_a_pipe_at_once(specials) -> None:
    for path, words in specials.values():
        with _deadline(), pytest.raises(mixc.MixcError, match=words):
            mixc.load(path)
        with _deadline(), pytest.raises(mixc.MixcError, match=words):
            MixerLayer(path, hidden_size=8, num_heads=1)


def test_fuzz_module_says_what_the_path_is(specials, capsys) -> None:
    for path, words in specials.values():
        argv = ["fuzz", str(DELTANET), "--module", str(path), "--examples", "1"]
        with _deadline():
            _refused(capsys, argv, str(path), words, "not a module file")


def test_a_read_only_output_file_is_refused_and_kept(tmp_path, capsys) -> None:
    for name in ("kept.py", "kept.svg"):
        (tmp_path / name).write_text("old\n")
        (tmp_path / name).chmod(0o444)
    (tmp_path / "link.py").symlink_to("kept.py")
    before = _tree(tmp_path)
    for argv in (
        ["compile", str(DELTANET), "-o", str(tmp_path / "kept.py")],
        ["compile", str(DELTANET), "-o", str(tmp_path / "link.py")],
        ["graph", str(DELTANET), "-o", str(tmp_path / "kept.svg")],
    ):
        _refused(capsys, argv, argv[-1], "read-only")
    assert _tree(tmp_path) == before
    assert stat.S_IMODE((tmp_path / "kept.py").stat().st_mode) == 0o444
