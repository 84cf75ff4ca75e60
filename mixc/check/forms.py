"""One example: every form of a module (`chunk` at each drawn chunk size, `parallel` where it
exists, a loop of `step` calls, and `recurrent`) run on it and measured against the float64
oracle by the rule of `mixc.check.tolerance`: outputs, final states and the gradients of every
input, parameter and initial state. An example on which the oracle is not finite, or (below
float64) exceeds the square root of the precision's largest float, is one on which the
recurrence itself diverges: it is `Invalid`, to be drawn again, never a failure. In bfloat16,
the chunked forms of a module whose kernels round their operands (its `OPERANDS`) are measured
against bounds that model that rounding (`_operand_targets`, `mixc.check.operands`).
"""

from __future__ import annotations

import math
import types
from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import Tensor

from mixc.check.operands import rounded_operands, rounding_module
from mixc.check.ranges import InputRanges, input_ranges
from mixc.check.sampling import Case, Example, examples, make_case
from mixc.check.tolerance import (
    FACTOR,
    MODEL_CAP,
    TOLERANCE,
    Result,
    limits,
    quantities,
    reference,
    rel_error,
)
from mixc.errors import MixcError

__all__ = ["Failure", "Invalid", "check", "drawn_operand_bounds"]


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


class Invalid(Exception):  # noqa: N818 - the example is outside what the spec can handle
    """The oracle itself overflowed on an example: the example is discarded."""


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


def _check(r: InputRanges, module: types.ModuleType, ex: Example, dtype: torch.dtype, device):
    x, target = _oracle(r, ex, dtype, "from states")
    targets = {"from states": target}
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
            targets[form] = _oracle(r, ex, dtype, form)[1]
        key = "parallel" if form == "parallel" else "from states"
        if form in ("chunk", "packed") and dtype == torch.bfloat16:  # the kernels' forms
            key = "kernels"
            if key not in targets:
                targets[key] = _operand_targets(r, module, x, targets["from states"])
        measured = _measure(form, cs, result, targets[key], recurrent, ex, dtype)
        if isinstance(measured, Failure):
            return worst, measured
        old = worst.get(form, (0.0, 0.0))
        worst[form] = (max(old[0], measured[0]), max(old[1], measured[1]))
        if form == "recurrent":
            recurrent = result
    return worst, None


#: How many examples `_oracle` keeps (least recently used first out).
ORACLE_CACHE_SIZE = 64

_ORACLE: OrderedDict[tuple, dict] = OrderedDict()


def _oracle(r: InputRanges, ex: Example, dtype: torch.dtype, kind: str) -> tuple[_Rounded, tuple]:
    """The case of example `ex` rounded to `dtype`, and the targets of `kind` on it ("from
    states": `_targets`; "parallel": `_parallel_targets`). The spec's text, its input ranges,
    the example and the dtype fix both (the case is drawn from the example's seed, the oracle
    is a deterministic float64 loop), so both are kept by those: fuzzing several modules of
    one spec with one seed (a mutant and the module it mutates, a module file and the spec
    compiled in-process) draws the same examples, and runs the oracle on each once. Targets
    the oracle is not finite on raise `Invalid` each time (they are not kept)."""
    key = (r.spec.source.text, r.ranges, r.wide, r.halved, ex, dtype)
    found = _ORACLE.get(key)
    if found is None:
        found = {"case": _rounded(make_case(r, ex), dtype)}
    _ORACLE[key] = found
    _ORACLE.move_to_end(key)
    while len(_ORACLE) > ORACLE_CACHE_SIZE:
        _ORACLE.popitem(last=False)
    x = found["case"]
    if kind not in found and kind == "parallel":
        found[kind] = _parallel_targets(r, x, ex.seed, dtype)
    elif kind not in found:
        found[kind] = _targets(r, x, ex.seed, dtype, from_states=True)
    return x, found[kind]


def _forms(r: InputRanges, module: types.ModuleType, ex: Example) -> list[tuple[str, int | None]]:
    forms: list[tuple[str, int | None]] = [("recurrent", None)]
    if "step" in getattr(module, "FORMS", ("step",)):  # a non-causal mixer has no step
        forms.append(("step", None))
    if r.plan.chunkable and callable(getattr(module, "chunk", None)):
        # a Triton module's blocks are at least 16 tokens (_tl_block): every chunk size up to 16
        # runs as 16, at any length, so those draws are one computation and run once
        block = getattr(module, "_tl_block", None)
        chunks: dict[int, int] = {}
        for cs in ex.chunk_sizes:
            chunks.setdefault(cs if block is None else block(cs), cs)
        forms += [("chunk", cs) for cs in chunks.values()]
        if ex.T:  # the batch's sequences packed one after another (cu_seqlens)
            forms.append(("packed", next(iter(chunks.values()))))
    if callable(getattr(module, "parallel", None)) and not ex.initial_state:
        forms.append(("parallel", None))
    return forms


