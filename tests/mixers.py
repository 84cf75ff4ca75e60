"""Shared test helpers: random inputs for any spec, relative errors, the variant specs, and
running the `mixc` command."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import torch

from mixc.check.sampling import sample_inputs, sample_states

SIZES = {"K": 8, "V": 6, "P": 6, "N": 8, "S": 5, "M": 4, "R": 2}


def _threads_per_worker() -> int:
    """This process's share of the cores for torch's threads: all of them when pytest runs
    alone, cores / workers (at least one) under pytest-xdist, so no worker starves another."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, (cores or 1) // workers)


#: Torch threads for this test process (conftest.py sets them; a test that changes them resets).
THREADS = _threads_per_worker()

#: Every answer about a spec (check, explain, compile, a refusal) takes less CPU time than this.
#: A bound that tells a refusal from a blow-up, not a speed target.
ANSWER_SECONDS = 5.0


@contextlib.contextmanager
def answered_within(seconds: float = ANSWER_SECONDS, what: str = "the call"):
    """Asserts the block used less than `seconds` of this process's CPU time. CPU time, not
    wall time: another process on a loaded machine (a parallel test worker) does not count, a
    blow-up in the compiler does."""
    start = time.process_time()
    yield
    used = time.process_time() - start
    assert used < seconds, f"{what} used {used:.1f} s of CPU time (bound: {seconds} s)"


# Variant specs written only for the tests: one per class the shipped specs leave out, and new
# spellings. Each spec keeps itself stable (sigmoid, l2norm, -softplus) for plain N(0, 1) inputs.
VARIANTS = {
    "value_gate": """
mixer value_gate
in    q[K], k[K], v[V], a[V]
state H[V, K]
H_t = diag(sigmoid(a_t)) H_{t-1} + v_t k_t^T
y_t = H_t q_t
""",
    "outer_gate": """
mixer outer_gate
in    q[K], k[K], v[V], a[V], b[K]
state H[V, K]
H_t = (sigmoid(a_t) sigmoid(b_t)^T) ⊙ H_{t-1} + v_t k_t^T
y_t = H_t q_t
""",
    "normalized_gated_retention": """
mixer normalized_gated_retention
in    q[K], k[K], v[V], a
state H[V, K], z[K]
let phi(x) = elu(x) + 1
H_t = sigmoid(a_t) H_{t-1} + v_t phi(k_t)^T
z_t = sigmoid(a_t) z_{t-1} + phi(k_t)
y_t = H_t phi(q_t) / (z_t . phi(q_t))
""",
    "delta_spelled_out": """
mixer delta_spelled_out
in    q[K], k[K], v[V], b
state H[V, K]
let beta(x) = sigmoid(x)
H_t = H_{t-1} - beta(b_t) H_{t-1} l2norm(k_t) l2norm(k_t)^T + beta(b_t) v_t l2norm(k_t)^T
y_t = H_t q_t
""",
    "gated_delta_const": """
mixer gated_delta_const
in    q[K], k[K], v[V], b
param gamma = 1 - 2^(-3 - h)
state H[V, K]
H_t = H_{t-1} gamma (I - sigmoid(b_t) l2norm(k_t) l2norm(k_t)^T) + sigmoid(b_t) v_t l2norm(k_t)^T
y_t = H_t q_t
""",
    "gla_gate_skip": """
mixer gla_gate_skip
in    q[K], k[K], v[V], g[K]
param D
state H[V, K]
H_t = exp(-softplus(g_t))^T ⊙ H_{t-1} + 0.5 v_t k_t^T
y_t = H_t q_t + D v_t
""",
    "readme_l2norm_max_abs": """
mixer readme_l2norm_max_abs
in    q[K], k[K], v[V], a
state H[V, K], z[K]
let nrm(x) = x / sqrt(sum(x^2) + 1e-6)
H_t = sigmoid(a_t) H_{t-1} + v_t nrm(k_t)^T
z_t = sigmoid(a_t) z_{t-1} + nrm(k_t)
y_t = H_t q_t / max(abs(z_t . q_t), 1) + min(a_t, 0) * v_t
""",
    "delta_read_before_and_after": """
mixer delta_read_before_and_after
in    q[K], k[K], v[V], b
state H[V, K]
H_t = H_{t-1} (I - sigmoid(b_t) l2norm(k_t) l2norm(k_t)^T) + sigmoid(b_t) v_t l2norm(k_t)^T
y_t = H_{t-1} q_t + 0.5 H_t q_t
""",
    "normalized_read_before": """
mixer normalized_read_before
in    q[K], k[K], v[V], a
state H[V, K], z[K]
let phi(x) = elu(x) + 1
H_t = sigmoid(a_t) H_{t-1} + v_t phi(k_t)^T
z_t = sigmoid(a_t) z_{t-1} + phi(k_t)
y_t = H_{t-1} phi(q_t) / (z_{t-1} . phi(q_t) + 1)
""",
    "token_shift": """
mixer token_shift
in    q[K], k[K], v[V], a
param mu[K]
state H[V, K]
H_t = sigmoid(a_t) H_{t-1} + v_t (mu * k_t + (1 - mu) * k_{t-1})^T
y_t = H_t q_t + sigmoid(a_{t-1}) v_{t-1}
""",
    "mamba_like_value_scale": """
mixer mamba_like_value_scale
in    x[P], dt, B[N], C[N]
param A_log
state H[P, N]
decay_t = exp(-softplus(dt_t) exp(A_log))
H_t = H_{t-1} decay_t + softplus(dt_t) x_t B_t^T
y_t = H_t C_t
""",
}


def _seed(generator: torch.Generator | None) -> int:
    """A seed for the sampling module drawn from `generator` (torch's global one when None):
    consecutive calls with one generator draw different tensors."""
    return int(torch.randint(0, 2**31 - 1, (), generator=generator))


