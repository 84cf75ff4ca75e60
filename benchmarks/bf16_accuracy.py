"""bfloat16 accuracy of mixc's Triton kernels beside flash-linear-attention's, one command:

    pip install --no-deps fla-core==0.6.0 einops     # the benchmark environment only
    python benchmarks/bf16_accuracy.py               # prints the table
    python benchmarks/bf16_accuracy.py --write       # and writes benchmarks/RESULTS-bf16-accuracy.md

Each row gives the same bfloat16 inputs (q, k, v, gates, betas; a float32 initial state; a
bfloat16 output cotangent) to a shipped spec's module on the Triton backend (mixc.load(spec,
backend="triton"): it widens the inputs and passes its kernel `operands=torch.bfloat16`, so the
kernel's products take bfloat16 operands with float32 accumulation, as on the tensor cores; but
the delta-rule and DPLR kernels, which it calls without, STATE_ROUNDED) and to
fla's own chunked Triton kernel for the same mixer (chunk_linear_attn, chunk_simple_gla, chunk_gla,
chunk_delta_rule, chunk_gated_delta_rule, chunk_kda), both run on CPU by triton's interpreter. It
reports each one's relative RMS error (as `mixc fuzz` measures, ||a - ref|| / ||ref||) in the
output, the final state and the gradients of q, k and v, against a float64 step-by-step recurrence
of the same function on the same (rounded) inputs, written here from the mixers' definitions, and
the bounds `mixc fuzz --dtype bfloat16` sets for that quantity: the plain one, 4 times the error
of the float64 result rounded to bfloat16, never below float32's bound (1e-5 outputs and states,
1e-4 gradients), and the rule's for a kernel that rounds its operands (docs/fuzzing.md): at
least 4 times what rounding the operands mixc's kernel rounds costs in float64 (the spec's
PyTorch module with and without them rounded, mixc.check.operands), plus float32's bound.

Two things make fla's kernels run in triton 3.9's interpreter, both set here and nowhere else:
the interpreter's tl.dot and its arithmetic (x * scale) take bfloat16 operands as the raw 16-bit
integers it stores them in, so a bfloat16 dot is widened to float32 first (each product of two
bfloat16 numbers is exact in float32, as on the tensor cores; only the order of the sums differs
from a GPU), and bfloat16 arithmetic is done in float32 and rounded to bfloat16; fla's kernels
call `.to(tl.int64)` on a loop counter, which the interpreter leaves a Python int, so fla's modules
see a `range` whose counters have that method; and fla's autotuners, which time configurations
on a GPU, take their first configuration. mixc's kernels need none of this (in the interpreter
they round their bfloat16 operands themselves and multiply in float32). mixc never imports fla.
"""

from __future__ import annotations

import argparse
import builtins
import datetime
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # before torch or triton is imported

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "RESULTS-bf16-accuracy.md"
sys.path.insert(0, str(ROOT))  # this checkout's mixc

import mixc  # noqa: E402
from mixc.check.operands import rounded_operands, rounding_module  # noqa: E402
from mixc.check.tolerance import FACTOR, TOLERANCE, rel_error  # noqa: E402

#: Small enough for the interpreter (a few minutes in all), several chunks of fla's 64 tokens.
B, T, NH, K, V = 1, 192, 2, 64, 64
BF16 = torch.bfloat16