def _label(form: str, chunk_size: int | None) -> str:
    if form == "packed":
        return f"chunk on packed sequences (chunk_size={chunk_size})"
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
    if form == "packed":
        return _packed(module, chunk_size, args, kwargs, n_inputs, init)
    ys, state = [], init
    for t in range(args[0].shape[1]):
        step_args = [a[:, t] if i < n_inputs else a for i, a in enumerate(args)]
        y, state = module.step(*step_args, **kwargs, state=state)
        ys.append(y)
    return torch.stack(ys, 1), state


def _packed(module, chunk_size: int, args: list, kwargs: dict, n_inputs: int, init):
    """`chunk` on the batch's B sequences packed along time into one row (cu_seqlens), its
    output laid out as the batch again: the same quantities as one call on the batch."""
    B, T = args[0].shape[:2]
    rows = [a.reshape(1, B * T, *a.shape[2:]) if i < n_inputs else a for i, a in enumerate(args)]
    cu_seqlens = torch.arange(0, B * T + 1, T, device=args[0].device)
    y, final = module.chunk(
        *rows,
        **kwargs,
        initial_state=init,
        output_final_state=True,
        chunk_size=chunk_size,
        cu_seqlens=cu_seqlens,
    )
    return y.reshape(B, T, *y.shape[2:]), final


def _finals(final, names: tuple[str, ...]) -> dict[str, Tensor] | None:
    if final is None:
        return None
    finals = final if isinstance(final, tuple | list) else (final,)
    if len(finals) != len(names):
        return None
    return dict(zip(names, finals, strict=True))


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
) -> tuple[dict[str, Tensor], dict[str, tuple[float, float]], dict[str, tuple[float, float]]]:
    """The oracle's quantities, their (floor, bound)s and (below float64) their float32
    (floor, bound)s, from the case's initial states (or, without `from_states`, from zero
    states with a loss on the output only)."""
    states, cot_s = (x.states, x.cot_states) if from_states else ({}, {})
    args = (x.inputs, x.params, states, x.cot_y, cot_s)
    ref = quantities(reference(r.spec, *args))
    if not all(torch.isfinite(v).all() for v in ref.values()):
        raise Invalid("the oracle is not finite on this example")
    if dtype != torch.float64:
        # a recurrence that diverges on this example: beyond the square root of the largest
        # float of the precision under test its products overflow, and an inf there is the
        # example's, not the module's
        largest = max(float(v.abs().max()) if v.numel() else 0.0 for v in ref.values())
        if largest > torch.finfo(dtype).max ** 0.5:
            raise Invalid(f"the oracle reaches {largest:.3g}, where {dtype} products overflow")
    if dtype == torch.float64:
        return ref, limits(dtype, ref), {}
    conditioned = _conditioned_limits(r, args, ref, seed, torch.float32)
    if dtype == torch.float32:
        return ref, conditioned, conditioned
    # bfloat16 computes in float32: its bounds are never below float32's on the same example
    own = limits(dtype, ref)
    return ref, {q: max(own[q], conditioned[q]) for q in ref}, conditioned


def _operand_targets(r: InputRanges, module: types.ModuleType, x: _Rounded, target: tuple):
    """The targets of a form whose kernels round their operands to bfloat16 (the module's
    `OPERANDS`; see `mixc.check.operands`): each quantity's bound raised to FACTOR times what
    rounding those operands costs it in float64 (through its near-zero floor) plus its float32
    bound, where that is more, and never above MODEL_CAP (a tenth of its scale: not vacuous).
    The cost is the chunked form of the spec's PyTorch module in float64 with its kernels'
    operands rounded, against the same without; that one must agree with the oracle (within
    100 times float64's bound, on every quantity), or the bounds stay as they are."""
    ref, bounds, conditioned = target
    operands = rounded_operands(module)
    if not operands:
        return target
    exact, rounded = (
        _run_form(r, m, "chunk", m.CHUNK_SIZE, _leaves(x, torch.float64, "cpu"), x)
        for m in rounding_module(r.spec, operands)
    )
    agree = 100 * TOLERANCE[torch.float64][0]
    if any(
        q not in exact or rel_error(exact[q], ref[q], f) > agree for q, (f, _) in bounds.items()
    ):
        return target
    raised = {}
    for q, (floor, bound) in bounds.items():
        cost = rel_error(rounded[q], exact[q], floor)  # through the near-zero floor
        modelled = min(FACTOR * cost + conditioned[q][1], MODEL_CAP)
        raised[q] = (floor, max(bound, modelled))
    return ref, raised, conditioned


