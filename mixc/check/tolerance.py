"""How close a form of a compiled module must come to the float64 oracle, and the oracle's own
result (`reference`, from `mixc.oracle.interpret`) that it is measured against.

Tolerance, as relative RMS error `||a - ref|| / ||ref||` against the oracle: float64 1e-10 for
every quantity; float32 1e-5 for outputs and final states, 1e-4 for gradients, raised to `FACTOR`
= 4 times the oracle's own change when every input is moved by one float32 rounding (the larger
of two random directions) on an ill-conditioned example, such as an output in which a readout and
a skip cancel, or every rotated vector the oracle computes moved by one rounding (see
`check.forms._conditioned_limits`); bfloat16 4 times the error of the reference loop in that
precision, i.e. of the oracle's own result rounded to bfloat16, for the same quantity (and never
below the float32 bound of the same example); a chunked form whose kernels round their operands
to bfloat16 (the module's OPERANDS) also gets 4 times what that rounding costs plus the float32
bound (`check.forms._operand_targets`, `check.operands`). The oracle sees exactly the rounded inputs and
cotangents the module sees, so the error measures the computation, not the rounding of inputs.
In bfloat16, parameters and states are float32 holding rounded values (master weights, as in
mixed-precision training). A reference
whose RMS is below `NEAR_ZERO` (1%) of the largest RMS of its kind (outputs and states, or
gradients) in the example counts as near zero and is measured against that floor. Each form is
also compared with `recurrent`, within twice the bound.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
from torch import Tensor

from mixc.frontend.spec import Spec, load_spec
from mixc.oracle.interpret import interpret

__all__ = [
    "FACTOR",
    "MODEL_CAP",
    "NEAR_ZERO",
    "TOLERANCE",
    "Result",
    "compare",
    "limits",
    "quantities",
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
#: The largest bound the bfloat16 rule's model of kernels that round their operands may give a
#: quantity (`check.forms._operand_targets`): a tenth of its RMS, or of its near-zero floor (a
#: tenth of NEAR_ZERO of the example's largest value, below bfloat16's rounding of that value),
#: so an answer of zeros, or one off by a tenth, still fails. The model's cost is measured
#: through the same floor; a kernel whose rounding would cost more must not round (the Triton
#: backend then calls it without `operands=`), and tests/check/test_operand_rounding.py fails
#: if what the model adds to a shipped spec's bound reaches the cap.
MODEL_CAP = 0.1


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
    rounding=None,
) -> Result:
    """The float64 oracle: output, final states, and the gradients of
    loss = sum(y * cot_y) + sum over states of sum(final * cot_state)
    with respect to every input, parameter and initial state given (by name). `rounding`:
    see `interpret` (the rotated vectors moved by one rounding)."""
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
        rounding,
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


def quantities(r: Result) -> dict[str, Tensor]:
    """Every quantity of a result by the name a Failure gives it ("output", "final state H",
    "gradient of k"): what is measured, one bound each."""
    out = {"output": r.y, **{f"final state {n}": x for n, x in r.finals.items()}}
    out.update({f"gradient of {n}": g for n, g in r.grads.items() if g is not None})
    return out


def limits(
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
    target = quantities(ref)
    mine = quantities(got)
    out = {}
    for q, (floor, bound) in limits(dtype, target).items():
        a = mine.get(q)
        if a is None and q.startswith("gradient") and q.removeprefix("gradient of ") in got.grads:
            a = torch.zeros_like(target[q])  # autograd's None: no dependence
        out[q] = (math.inf if a is None else rel_error(a, target[q], floor), bound)
    return out
