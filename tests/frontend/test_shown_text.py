"""Spec text a terminal shows: a lone carriage return or a bidirectional control character (in a
description, a comment, anywhere) is refused, located, since `check` reprints the description
and every error shows its line; a spec over the size limit is located at the first character
past it, with its line and a caret."""

from __future__ import annotations

from pathlib import Path

import pytest

import mixc
from mixc.errors import SpecSyntaxError
from mixc.frontend.parser import MAX_SPEC_BYTES
from tests.test_agreement import _run

BODY = "in x\ny_t = x_t\n"
SHOWN = ["\r", "\u202e", "\u202a", "\u2066", "\u2067", "\u2069", "\u200f", "\u061c"]


def _refused(text: str) -> str:
    with pytest.raises(SpecSyntaxError) as info:
        mixc.load_spec(text=text)
    return str(info.value)


@pytest.mark.parametrize("ch", SHOWN, ids=lambda c: f"U+{ord(c):04X}")
def test_a_control_the_terminal_obeys_is_refused_in_a_description(ch: str, tmp_path) -> None:
    text = f'mixer m "left{ch}right"\n' + BODY
    message = _refused(text)
    assert message.startswith("<string>:1:14: error: ")
    assert f"U+{ord(ch):04X}" in message.split("\n")[0]
    assert ch not in message and "^" in message and "hint:" in message
    path = tmp_path / "shown.mix"
    path.write_bytes(text.encode("utf-8"))
    code, out, err = _run("check", str(path))
    assert code == 1 and ch not in out + err and "Traceback" not in err


@pytest.mark.parametrize("ch", ["\r", "\u202e"], ids=["CR", "RLO"])
def test_it_is_refused_in_a_comment_too(ch: str) -> None:
    assert _refused(f"mixer m\nin x  # a{ch}b\ny_t = x_t\n").startswith("<string>:2:10: error: ")


def test_crlf_line_ends_are_still_lines() -> None:
    assert mixc.load_spec(text='mixer m "ok"\r\n' + BODY.replace("\n", "\r\n")).mixer.name == "m"


def test_a_spec_over_the_limit_is_located_with_a_caret(tmp_path: Path) -> None:
    text = "mixer m\n" + BODY + "# " + "a" * MAX_SPEC_BYTES + "\n"
    lines = []
    path = tmp_path / "big.mix"
    path.write_text(text, encoding="utf-8")
    for message in (_refused(text), _run("check", str(path))[2]):
        first, shown, caret = message.split("\n")[:3]
        assert first.endswith(f"error: spec is longer than {MAX_SPEC_BYTES:,} bytes")
        assert ":4:" in first and shown.startswith("  4 | ") and caret.rstrip().endswith("^")
        lines.append(first.split(":")[1:3])
    column = MAX_SPEC_BYTES + 1 - len("mixer m\n" + BODY)
    assert lines == [["4", str(column)]] * 2
