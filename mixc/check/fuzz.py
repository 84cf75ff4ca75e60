"""Property-based equivalence checks: does a compiled module compute the function its spec wrote?

`fuzz(spec)` (and `mixc fuzz SPEC`) draws random examples with hypothesis and, on each, compares
every form of a module (`chunk` at several chunk sizes, `parallel` where it exists, a loop of
`step` calls, and `recurrent`) against a float64 step-by-step interpreter of the spec itself
(`mixc.oracle.interpret`, which shares no code with the code generator). It compares outputs, final
states, and the gradients of every input, parameter and initial state. `fuzz(spec, module)`
checks a module mixc did not write (a hand-edited or third-party file with the compiled-module
contract, loaded by `load_module(path)`).

What is drawn, and in which ranges, is decided in `mixc.check.sampling` (`examples`) and
`mixc.check.ranges` (`input_ranges`): every example is one the spec is meant to handle.

How one example is run and measured is in `mixc.check.forms`, the tolerance each quantity must
meet in `mixc.check.tolerance`, and the module under test's contract in `mixc.check.contract`;
this module is the search over examples. An example on which the recurrence itself diverges is
drawn again, never reported as a failure.

On a failure hypothesis shrinks the example (for at most `shrink_seconds`); `Report.failure`
gives the form, quantity, error and example, and `mixc.check.reproducer.reproducer(...)` a short
runnable script. Torch runs on one thread while checking (tiny tensors; a thread pool on a busy
machine is orders of magnitude slower).
"""

from __future__ import annotations

import os
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from mixc.check.contract import check_contract, load_module, module_under_test
from mixc.check.forms import Failure, Invalid, check
from mixc.check.ranges import InputRanges, input_ranges
from mixc.check.sampling import Example, examples
from mixc.check.tolerance import FACTOR, NEAR_ZERO, TOLERANCE, Result, compare, reference, rel_error
from mixc.errors import MixcError
from mixc.frontend.spec import Spec, load_spec

#: Everything a fuzzing run uses is exported here too, where scripts (and the reproducers
#: `mixc fuzz` writes) import it from.
__all__ = [
    "DTYPES",
    "FACTOR",
    "NEAR_ZERO",
    "TOLERANCE",
    "Failure",
    "Invalid",
    "Report",
    "Result",
    "check",
    "compare",
    "fuzz",
    "load_module",
    "reference",
    "rel_error",
]

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class Report:
    """The outcome of `fuzz`: examples run, worst error per form, and the failure if any."""

    name: str
    examples: int
    dtype: torch.dtype
    worst: dict[str, tuple[float, float]] = field(default_factory=dict)
    failure: Failure | None = None
    shrink_steps: int = 0
    discarded: int = 0
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.failure is None

    def summary(self) -> str:
        """One line: examples run and the worst (forward / gradient) error of each form."""
        dtype = str(self.dtype).removeprefix("torch.")
        forms = ", ".join(f"{f} {a:.1e}/{b:.1e}" for f, (a, b) in self.worst.items())
        return (
            f"{self.name}: {self.examples} examples passed ({dtype}); worst relative error vs the "
            f"float64 oracle (outputs and states / gradients): {forms}"
        )


class _Mismatch(Exception):  # noqa: N818 - internal signal to hypothesis, carries the Failure
    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.summary())
        self.failure = failure