def drawn_operand_bounds(
    path, operands: dict[str, tuple[str, ...]], n: int, max_T: int
) -> list[tuple[str, float, float, float]]:
    """(quantity, the modelled bound, the plain bfloat16 rule's bound, the float32 bound) for
    every quantity of n examples of the spec at `path`, drawn as `mixc fuzz --dtype bfloat16`
    draws them (derandomised), when the kernels in `operands` round those arguments."""
    from hypothesis import HealthCheck, given, settings

    r = input_ranges(path)
    module = types.SimpleNamespace(OPERANDS=dict(operands))
    found: list[tuple[str, float, float, float]] = []

    @settings(
        max_examples=n,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(examples(r, max_T=max_T, chunked=True))
    def draw(ex):
        x = _rounded(make_case(r, ex), torch.bfloat16)
        try:
            target = _targets(r, x, ex.seed, torch.bfloat16, from_states=True)
        except Invalid:
            return
        _, plain, fp32 = target
        raised = _operand_targets(r, module, x, target)[1]
        found.extend((q, raised[q][1], plain[q][1], fp32[q][1]) for q in raised)

    draw()
    return found


def _conditioned_limits(
    r: InputRanges, args: tuple, ref: dict[str, Tensor], seed: int, dtype: torch.dtype
) -> dict[str, tuple[float, float]]:
    """fp32 limits raised to how well-conditioned the example is: the oracle also runs with every
    input moved by one rounding, in two random directions (one can miss a cancellation), and
    so is every rotated vector (and cos, sin), which the forms round before a kernel reads it:
    B and C turned by one angle cancel that angle out of B^T C, and so do the two halves of the
    angle's gradient, each only as exact as the turned vectors' rounding."""
    inputs, params, states, cot_y, cot_s = args
    gen = torch.Generator().manual_seed(seed + 1)
    eps = torch.finfo(dtype).eps / 2

    def round_once(x: Tensor) -> Tensor:
        return x * (1 + eps * torch.randn(x.shape, generator=gen, dtype=x.dtype))

    def nudge(xs: dict[str, Tensor]) -> dict[str, Tensor]:
        return {n: round_once(x) for n, x in xs.items()}

    bounds = []
    for _ in range(2):
        moved = [nudge(xs) for xs in (inputs, params, states, {"y": cot_y}, cot_s)]
        perturbed = reference(r.spec, *moved[:3], moved[3]["y"], moved[4], rounding=round_once)
        perturbed = quantities(perturbed)
        bounds.append(limits(dtype, ref, perturbed))
    return {q: max(b[q] for b in bounds) for q in ref}


def _parallel_targets(
    r: InputRanges, x: _Rounded, seed: int, dtype: torch.dtype
) -> tuple[dict[str, Tensor], dict[str, tuple[float, float]]]:
    """What the parallel form is compared with: the oracle from a zero state, loss on the
    output only, without final states (the quadratic form keeps none)."""
    zero, zero_limits, _ = _targets(r, x, seed, dtype, from_states=False)
    ref = {q: v for q, v in zero.items() if not q.startswith("final state")}
    return ref, {q: zero_limits[q] for q in ref}, {}


def _leaves(x: _Rounded, dtype: torch.dtype, device) -> dict[str, Tensor]:
    """The tensors a form is called with, requiring gradients: inputs in `dtype`, parameters
    and states in the state dtype."""
    state_dtype = _state_dtype(dtype)

    def leaf(v: Tensor, dt: torch.dtype) -> Tensor:  # a copy: the case is kept (`_oracle`)
        return v.to(device=device, dtype=dt, copy=True).requires_grad_(True)

    leaves = {n: leaf(v, dtype) for n, v in x.inputs.items()}
    leaves.update({n: leaf(v, state_dtype) for n, v in x.params.items()})
    leaves.update({n: leaf(v, state_dtype) for n, v in x.states.items()})
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
    return quantities(Result(y.detach(), {n: s.detach() for n, s in finals.items()}, grads))


def _measure(
    form: str,
    chunk_size: int | None,
    result: dict[str, Tensor],
    target: tuple,
    recurrent: dict[str, Tensor] | None,
    ex: Example,
    dtype: torch.dtype,
) -> tuple[float, float] | Failure:
    """The worst (forward, gradient) error of one form's quantities against the oracle's, or
    the Failure of the first one out of bounds (or off recurrent by more than twice it)."""
    ref, limits = target[:2]
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
