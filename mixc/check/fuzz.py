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

Tolerance, as relative RMS error `||a - ref|| / ||ref||` against the oracle: float64 1e-10 for
every quantity; float32 1e-5 for outputs and final states, 1e-4 for gradients, raised to `FACTOR`
= 4 times the oracle's own change when every input is moved by one float32 rounding (the larger
of two random directions) on an ill-conditioned example, such as an output in which a readout and
a skip cancel; bfloat16 4 times the error of the reference loop in that precision, i.e. of the
oracle's own result rounded to bfloat16, for the same quantity (and never below the float32
bound). The oracle sees exactly the rounded inputs and cotangents the module sees, so the error
measures the computation, not the rounding of inputs. In bfloat16, parameters and states are
float32 holding rounded values (master weights, as in mixed-precision training). A reference
whose RMS is below `NEAR_ZERO` (1%) of the largest RMS of its kind (outputs and states, or
gradients) in the example counts as near zero and is measured against that floor. Each form is
also compared with `recurrent`, within twice the bound. An example on which the oracle is not
finite, or (below float64) exceeds the square root of the precision's largest float, is one on
which the recurrence itself diverges: it is drawn again, never reported as a failure.

On a failure hypothesis shrinks the example (for at most `shrink_seconds`); `Report.failure`
gives the form, quantity, error and example, and `mixc.check.reproducer.reproducer(...)` a short
runnable script. Torch runs on one thread while checking (tiny tensors; a thread pool on a busy
machine is orders of magnitude slower).
"""

from __future__ import annotations

import importlib.util
import math
import os
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from mixc.check.ranges import InputRanges, input_ranges
from mixc.check.sampling import Case, Example, examples, make_case
from mixc.errors import MixcError
from mixc.files import require_regular
from mixc.frontend.spec import Spec, load_spec
from mixc.oracle.interpret import interpret

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

#: Bounds on the relative RMS error: (outputs and final states, gradients).
TOLERANCE = {torch.float64: (1e-10, 1e-10), torch.float32: (1e-5, 1e-4)}
#: A form may be this many times worse than the oracle's own error in the precision under test:
#: bf16, its result rounded to bf16; fp32, its change when every input moves by one fp32 rounding
#: (an ill-conditioned example, such as an output that cancels, gets a bound above the fixed one).
FACTOR = 4.0
#: A reference whose RMS is below this fraction of the largest RMS among the example's references
#: of the same kind (outputs and states, or gradients) counts as near zero: its error is measured
#: against that floor (a gradient that cancels to zero still has fp32 rounding of its terms).
NEAR_ZERO = 1e-2
DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


def rel_error(a: Tensor, ref: Tensor, floor: float = 0.0) -> float:
    """Relative RMS error ||a - ref|| / ||ref||, with a reference whose RMS is below `floor`
    measured against an RMS of `floor` instead (a near-zero reference, such as a gradient that
    vanishes analytically, is compared at the scale of its example; see `NEAR_ZERO`)."""
    a, ref = a.detach().double().cpu(), ref.detach().double().cpu()
    if a.shape != ref.shape or not torch.isfinite(a).all():
        return math.inf
    diff = (a - ref).norm().item()
    scale = max(ref.norm().item(), floor * max(ref.numel(), 1) ** 0.5)
    if scale == 0:
        return 0.0 if diff == 0 else math.inf
    return diff / scale


def _rms(x: Tensor) -> float:
    return x.double().norm().item() / max(x.numel(), 1) ** 0.5


# ----------------------------------------------------------------------------- the oracle


@dataclass
class Result:
    """Output, final states and gradients of one form (or of the oracle)."""

    y: Tensor
    finals: dict[str, Tensor]
    grads: dict[str, Tensor | None]


def reference(
    spec: Spec | str | os.PathLike,
    inputs: dict[str, Tensor],
    params: dict[str, Tensor] | None = None,
    initial_state: dict[str, Tensor] | None = None,
    cot_y: Tensor | None = None,
    cot_states: dict[str, Tensor] | None = None,
) -> Result:
    """The float64 oracle: output, final states, and the gradients of
    loss = sum(y * cot_y) + sum over states of sum(final * cot_state)
    with respect to every input, parameter and initial state given (by name)."""
    spec = spec if isinstance(spec, Spec) else load_spec(spec)
    params, initial_state, cot_states = params or {}, initial_state or {}, cot_states or {}
    leaves = {
        n: x.detach().double().cpu().requires_grad_(True)
        for n, x in {**inputs, **params, **initial_state}.items()
    }
    outputs, finals = interpret(
        spec,
        {n: leaves[n] for n in inputs},
        {n: leaves[n] for n in params},
        {n: leaves[n] for n in initial_state} or None,
    )
    y = outputs[spec.mixer.outputs[0].target]
    grads: dict[str, Tensor | None] = {}
    if cot_y is not None:
        loss = (y * cot_y.double().cpu()).sum()
        for n, c in cot_states.items():
            loss = loss + (finals[n] * c.double().cpu()).sum()
        got = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
        grads = {
            n: g if g is not None else torch.zeros_like(leaves[n])
            for n, g in zip(leaves, got, strict=True)
        }
    return Result(y.detach(), {n: f.detach() for n, f in finals.items()}, grads)


# ----------------------------------------------------------------------------- forms


def _forms(r: InputRanges, module: types.ModuleType, ex: Example) -> list[tuple[str, int | None]]:
    forms: list[tuple[str, int | None]] = [("recurrent", None), ("step", None)]
    if r.facts.chunkable and callable(getattr(module, "chunk", None)):
        # a Triton module's blocks are at least 16 tokens (_tl_block): every chunk size up to 16
        # runs as 16, at any length, so those draws are one computation and run once
        block = getattr(module, "_tl_block", None)
        chunks: dict[int, int] = {}
        for cs in ex.chunk_sizes:
            chunks.setdefault(cs if block is None else block(cs), cs)
        forms += [("chunk", cs) for cs in chunks.values()]
    if callable(getattr(module, "parallel", None)) and not ex.initial_state:
        forms.append(("parallel", None))
    return forms


def _label(form: str, chunk_size: int | None) -> str:
    return f"chunk (chunk_size={chunk_size})" if chunk_size else form


def _call(module, form: str, chunk_size: int | None, args: list, kwargs: dict, n_inputs: int, init):
    """Run one form; returns (y, final states as a tuple, or None for parallel)."""
    if form == "recurrent":
        return module.recurrent(*args, **kwargs, initial_state=init, output_final_state=True)
    if form == "chunk":
        return module.chunk(
            *args, **kwargs, initial_state=init, output_final_state=True, chunk_size=chunk_size
        )
    if form == "parallel":
        return module.parallel(*args, **kwargs)
    ys, state = [], init
    for t in range(args[0].shape[1]):
        step_args = [a[:, t] if i < n_inputs else a for i, a in enumerate(args)]
        y, state = module.step(*step_args, **kwargs, state=state)
        ys.append(y)
    return torch.stack(ys, 1), state


def _finals(final, names: tuple[str, ...]) -> dict[str, Tensor] | None:
    if final is None:
        return None
    finals = final if isinstance(final, tuple | list) else (final,)
    if len(finals) != len(names):
        return None
    return dict(zip(names, finals, strict=True))


@dataclass(frozen=True)
class Failure:
    """A disagreement (or a crash) of one form on one example: quantity "call" for a form that
    raised (message: the exception), else the quantity out of bounds (message: what was wrong
    with its shape, or "missing"; empty when only its values were)."""

    form: str
    chunk_size: int | None
    quantity: str  # "output", "final state H", "gradient of g", "call"
    error: float
    bound: float
    vs_recurrent: float | None
    message: str
    example: Example
    dtype: torch.dtype

    @property
    def kind(self) -> str:
        """How the form failed: "crash" (it raised), "shape" (a quantity missing or of the
        wrong shape) or "numerical" (a quantity's values out of bounds, non-finite included)."""
        if self.quantity == "call":
            return "crash"
        return "shape" if self.message else "numerical"

    @property
    def label(self) -> str:
        return _label(self.form, self.chunk_size)

    def summary(self) -> str:
        if self.quantity == "call":
            return f"{self.label} raised {self.message}"
        tail = f"; vs recurrent {self.vs_recurrent:.2e}" if self.vs_recurrent is not None else ""
        return (
            f"{self.label}: {self.quantity} has relative RMS error {self.error:.2e} vs the float64 "
            f"oracle (bound {self.bound:.1e}{tail}){': ' + self.message if self.message else ''}"
        )


class _Mismatch(Exception):  # noqa: N818 - internal signal to hypothesis, carries the Failure
    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.summary())
        self.failure = failure