def spec_inputs(spec, B=2, T=7, NH=3, dtype=torch.float64, heads=None, generator=None):
    """Random inputs and parameters for `spec`, in the compiled-module layout (an input given
    with `heads[name]` heads where set), as (inputs, params) by name: the fuzzer's plain draws
    (`mixc.check.sampling`), in the ranges the analysis derives (a delta-rule key of norm <= 1,
    beta in (0, 1), log-decays <= 0, dt > 0, A < 0)."""
    mixer = spec.mixer
    tensors = sample_inputs(
        spec, SIZES, T, batch=B, heads=NH, dtype=dtype, seed=_seed(generator), input_heads=heads
    )
    names = [d.name for d in mixer.inputs] + [p.name for p in mixer.params if p.default is None]
    n = len(mixer.inputs)
    return dict(zip(names[:n], tensors[:n])), dict(zip(names[n:], tensors[n:]))


def positional(spec, inputs, params):
    names = [d.name for d in spec.mixer.inputs] + [
        p.name for p in spec.mixer.params if p.default is None
    ]
    return [inputs.get(n, params.get(n)) for n in names]


def random_states(spec, B=2, NH=3, dtype=torch.float64, generator=None):
    """Random initial states for `spec` by name, drawn as the fuzzer draws them (0.5 N(0, 1); a
    state read in a denominator positive)."""
    states = sample_states(spec, SIZES, batch=B, heads=NH, dtype=dtype, seed=_seed(generator))
    return dict(zip((s.name for s in spec.mixer.carried), states))


def rel(a: torch.Tensor, ref: torch.Tensor, floor: float = 1e-3) -> float:
    """Relative RMS error ||a - ref|| / ||ref||. A reference whose RMS is below 1e-3 (or a
    larger `floor`) counts as near zero (e.g. a gradient that vanishes analytically): its error
    is measured against an RMS of that floor instead."""
    a, ref = a.double(), ref.double()
    floor = max(floor, 1e-3) * max(ref.numel(), 1) ** 0.5
    return ((a - ref).norm() / ref.norm().clamp_min(floor)).item()


def _exact(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def check_forms_against_reference(module, args, init, want, finals, bound=1e-12):
    """Every form of a compiled module (chunk at two chunk sizes, recurrent, parallel from a zero
    state) computes `want` and the final states `finals` of a float64 reference, within `bound`
    relative; `args` in the module's argument order, `init` None or the initial states."""
    runs = [
        module.chunk(*args.values(), initial_state=init, output_final_state=True, chunk_size=c)
        for c in (4, 16)
    ]
    runs.append(module.recurrent(*args.values(), initial_state=init, output_final_state=True))
    for y, got in runs:
        assert _exact(y, want) < bound
        assert all(_exact(g, f) < bound for g, f in zip(got, finals, strict=True))
    if init is None:
        assert _exact(module.parallel(*args.values())[0], want) < bound


def check_prefill_then_step(module, args, want, finals, prefill=15, bound=1e-12):
    """Prefill the first `prefill` tokens in the chunked form, then step token by token: the
    outputs and the final states equal a float64 reference's one pass (`want`, `finals`)."""
    per_token = {k for k, v in args.items() if v.dim() >= 3}
    T = next(args[k].shape[1] for k in per_token)
    first = {k: (v[:, :prefill] if k in per_token else v) for k, v in args.items()}
    y0, state = module.chunk(*first.values(), output_final_state=True, chunk_size=8)
    ys = [y0]
    for t in range(prefill, T):
        token = {k: (v[:, t] if k in per_token else v) for k, v in args.items()}
        y_t, state = module.step(*token.values(), state=state)
        ys.append(y_t[:, None])
    assert _exact(torch.cat(ys, 1), want) < bound
    assert all(_exact(g, f) < bound for g, f in zip(state, finals, strict=True))


def check_mutant_disagrees(path, old, new, args, want, bound=1e-2):
    """The spec at `path` with `old` replaced by `new` (a plausible slip) compiles, and its
    chunked form's output on `args` is more than `bound` (relative) from the reference's `want`."""
    import mixc

    text = Path(path).read_text(encoding="utf-8")
    assert old in text
    mutant = mixc.load(mixc.load_spec(text=text.replace(old, new)))
    y, _ = mutant.chunk(*args.values(), chunk_size=8)
    assert _exact(y, want) > bound


ROOT = Path(__file__).resolve().parents[1]


def run_mixc(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run `python -m mixc` from `cwd`, importing this checkout's mixc."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "mixc", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


class _Values(torch.autograd.Function):
    """The values of `b` with the gradients of `a`."""

    @staticmethod
    def forward(ctx, a, b):
        return b.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def no_grad_values(module, forms=("chunk",)):
    """The compiled module whose `forms` compute their values without autograd (the kernels'
    one-pass and in-place paths) and their gradients with it, for the fuzzer, which asks for
    both (its own calls take gradients)."""
    proxy = types.ModuleType(f"{module.__name__}_no_grad")
    proxy.__dict__.update({n: x for n, x in vars(module).items() if not n.startswith("__")})

    def wrapped(form):
        def call(*args, **kwargs):
            y, final = form(*args, **kwargs)
            with torch.no_grad():
                y0, final0 = form(*args, **kwargs)
            if final is None:
                return _Values.apply(y, y0), None
            if isinstance(final, torch.Tensor):
                return _Values.apply(y, y0), _Values.apply(final, final0)
            return _Values.apply(y, y0), tuple(map(_Values.apply, final, final0))

        return call

    for name in forms:
        if hasattr(module, name):  # a spec without a quadratic form has no `parallel`
            setattr(proxy, name, wrapped(getattr(module, name)))
    return proxy
