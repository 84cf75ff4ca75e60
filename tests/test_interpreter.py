"""tests/interpreter.py: the interpreter's scans, combined slice by slice, give the bits that
triton's entry-by-entry scan gives (the interpreter's other change, each module patched once a
launch, runs every Triton test: they compare the kernels with float64 references)."""

from __future__ import annotations

import os

import pytest
import torch

triton = pytest.importorskip("triton", reason="the interpreter's scans need triton")
if os.environ.get("TRITON_INTERPRET") != "1":  # pragma: no cover - set by tests/conftest.py
    pytest.skip("the scans run in triton's interpreter", allow_module_level=True)

import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

from tests.interpreter import _sliced_scan  # noqa: E402

pytestmark = pytest.mark.triton


@triton.jit
def _uneven(a_sum, a_last, b_sum, b_last):
    """Neither commutative nor associative in floating point: an order changed shows."""
    return a_sum * 0.75 + b_sum, a_last - b_sum * 0.5


@triton.jit
def _scan(x, sums, lasts, N: tl.constexpr, M: tl.constexpr, AXIS: tl.constexpr, REVERSE: tl.constexpr):  # fmt: skip
    at = tl.arange(0, N)[:, None] * M + tl.arange(0, M)[None, :]
    values = tl.load(x + at)
    scanned = tl.associative_scan((values, values * 3.0), AXIS, _uneven, reverse=REVERSE)
    tl.store(sums + at, scanned[0])
    tl.store(lasts + at, scanned[1])


@triton.jit
def _scan_row(x, sums, lasts, N: tl.constexpr):
    at = tl.arange(0, N)
    values = tl.load(x + at)
    scanned = tl.associative_scan((values, -values), 0, _uneven)
    tl.store(sums + at, scanned[0])
    tl.store(lasts + at, scanned[1])


def _run(kernel, x, *constants):
    sums, lasts = torch.empty_like(x), torch.empty_like(x)
    kernel[(1,)](x, sums, lasts, *constants)
    return sums, lasts


@pytest.mark.parametrize(("axis", "reverse"), [(0, False), (1, False), (0, True), (1, True)])
def test_a_sliced_scan_gives_the_bits_of_triton_s_scan(monkeypatch, axis, reverse):
    if interpreter.ScanOps.generic_scan is not _sliced_scan:
        pytest.skip("this triton's interpreter is not patched (tests/interpreter.py)")
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))
    sliced = _run(_scan, x, 16, 8, axis, reverse)
    row = _run(_scan_row, x[0].clone(), 8)
    monkeypatch.setattr(interpreter.ScanOps, "generic_scan", _sliced_scan.entry_by_entry)
    for got, want in zip(
        sliced + row, _run(_scan, x, 16, 8, axis, reverse) + _run(_scan_row, x[0].clone(), 8)
    ):
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))


@triton.jit
def _square_offsets(x, out, N: tl.constexpr):
    at = tl.arange(0, N)
    tl.store(out + at, tl.load(x + at) * tl.load(x + at))  # int32: overflows for |x| > 46340


def _overflow_check_runs(monkeypatch, *, debug, patched=True):
    """Whether _square_offsets on int32 entries whose square overflows raises triton's overflow
    assertion, with the options' debug as given, the check patched or triton's own."""
    import dataclasses

    builder = interpreter.interpreter_builder
    monkeypatch.setattr(builder, "options", dataclasses.replace(builder.options, debug=debug))
    semantic = interpreter.interpreter_semantic
    if not patched:
        check = semantic.binary_op_sanitize_overflow_impl.__wrapped__
        monkeypatch.setattr(semantic, "binary_op_sanitize_overflow_impl", check)
    x = torch.tensor([3, 50_000, -70_000, 7], dtype=torch.int32)
    out = torch.empty_like(x)
    try:
        _square_offsets[(1,)](x, out, 4)
    except triton.runtime.errors.InterpreterError as error:
        assert "int32 overflow detected" in str(error)
        return True
    assert out[0] == 9 and out[3] == 49  # the kernel ran
    return False


def test_the_overflow_check_is_skipped_only_where_triton_checks_nothing(monkeypatch):
    semantic = interpreter.interpreter_semantic
    if not hasattr(semantic.binary_op_sanitize_overflow_impl, "__wrapped__"):
        pytest.skip("this triton's interpreter is not patched (tests/interpreter.py)")
    with monkeypatch.context() as patch:
        assert not _overflow_check_runs(patch, debug=False, patched=False)  # triton's: dropped
    with monkeypatch.context() as patch:
        assert not _overflow_check_runs(patch, debug=False)
    with monkeypatch.context() as patch:
        assert _overflow_check_runs(patch, debug=True, patched=False)
    with monkeypatch.context() as patch:
        assert _overflow_check_runs(patch, debug=True)  # debug on: triton's check runs


def test_the_kept_numpy_dtypes_are_triton_s():
    np_dtype = interpreter._get_np_dtype
    if not hasattr(np_dtype, "__wrapped__"):
        pytest.skip("this triton's interpreter is not patched (tests/interpreter.py)")
    scalars = [tl.int1, tl.int8, tl.int32, tl.uint32, tl.int64, tl.float16, tl.bfloat16]
    scalars += [tl.float32, tl.float64, tl.float8e5]
    types = scalars + [tl.pointer_type(t) for t in scalars]
    types += [tl.block_type(t, [4, 2]) for t in types] + [tl.block_type(tl.float32, [8])]
    for tt_dtype in types + types:  # the second time, kept
        assert np_dtype(tt_dtype) == np_dtype.__wrapped__(tt_dtype), tt_dtype