def _quantities(r: Result) -> dict[str, Tensor]:
    out = {"output": r.y, **{f"final state {n}": x for n, x in r.finals.items()}}
    out.update({f"gradient of {n}": g for n, g in r.grads.items() if g is not None})
    return out


def _limits(
    dtype: torch.dtype, ref: dict[str, Tensor], perturbed: dict[str, Tensor] | None = None
) -> dict[str, tuple[float, float]]:
    """(near-zero floor, bound) of every quantity: the floor is NEAR_ZERO times the largest RMS
    among references of the same kind; the bound is fixed for fp32/fp64, or FACTOR times the
    oracle's change under a one-rounding perturbation of its inputs (`perturbed`) when larger; for
    bf16 it is FACTOR times the error of the oracle's own result rounded to bf16 (at least the
    fp32 bound)."""
    scale = {False: 0.0, True: 0.0}
    for q, r in ref.items():
        kind = q.startswith("gradient")
        scale[kind] = max(scale[kind], _rms(r))
    out = {}
    for q, r in ref.items():
        kind = q.startswith("gradient")
        floor = NEAR_ZERO * scale[kind]
        if dtype in TOLERANCE:
            bound = TOLERANCE[dtype][kind]
            if perturbed is not None and q in perturbed:
                bound = max(bound, FACTOR * rel_error(perturbed[q], r, floor))
        else:
            bound = max(FACTOR * rel_error(r.to(dtype), r, floor), TOLERANCE[torch.float32][kind])
        out[q] = (floor, bound)
    return out