def _patch_interpreter() -> None:
    """triton's interpreter, made to run fla's bfloat16 kernels (the module docstring says why)."""
    import triton.language as tl
    import triton.runtime.autotuner as autotuner
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    plain_dot = builder.create_dot

    def widened(handle):
        if handle.dtype.scalar != tl.bfloat16:
            return handle
        data = interpreter._convert_float(handle.data, tl.bfloat16, tl.float32, None)
        return interpreter.TensorHandle(data.view(np.float32), tl.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return plain_dot(self, widened(a), widened(b), d, input_precision, max_num_imprecise_acc)

    def binary_op(self, lhs, rhs, op):
        if lhs.dtype.scalar != tl.bfloat16:
            return plain_binary(self, lhs, rhs, op)
        out = op(widened(lhs).data, widened(rhs).data)
        if out.dtype == np.bool_:
            return interpreter.TensorHandle(out, tl.int1)
        rounded = interpreter._convert_float(out, tl.float32, tl.bfloat16, None)
        return interpreter.TensorHandle(rounded.view(np.uint16), tl.bfloat16)

    def unary_op(self, arg, op):
        if arg.dtype.scalar != tl.bfloat16:
            return plain_unary(self, arg, op)
        out = interpreter._convert_float(op(widened(arg).data), tl.float32, tl.bfloat16, None)
        return interpreter.TensorHandle(out.view(np.uint16), tl.bfloat16)

    plain_binary, plain_unary = builder.binary_op, builder.unary_op
    builder.unary_op = unary_op
    builder.create_dot = create_dot
    builder.binary_op = binary_op
    autotuner.Autotuner._bench = lambda self, *args, config=None, **kwargs: [1.0, 1.0, 1.0]


class _Counter(int):
    """A loop counter with tl.tensor's `.to` (fla casts its counters to int64)."""

    def to(self, *args, **kwargs):
        return self


def _counting_range(*args):
    return (_Counter(i) for i in builtins.range(*args))


def _fla(module: str, function: str):
    """fla.ops.<module>.<function>, its modules' loops given _counting_range."""
    import importlib

    fn = getattr(importlib.import_module(f"fla.ops.{module}"), function)
    for name, loaded in list(sys.modules.items()):
        if name.startswith("fla.ops"):
            loaded.range = _counting_range
    return fn


# ----- the float64 truth: S [B, NH, K, V] (fla's layout; mixc's H is S^T), o_t = S_t^T q_t


def _recurrence(x: dict, s0: torch.Tensor, step) -> tuple[torch.Tensor, torch.Tensor]:
    """o [B, T, NH, V] and the final S, token by token in float64; step(S, x_t) is S_t."""
    s, outs = s0.double(), []
    for t in range(x["q"].shape[1]):
        xt = {n: u[:, t].double() for n, u in x.items()}
        s = step(s, xt)
        outs.append(torch.einsum("bhk,bhkv->bhv", xt["q"], s))
    return torch.stack(outs, 1), s


def _outer(a, b):
    return a[..., :, None] * b[..., None, :]


def _erase(s, k, beta):
    """(I - beta k k^T) S."""
    return s - beta[..., None, None] * _outer(k, torch.einsum("bhk,bhkv->bhv", k, s))


def _step_linear(s, x):
    return s + _outer(x["k"], x["v"])


def _step_retention(s, x):
    return torch.sigmoid(x["a"])[..., None, None] * s + _outer(x["k"], x["v"])


def _step_gla(s, x):
    return torch.exp(x["g"])[..., None] * s + _outer(x["k"], x["v"])


def _step_delta(s, x):
    decay = torch.exp(x["g"])[..., None, None] if "g" in x else 1.0
    beta = x["beta"]
    return decay * _erase(s, x["k"], beta) + beta[..., None, None] * _outer(x["k"], x["v"])


def _step_mamba2(s, x):
    """Mamba-2 with A = -1 (mixc's H is S^T; D = 0): S_t = exp(-dt_t) S_{t-1} + dt_t k_t v_t^T."""
    dt = x["dt"][..., None, None]
    return torch.exp(-dt) * s + dt * _outer(x["k"], x["v"])


def _step_kda(s, x):
    s = torch.exp(x["g"])[..., None] * s
    return _erase(s, x["k"], x["beta"]) + x["beta"][..., None, None] * _outer(x["k"], x["v"])


# ----- the rows


@dataclass(frozen=True)
class Row:
    spec: str  # specs/<spec>.mix, its inputs by name
    kernel: str  # mixc's Triton kernel it runs
    fla: tuple[str, str]  # fla.ops module and chunked function
    gates: tuple[str, ...]  # the spec's inputs besides q, k, v
    step: object  # the float64 recurrence
    unit_keys: bool = False  # the delta rules: l2-normalised q and k
    #: the spec's inputs and parameters by the benchmark's names (q, k, v and the gates) or as
    #: constants per head; None: its inputs are q, k, v and the gates by those names
    names: tuple[tuple[str, str | float], ...] | None = None


ROWS = (
    Row("linear_attention", "chunk_scalar_decay", ("linear_attn", "chunk_linear_attn"), (),
        _step_linear),
    Row("gated_retention", "chunk_scalar_decay", ("simple_gla", "chunk_simple_gla"), ("a",),
        _step_retention),
    Row("gla", "chunk_diagonal", ("gla", "chunk_gla"), ("g",), _step_gla),
    Row("deltanet", "chunk_delta", ("delta_rule", "chunk_delta_rule"), ("beta",), _step_delta,
        True),
    Row("gated_deltanet", "chunk_delta", ("gated_delta_rule", "chunk_gated_delta_rule"),
        ("g", "beta"), _step_delta, True),
    Row("kda", "chunk_dplr", ("kda", "chunk_kda"), ("g", "beta"), _step_kda, True),
    Row("mamba2", "chunk_scalar_decay", ("simple_gla", "chunk_simple_gla"), ("dt",),
        _step_mamba2, names=(("x", "v"), ("dt", "dt"), ("B", "k"), ("C", "q"), ("A", -1.0),
                             ("D", 0.0))),
)  # fmt: skip


def _args(row: Row, module, x: dict, cast=lambda t: t) -> list:
    """The module's chunk arguments (inputs, then parameters) from the benchmark's tensors."""
    if row.names is None:
        return [cast(x[name]) for name, _ in module.INPUTS]
    named = dict(row.names)
    out = [cast(x[named[name]]) for name, _ in module.INPUTS]
    for name, _ in module.PARAMS:
        wide = torch.float64 if out[0].dtype == torch.float64 else torch.float32  # as states
        out.append(torch.full((NH,), named[name], dtype=wide))
    return out


def _inputs(row: Row, seed: int) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """The bfloat16 inputs by the spec's names, the float32 initial S [B, NH, K, V] and the
    bfloat16 output cotangent."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(B, T, NH, *shape, generator=gen)

    q, k = randn(K), randn(K)
    if row.unit_keys:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    else:  # unit-variance outputs over ~1/(1 - decay) tokens
        q, k = q / K**0.5, k / K**0.5
    x = {"q": q, "k": k, "v": randn(V)}
    u = torch.rand(B, T, NH, K, generator=gen)
    gates = {
        "a": 2 + 4 * u[..., 0],  # decay sigmoid(a) in (0.88, 0.998)
        "g": F.logsigmoid(4 + 2 * (randn() if row.spec == "gated_deltanet" else randn(K))),
        "beta": torch.sigmoid(randn()),
        "dt": F.softplus(randn() - 3),  # decay exp(-dt) about 0.95
    }  # fmt: skip
    x.update({n: gates[n] for n in row.gates})
    x = {n: t.to(BF16) for n, t in x.items()}
    s0 = torch.randn(B, NH, K, V, generator=gen) / K**0.5
    return x, s0, torch.randn(B, T, NH, V, generator=gen).to(BF16)


def _mixc(row: Row, x: dict, s0: torch.Tensor):
    module = mixc.load(ROOT / "specs" / f"{row.spec}.mix", backend="triton")
    args = _args(row, module, x, lambda t: t.float() if t.dtype != BF16 else t)
    o, h = module.chunk(*args, initial_state=s0.transpose(-1, -2), output_final_state=True)
    return o, h.transpose(-1, -2)


def _fla_run(row: Row, x: dict, s0: torch.Tensor):
    fn = _fla(*row.fla)
    q, k, v = x["q"], x["k"], x["v"]
    common = dict(scale=1.0, initial_state=s0, output_final_state=True)
    if row.spec == "linear_attention":
        return fn(q, k, v, normalize=False, **common)
    if row.spec == "gated_retention":
        return fn(q, k, v, F.logsigmoid(x["a"].float()), **common)
    if row.spec == "gla":
        return fn(q, k, v, x["g"].float(), **common)
    if row.spec == "mamba2":  # v = dt x in the inputs' dtype, as a bfloat16 model computes it
        return fn(q, k, v * x["dt"][..., None], -x["dt"].float(), **common)
    if row.spec == "deltanet":
        return fn(q, k, v, x["beta"], **common)
    return fn(q, k, v, x["g"].float(), x["beta"], **common)


def _truth(row: Row, x: dict, s0: torch.Tensor):
    return _recurrence(x, s0, row.step)


def _run(side, row, x, s0, do):
    """(o, final S, {dq, dk, dv}) of one side, the gradients those of <o, do>."""
    leaves = {n: (t.double() if side is _truth else t).requires_grad_() for n, t in x.items()}
    o, s = side(row, leaves, s0)
    grads = torch.autograd.grad(o, [leaves[n] for n in ("q", "k", "v")], do.to(o.dtype))
    return o.detach(), s.detach(), dict(zip(("dq", "dk", "dv"), grads, strict=True))


def _bound(ref: torch.Tensor, kind: int) -> float:
    """mixc fuzz's plain bfloat16 bound for a quantity of this float64 value."""
    rounded = rel_error(ref.to(BF16), ref)
    return max(FACTOR * rounded, TOLERANCE[torch.float32][kind])


def _modelled(module):
    """A side that runs `module` (the spec's PyTorch module, its kernels' operands rounded to
    bfloat16 or not: mixc.check.operands) in float64."""

    def side(row: Row, x: dict, s0: torch.Tensor):
        args = _args(row, module, x, lambda t: t.double())
        s0 = s0.double().transpose(-1, -2)
        o, h = module.chunk(*args, initial_state=s0, output_final_state=True)
        return o, h.transpose(-1, -2)

    return side


def _operand_costs(row: Row, x: dict, s0: torch.Tensor, do: torch.Tensor) -> list[float]:
    """What rounding the operands that mixc's Triton module rounds (its OPERANDS) costs each
    quantity in float64: the rule of mixc fuzz --dtype bfloat16 (docs/fuzzing.md)."""
    spec = mixc.load_spec(ROOT / "specs" / f"{row.spec}.mix")
    triton_module = mixc.load(ROOT / "specs" / f"{row.spec}.mix", backend="triton")
    exact, rounded = (
        _run(_modelled(m), row, x, s0, do)
        for m in rounding_module(spec, rounded_operands(triton_module))
    )
    costs = [rel_error(rounded[i], exact[i]) for i in range(2)]
    return costs + [rel_error(rounded[2][n], exact[2][n]) for n in exact[2]]


def measure(row: Row, seed: int = 0) -> list[tuple[str, float, float, float, float]]:
    """[(quantity, mixc error, fla error, plain bound, the rule's bound)] for one row: the rule's
    bound for a kernel that rounds its operands is at least 4x what that costs plus float32's."""
    x, s0, do = _inputs(row, seed)
    truth = _run(_truth, row, x, s0, do)
    ours = _run(_mixc, row, x, s0, do)
    theirs = _run(_fla_run, row, x, s0, do)
    costs = iter(_operand_costs(row, x, s0, do))
    out = []
    for i, name in enumerate(("output", "final state")):
        ref, plain = truth[i], _bound(truth[i], 0)
        rule = max(plain, FACTOR * next(costs) + TOLERANCE[torch.float32][0])
        out.append((name, rel_error(ours[i], ref), rel_error(theirs[i], ref), plain, rule))
    for name, ref in truth[2].items():
        plain = _bound(ref, 1)
        rule = max(plain, FACTOR * next(costs) + TOLERANCE[torch.float32][1])
        out.append((name, rel_error(ours[2][name], ref), rel_error(theirs[2][name], ref), plain,
                    rule))  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {OUT.relative_to(ROOT)}")
    parser.add_argument("--only", nargs="*", help="these specs only")
    args = parser.parse_args()
    _patch_interpreter()
    torch.set_num_threads(1)
    lines = [
        "| spec | mixc kernel | fla kernel | quantity | mixc error | fla error | plain bound "
        "| rule's bound | mixc within the rule's bound | fla within it |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    failed, start = False, time.time()
    for row in ROWS:
        if args.only and row.spec not in args.only:
            continue
        t0 = time.time()
        for quantity, ours, theirs, plain, rule in measure(row):
            failed |= not ours <= rule
            lines.append(
                f"| {row.spec} | `{row.kernel}` | `{row.fla[1]}` | {quantity} | {ours:.2e} | "
                f"{theirs:.2e} | {plain:.2e} | {rule:.2e} | {'yes' if ours <= rule else 'NO'} | "
                f"{'yes' if theirs <= rule else 'no'} |"
            )
        print(f"{row.spec}: {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    table = "\n".join(lines)
    print(table)
    if args.write:
        import fla
        import triton

        OUT.write_text(
            "# bfloat16 accuracy: mixc's Triton kernels beside fla's\n\n"
            f"`python benchmarks/bf16_accuracy.py --write`, {datetime.date.today()}: torch "
            f"{torch.__version__}, triton {triton.__version__} (interpreter, CPU), fla-core "
            f"{fla.__version__}, {platform.machine()} host; {time.time() - start:.0f} s. "
            f"B={B}, T={T}, NH={NH}, K={K}, V={V}, 64-token chunks, a float32 initial state, "
            "scale 1; every input bfloat16, the same tensors on both sides. Errors: relative "
            "RMS against a float64 step-by-step recurrence on the same rounded inputs (the "
            "gradients of <o, dO> for a bfloat16 dO); plain bound: 4x the error of the float64 "
            "result rounded to bfloat16, never below float32's; the rule's bound (`mixc fuzz "
            "--dtype bfloat16`'s for a kernel that rounds its operands, docs/fuzzing.md): at "
            "least 4x what rounding the operands mixc's kernel rounds (its module's OPERANDS) "
            "costs in float64, plus float32's bound.\n\n"
            f"{table}\n"
        )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
