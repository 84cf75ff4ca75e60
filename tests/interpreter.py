"""Triton's interpreter without four of its costs that change nothing it computes
(tests/conftest.py calls `speed_up_the_interpreter`).

The interpreter runs a kernel in Python on numpy, triton.language's builtins patched for the
launch. Four of its habits took most of the Triton tests' time (triton 3.9):

- it patches triton.language again at every call of a @triton.jit helper (`_patch_lang` from
  `InterpretedFunction.__call__`), walking the members of triton.language, its tensor and math
  modules with `inspect.getmembers`: about 1 ms a call, and a chunk's arithmetic is helpers
  calling helpers. Once a launch has patched the modules a helper's globals hold, patching them
  again sets the same functions (a patched builtin is no longer a builtin, so it is not wrapped
  twice): `_patch_once` skips that repeat. A helper whose globals hold a module not patched yet
  in the launch (triton's own helpers read triton.language.core) is patched as before.
- a scan whose combine function is not a plain sum or product (`tl.associative_scan`, as the
  kernels' exclusive sums) calls the combine function once per entry of the tensor, on scalars
  (`ScanOps.generic_scan`). `_sliced_scan` calls it once per position along the scan's axis, on
  the slice of every other axis at that position: the same left fold, in the same order, of
  each line along the axis, by the same elementwise numpy operations.
- every integer add, subtract and multiply narrower than 64 bits (a kernel's offsets and
  indices) is followed by an overflow check (`binary_op_sanitize_overflow_impl`): the operands
  cast to int64, the operation again, two comparisons with the type's bounds, an `and`, each a
  numpy call wrapped in tensors, and then `device_assert`, which asserts only when the options
  say `debug`. The interpreter's options never do (InterpreterOptions(), debug False), so the
  condition is computed and dropped: nothing is checked. `_unchecked_overflow` skips the
  computation while `debug` is off and runs triton's check when it is on.
- the numpy dtype of a triton type (`_get_np_dtype`, at every load, store, cast and scan
  slice) builds a table of twenty-odd numpy dtypes at each call to look one up: `_np_dtypes`
  keeps each type's answer by the type's class and name (what its lookup and equality read).

Every kernel computes the same numbers, bit for bit, running the same combine functions and
helpers. Where triton's interpreter is not built this way (another version), nothing changes.
"""

from __future__ import annotations

import functools
import threading


def speed_up_the_interpreter() -> bool:
    """Patches triton's interpreter as the module's docstring says; whether it could (False:
    triton absent, its interpreter not as expected, or patched already)."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    executor = getattr(interpreter, "GridExecutor", None)
    patch = getattr(interpreter, "_patch_lang", None)
    scans = getattr(interpreter, "ScanOps", None)
    semantic = getattr(interpreter, "interpreter_semantic", None)
    if None in (executor, patch, scans, semantic) or not hasattr(scans, "generic_scan"):
        return False
    overflow = getattr(semantic, "binary_op_sanitize_overflow_impl", None)
    if overflow is None or not hasattr(semantic.builder.options, "debug"):
        return False
    np_dtype = getattr(interpreter, "_get_np_dtype", None)
    if np_dtype is None:
        return False
    if getattr(patch, "once_a_launch", False):
        return False
    executor.__call__, interpreter._patch_lang = _patch_once(executor.__call__, patch, tl)
    _sliced_scan.entry_by_entry = scans.generic_scan  # triton's, for tests/test_interpreter.py
    scans.generic_scan = _sliced_scan
    semantic.binary_op_sanitize_overflow_impl = _unchecked_overflow(overflow, semantic.builder)
    interpreter._get_np_dtype = _np_dtypes(np_dtype)
    return True


def _np_dtypes(np_dtype):
    """triton's `_get_np_dtype`, each type's answer kept by its class and name: the answer
    depends on whether it is a pointer, a block (of what element) or a scalar type, each of
    which its name spells (a type without a name is looked up each time)."""
    found = {}

    @functools.wraps(np_dtype)
    def np_dtype_of(tt_dtype):
        name = getattr(tt_dtype, "name", None)
        if not isinstance(name, str):
            return np_dtype(tt_dtype)
        key = (type(tt_dtype), name)
        if key not in found:
            found[key] = np_dtype(tt_dtype)
        return found[key]

    return np_dtype_of


def _unchecked_overflow(check, builder):
    """The interpreter's overflow check, skipped while its options say no `debug` (whose
    device_assert then drops the condition the check computed)."""

    @functools.wraps(check)
    def overflow_check(lhs, rhs, binary_op):
        if builder.options.debug:
            return check(lhs, rhs, binary_op)
        return None

    return overflow_check


def _patch_once(launch_call, patch, tl):
    """(A launch, and triton.language's patching): each module patched once a launch."""
    launch = threading.local()  # patched: ids of the modules patched in this launch

    @functools.wraps(launch_call)
    def run_launch(self, *args, **kwargs):
        launch.patched = None  # the launch's own call patches, and its scope is restored
        try:
            return launch_call(self, *args, **kwargs)
        finally:
            launch.patched = None

    @functools.wraps(patch)
    def patch_once(fn):
        modules = frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is tl.core)
        patched = getattr(launch, "patched", None)
        if patched is not None and modules <= patched:
            return None  # a helper's call, whose scope is never read: the same patches again
        launch.patched = modules | (patched or frozenset())
        return patch(fn)

    patch_once.once_a_launch = True
    return run_launch, patch_once


def _sliced_scan(self, input):
    """ScanOps.generic_scan, the combine function called on the slices across the axis: for
    each position along it, combine(the result at the one before, the inputs at it)."""
    import numpy as np
    import triton.language as tl

    lines = [np.moveaxis(x.handle.data, self.axis, 0) for x in input]
    tensors = [_slice_tensors(self, line, x.dtype) for line, x in zip(lines, input)]
    results = [np.empty_like(x) for x in lines]
    for result, line in zip(results, lines):
        result[0] = line[0]
    for i in range(1, lines[0].shape[0]):
        before = [tensor(r[i - 1]) for r, tensor in zip(results, tensors)]
        here = [tensor(line[i]) for line, tensor in zip(lines, tensors)]
        out = self.combine_fn.fn(*before, *here)
        for result, value in zip(results, out if isinstance(out, tuple) else (out,)):
            value = np.asarray(value.handle.data if isinstance(value, tl.core.tensor) else value)
            result[i] = value.reshape(()) if result.ndim == 1 else value  # a scalar: shape [1]
    return [self.to_tensor(np.moveaxis(r, 0, self.axis), x.dtype) for r, x in zip(results, input)]


def _slice_tensors(scan, line, dtype):
    """scan.to_tensor(·, dtype) for the slices of `line` along its first axis: the tensor
    to_tensor makes of a slice, the slices' type and numpy dtype found once (to_tensor builds
    them anew for each, most of a scan's time), the data copied in that dtype as it does."""
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    first = scan.to_tensor(line[0], dtype)
    kind, np_dtype = first.type, first.handle.data.dtype

    def tensor(part):
        data = np.array([part]) if line.ndim == 1 else part  # a scalar: shape [1]
        return tl.core.tensor(TensorHandle(data.astype(np_dtype), dtype.scalar), kind)

    return tensor
