"""Each kernel call's inputs released once nothing reads them (mixc.backends.pytorch.release):
where the `del`s go, what stays, and that the function computes what it did."""

from __future__ import annotations

import mixc
from mixc.backends.pytorch.release import release_kernel_inputs
from tests.backends.test_in_place_output import ROOT

SOURCE = """\
def form(x, n):
    _size = n
    _angle = x + 1  # a comment that reads _later
    _turn = _angle * 2
    del_me = x
    _v = _turn - x
    _k, _unused = x * 3, x * 4
    _kept = x * 5
    if n > 100:
        _kept = x
    _read_in_block = x * 6
    _o = _kernel(_k, _v, _read_in_block, scale=_size)
    _late = _o + _kept
    if n > 0:
        _late = _late + _read_in_block
    return _late + _size
"""


def _released(source: str) -> list[str]:
    lines = source.splitlines()
    release_kernel_inputs(lines, 0, 1, ["kernel"])
    return lines


def test_dels_before_and_after_the_call():
    lines = _released(SOURCE)
    call = next(i for i, line in enumerate(lines) if "_kernel(" in line)
    # before: what was last read by an earlier statement (_angle, _turn, and _unused bound
    # with _k); after: what the call read last (_k, _v; not _read_in_block, read in a block
    # later, nor _size, read by the return)
    assert lines[call - 1] == "    del _angle, _turn, _unused"
    assert lines[call + 1] == "    del _k, _v"
    assert sum(line.lstrip().startswith("del ") for line in lines) == 2


def test_the_released_function_computes_the_same():
    def run(source: str, n: int):
        scope = {"_kernel": lambda k, v, r, scale: k + v + r + scale}
        exec(source, scope)
        return scope["form"](2.0, n)

    released = "\n".join(_released(SOURCE)) + "\n"
    assert "del" in released
    for n in (0, 1, 200):
        assert run(released, n) == run(SOURCE, n)


def test_mamba3_releases_its_kernel_inputs():
    """The angle sums and the turn before the kernel call; its value, key and query after."""
    source = mixc.compile_source(ROOT / "specs/mamba3.mix")
    chunk = source[source.index("\ndef chunk(") : source.index("\ndef parallel(")]
    before, after = chunk.split("_o, _S, _qk_H = _chunk_scalar_decay(")
    assert "_read2_Th" in before.splitlines()[-2] and "_scaled_dt" in before.splitlines()[-2]
    assert "_v_H" in after.split(")\n")[1].splitlines()[0]