def compare(got: Result, ref: Result, dtype: torch.dtype) -> dict[str, tuple[float, float]]:
    """(relative error, bound) of every quantity of `ref` (output, final states, gradients) in
    `got`, by the fuzzer's rule (see the module doc). A missing quantity has error inf."""
    target = _quantities(ref)
    mine = _quantities(got)
    out = {}
    for q, (floor, bound) in _limits(dtype, target).items():
        a = mine.get(q)
        if a is None and q.startswith("gradient") and q.removeprefix("gradient of ") in got.grads:
            a = torch.zeros_like(target[q])  # autograd's None: no dependence
        out[q] = (math.inf if a is None else rel_error(a, target[q], floor), bound)
    return out


# ----------------------------------------------------------------------------- one example


def check(
    r: InputRanges,
    module: types.ModuleType,
    ex: Example,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> tuple[dict[str, tuple[float, float]], Failure | None]:
    """Run every form of `module` on example `ex` and compare with the oracle.

    Returns (worst (forward, gradient) error per form, the first Failure or None).
    Raises `Invalid` when the oracle itself is not finite on this example. Runs torch on one CPU
    thread (restored afterwards): the tensors are tiny, and a thread pool on a busy machine
    makes each call orders of magnitude slower.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _check(r, module, ex, dtype, device)
    finally:
        torch.set_num_threads(threads)


@dataclass
class _Rounded:
    """One case rounded to the precision under test, held in float64: what the module and the
    oracle both see."""

    inputs: dict[str, Tensor]
    params: dict[str, Tensor]  # explicit defaults included
    states: dict[str, Tensor]
    cot_y: Tensor
    cot_states: dict[str, Tensor]


def _state_dtype(dtype: torch.dtype) -> torch.dtype:
    """Parameters and states: float64 in a float64 check, float32 holding rounded values
    otherwise (master weights, as in mixed-precision training)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _rounded(case: Case, dtype: torch.dtype) -> _Rounded:
    def low(x: Tensor, dt: torch.dtype) -> Tensor:
        return x.to(dt).double()

    # low precision: parameters hold rounded values in fp32 (master weights, as in mixed-precision
    # training; a bf16 parameter used by T step calls would accumulate its gradient in bf16)
    return _Rounded(
        {n: low(x, dtype) for n, x in case.inputs.items()},
        {n: low(x, dtype) for n, x in {**case.params, **case.defaults}.items()},
        {n: low(x, _state_dtype(dtype)) for n, x in case.states.items()},
        low(case.cot_y, dtype),
        {n: low(x, dtype) for n, x in case.cot_states.items()},
    )


def _targets(
    r: InputRanges, x: _Rounded, seed: int, dtype: torch.dtype, from_states: bool
) -> tuple[dict[str, Tensor], dict[str, tuple[float, float]]]:
    """The oracle's quantities and their (floor, bound)s, from the case's initial states (or,
    without `from_states`, from zero states with a loss on the output only)."""
    states, cot_s = (x.states, x.cot_states) if from_states else ({}, {})
    args = (x.inputs, x.params, states, x.cot_y, cot_s)
    ref = _quantities(reference(r.spec, *args))
    if not all(torch.isfinite(v).all() for v in ref.values()):
        raise Invalid("the oracle is not finite on this example")
    if dtype != torch.float64:
        # a recurrence that diverges on this example: beyond the square root of the largest
        # float of the precision under test its products overflow, and an inf there is the
        # example's, not the module's
        largest = max(float(v.abs().max()) if v.numel() else 0.0 for v in ref.values())
        if largest > torch.finfo(dtype).max ** 0.5:
            raise Invalid(f"the oracle reaches {largest:.3g}, where {dtype} products overflow")
    if dtype != torch.float32:
        return ref, _limits(dtype, ref)
    return ref, _conditioned_limits(r, args, ref, seed, dtype)


def _conditioned_limits(
    r: InputRanges, args: tuple, ref: dict[str, Tensor], seed: int, dtype: torch.dtype
) -> dict[str, tuple[float, float]]:
    """fp32 limits raised to how well-conditioned the example is: the oracle also runs with every
    input moved by one rounding, in two random directions (one can miss a cancellation)."""
    inputs, params, states, cot_y, cot_s = args
    gen = torch.Generator().manual_seed(seed + 1)
    eps = torch.finfo(dtype).eps / 2

    def nudge(xs: dict[str, Tensor]) -> dict[str, Tensor]:
        return {n: x * (1 + eps * torch.randn(x.shape, generator=gen)) for n, x in xs.items()}

    bounds = []
    for _ in range(2):
        moved = [nudge(xs) for xs in (inputs, params, states, {"y": cot_y}, cot_s)]
        perturbed = _quantities(reference(r.spec, *moved[:3], moved[3]["y"], moved[4]))
        bounds.append(_limits(dtype, ref, perturbed))
    return {q: max(b[q] for b in bounds) for q in ref}


def _parallel_targets(
    r: InputRanges, x: _Rounded, seed: int, dtype: torch.dtype
) -> tuple[dict[str, Tensor], dict[str, tuple[float, float]]]:
    """What the parallel form is compared with: the oracle from a zero state, loss on the
    output only, without final states (the quadratic form keeps none)."""
    zero, zero_limits = _targets(r, x, seed, dtype, from_states=False)
    ref = {q: v for q, v in zero.items() if not q.startswith("final state")}
    return ref, {q: zero_limits[q] for q in ref}


def _leaves(x: _Rounded, dtype: torch.dtype, device) -> dict[str, Tensor]:
    """The tensors a form is called with, requiring gradients: inputs in `dtype`, parameters
    and states in the state dtype."""
    state_dtype = _state_dtype(dtype)
    leaves = {n: v.to(dtype).to(device).requires_grad_(True) for n, v in x.inputs.items()}
    leaves.update(
        {n: v.to(state_dtype).to(device).requires_grad_(True) for n, v in x.params.items()}
    )
    leaves.update(
        {n: v.to(state_dtype).to(device).requires_grad_(True) for n, v in x.states.items()}
    )
    return leaves


def _run_form(
    r: InputRanges,
    module: types.ModuleType,
    form: str,
    chunk_size: int | None,
    leaves: dict[str, Tensor],
    x: _Rounded,
) -> dict[str, Tensor]:
    """One form's output, final states and gradients (of the case's loss) as quantities; raises
    whatever a broken module raises."""
    args = [leaves[n] for n in (*r.inputs, *r.params)]
    kwargs = {n: leaves[n] for n in r.defaults if n in leaves}
    init = tuple(leaves[n] for n in r.states) if x.states else None
    if init is not None and len(init) == 1:
        init = init[0]
    y, final = _call(module, form, chunk_size, args, kwargs, len(r.inputs), init)
    finals = _finals(final, r.states) if form != "parallel" else {}
    if finals is None:
        raise MixcError(
            f"returned {type(final).__name__} as the final state, "
            f"expected {len(r.states)} tensor(s)"
        )
    loss = (y.double().cpu() * x.cot_y).sum()
    for n, s in finals.items():
        loss = loss + (s.double().cpu() * x.cot_states[n]).sum()
    got = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    grads = {
        n: (g if g is not None else torch.zeros_like(leaves[n]))
        for n, g in zip(leaves, got, strict=True)
    }
    return _quantities(Result(y.detach(), {n: s.detach() for n, s in finals.items()}, grads))


def _measure(
    form: str,
    chunk_size: int | None,
    result: dict[str, Tensor],
    target: tuple[dict[str, Tensor], dict[str, tuple[float, float]]],
    recurrent: dict[str, Tensor] | None,
    ex: Example,
    dtype: torch.dtype,
) -> tuple[float, float] | Failure:
    """The worst (forward, gradient) error of one form's quantities against the oracle's, or
    the Failure of the first one out of bounds (or off recurrent by more than twice it)."""
    ref, limits = target
    fwd = grad = 0.0
    for q, want in ref.items():
        floor, bound = limits[q]
        a = result.get(q)
        if a is None:
            return Failure(form, chunk_size, q, math.inf, bound, None, "missing", ex, dtype)
        err = rel_error(a, want, floor)
        vs_rec = None
        if recurrent is not None and (q == "output" or form != "parallel"):
            vs_rec = rel_error(a, recurrent[q], floor)
        shape = (
            "" if a.shape == want.shape else f"shape {list(a.shape)}, expected {list(want.shape)}"
        )
        if err > bound or (vs_rec is not None and vs_rec > 2 * bound):
            return Failure(form, chunk_size, q, err, bound, vs_rec, shape, ex, dtype)
        if q.startswith("gradient"):
            grad = max(grad, err)
        else:
            fwd = max(fwd, err)
    return fwd, grad


def _check(r: InputRanges, module: types.ModuleType, ex: Example, dtype: torch.dtype, device):
    x = _rounded(make_case(r, ex), dtype)
    targets = {"from states": _targets(r, x, ex.seed, dtype, from_states=True)}
    worst: dict[str, tuple[float, float]] = {}
    recurrent: dict[str, Tensor] | None = None
    for form, cs in _forms(r, module, ex):
        leaves = _leaves(x, dtype, device)
        try:
            result = _run_form(r, module, form, cs, leaves, x)
        except Exception as exc:  # a broken module may raise anything: that is a failure too
            msg = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            return worst, Failure(form, cs, "call", math.inf, 0.0, None, msg, ex, dtype)
        if form == "parallel" and form not in targets:
            targets[form] = _parallel_targets(r, x, ex.seed, dtype)
        target = targets["parallel" if form == "parallel" else "from states"]
        measured = _measure(form, cs, result, target, recurrent, ex, dtype)
        if isinstance(measured, Failure):
            return worst, measured
        old = worst.get(form, (0.0, 0.0))
        worst[form] = (max(old[0], measured[0]), max(old[1], measured[1]))
        if form == "recurrent":
            recurrent = result
    return worst, None


class Invalid(Exception):  # noqa: N818 - the example is outside what the spec can handle
    """The oracle itself overflowed on an example: the example is discarded."""


# ----------------------------------------------------------------------------- modules


def load_module(path: str | os.PathLike) -> types.ModuleType:
    """Import a module file by path (a compiled module, or any file with the same contract)."""
    path = Path(path)
    try:  # a directory, a device, a pipe (which would block the import) is refused
        require_regular(path, "module file")
    except FileNotFoundError:
        raise MixcError(f"{path}: no such module file") from None
    except OSError as exc:
        raise MixcError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except ValueError:  # a NUL in the path
        raise MixcError(f"{str(path)!r}: not a module file name") from None
    name = f"mixc_fuzz_target_{abs(hash(str(path.resolve()))) & 0xFFFFFFFF:08x}"
    loader_spec = importlib.util.spec_from_file_location(name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise MixcError(f"{path}: not a Python module")
    module = importlib.util.module_from_spec(loader_spec)
    try:
        loader_spec.loader.exec_module(module)
    except Exception as exc:  # any error importing user code
        where = f" (line {exc.lineno})" if isinstance(exc, SyntaxError) else ""
        raise MixcError(f"{path}: cannot import{where}: {type(exc).__name__}: {exc}") from None
    return module


def _check_contract(r: InputRanges, module: types.ModuleType, where: str) -> None:
    """The module must declare the spec's inputs, parameters and states, and define the forms."""
    missing = [n for n in ("INPUTS", "STATES", "recurrent", "step") if not hasattr(module, n)]
    if missing:
        raise MixcError(f"{where}: not a mixc module: it defines no {', '.join(missing)}")

    def names(attr: str) -> tuple[str, ...]:
        try:
            return tuple(entry[0] for entry in getattr(module, attr, ()))
        except (TypeError, IndexError):
            raise MixcError(f"{where}: {attr} should be ((name, shape), ...)") from None

    for attr, want, what in (
        ("INPUTS", r.inputs, "inputs"),
        ("PARAMS", r.params, "parameters without a default"),
        ("PARAM_DEFAULTS", r.defaults, "parameters with a default"),
        ("STATES", r.states, "states"),
    ):
        got = names(attr)
        if got != want:
            raise MixcError(
                f"{where} does not match the spec: its {attr} are ({', '.join(got)}) "
                f"but the spec's {what} are ({', '.join(want)})"
            )


def _module_under_test(
    spec: Spec, module: types.ModuleType | str | os.PathLike | None, backend: str
) -> tuple[types.ModuleType, str]:
    """(the module, how to name it): the spec compiled in-process by `backend`, a module, or a
    module file."""
    if module is None:
        from mixc.driver import load

        return load(spec.source, backend), "the compiled module"
    if isinstance(module, types.ModuleType):
        return module, getattr(module, "__file__", None) or module.__name__
    return load_module(module), str(module)


# ----------------------------------------------------------------------------- fuzz


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
    module, where = _module_under_test(spec, module, backend)
    r = input_ranges(spec)
    _check_contract(r, module, where)
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
    @given(examples(r, max_T=max_T, max_size=max_size, chunked=r.facts.chunkable))
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