@dataclass
class _Search:
    """One fuzzing run as hypothesis sees it: `test` checks each drawn example, records it in
    the report, and once a failure is found keeps the latest (smallest) one while shrinking,
    within `shrink_seconds`."""

    ranges: InputRanges
    module: types.ModuleType
    report: Report
    dtype: torch.dtype
    device: torch.device
    total: int
    shrink_seconds: float
    progress: Callable[[int, int, str], None] | None
    failure: Failure | None = None
    since: float = 0.0

    def test(self, ex: Example) -> None:
        from hypothesis import reject

        best = self.failure
        if best is not None:
            self.report.shrink_steps += 1
            timed_out = time.monotonic() - self.since > self.shrink_seconds
            if timed_out and ex != best.example:  # shrinking budget spent: keep the best so far
                reject()
        try:
            worst, failure = check(
                self.ranges, self.module, ex, dtype=self.dtype, device=self.device
            )
        except Invalid:
            self.report.discarded += 1
            reject()
        if failure is None and best is None:
            self._passed(worst)
        if self.progress is not None:
            phase = "shrinking" if best is not None or failure is not None else "generating"
            self.progress(self.report.examples, self.total, phase)
        if failure is not None:
            if best is None:
                self.since = time.monotonic()
            self.failure = failure
            raise _Mismatch(failure)

    def _passed(self, worst: dict[str, tuple[float, float]]) -> None:
        self.report.examples += 1
        for form, (a, b) in worst.items():
            old = self.report.worst.get(form, (0.0, 0.0))
            self.report.worst[form] = (max(old[0], a), max(old[1], b))


def fuzz(
    spec: Spec | str | os.PathLike,
    module: types.ModuleType | str | os.PathLike | None = None,
    *,
    examples: int = 25,
    seed: int = 0,
    dtype: str | torch.dtype = "float32",
    device: str = "cpu",
    backend: str = "pytorch",
    max_T: int = 100,
    max_size: int = 12,
    shrink: bool = True,
    shrink_seconds: float = 60.0,
    progress: Callable[[int, int, str], None] | None = None,
) -> Report:
    """Fuzz `module` (default: the spec compiled in-process by `backend`; a path loads a module
    file) against the float64 oracle of `spec` on `examples` drawn examples, deterministically
    for a `seed`. `progress(done, total, phase)` is called after every example."""
    spec = spec if isinstance(spec, Spec) else load_spec(spec)
    dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    if dtype not in (torch.float64, torch.float32, torch.bfloat16):
        raise MixcError(f"dtype {dtype}: expected float64, float32 or bfloat16")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise MixcError("--device cuda: CUDA is not available on this machine")
    if examples < 1:
        raise MixcError(f"examples: expected at least 1, got {examples}")
    module, where = module_under_test(spec, module, backend)
    r = input_ranges(spec)
    check_contract(r, module, where)
    report = Report(spec.mixer.name, 0, dtype, notes=r.notes)
    search = _Search(r, module, report, dtype, device, examples, shrink_seconds, progress)
    _run_search(search, seed=seed, shrink=shrink, max_T=max_T, max_size=max_size)
    return report


def _run_search(search: _Search, *, seed: int, shrink: bool, max_T: int, max_size: int) -> None:
    """Let hypothesis draw (and shrink) examples for `search`; its report gets the failure."""
    from hypothesis import HealthCheck, Phase, Verbosity, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis.errors import Flaky, Unsatisfiable

    r, report = search.ranges, search.report

    @settings(
        max_examples=search.total,
        deadline=None,
        database=None,
        derandomize=False,
        phases=[Phase.generate, Phase.shrink] if shrink else [Phase.generate],
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
        verbosity=Verbosity.quiet,
        print_blob=False,
    )
    @hypothesis_seed(seed)
    @given(examples(r, max_T=max_T, max_size=max_size, chunked=r.plan.chunkable))
    def run(ex: Example) -> None:
        search.test(ex)

    try:
        run()
    except _Mismatch as exc:
        report.failure = exc.failure
    except Flaky:  # the module is not deterministic: report the smallest failure seen
        if search.failure is None:
            raise
        report.failure = search.failure
        report.notes += (
            "the failure did not reproduce on replay: the module is not deterministic",
        )
    except Unsatisfiable:
        raise MixcError(
            f"{r.mixer.name}: the oracle overflowed on every drawn example; the derived input "
            "ranges do not keep this spec finite:\n" + r.describe()
        ) from None
