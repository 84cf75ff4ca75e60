"""Tests for mixc/backends/pytorch/kernels.

Every chunked kernel is compared, in fp32, with a float64 step-by-step
recurrence written here from the math of its transition class (the oracle): outputs,
final states and the gradients of every input (via a random cotangent).
Closeness is relative RMS error ||a - ref|| / ||ref|| <= 1e-5, with a tiny
absolute floor (1e-10 RMS) for references that are exactly zero (e.g. the
gradient of the first gate when there is no initial state).
"""

import ast
import importlib
import inspect
import math

import pytest
import torch

from mixc.backends.pytorch.kernels import CLASS_FILES, KERNELS, SHARED_FILES, kernel_source
from mixc.backends.pytorch.kernels.common import _span_tokens, _unit_lower_inverse
from mixc.backends.pytorch.kernels.delta import chunk_delta
from mixc.backends.pytorch.kernels.diagonal import chunk_diagonal
from mixc.backends.pytorch.kernels.dplr import chunk_dplr
from mixc.backends.pytorch.kernels.dplr_value import chunk_dplr_value
from mixc.backends.pytorch.kernels.elementwise import chunk_elementwise
from mixc.backends.pytorch.kernels.scalar_decay import chunk_scalar_decay, parallel_scalar_decay
from tests.mixers import THREADS

B, NH, DK, DV = 2, 3, 8, 6

TOL = 1e-5
ABS_FLOOR = 1e-10


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(THREADS)  # this worker's share (a test before may have changed it)


# ---------------------------------------------------------------------------
# float64 oracles: S_t = G_t(S_{t-1}) + k_t v_t^T, o_t = q_t S_t
# ---------------------------------------------------------------------------


def oracle_scalar(q, k, v, g, s0):
    b, h, t_len, dk = q.shape
    state = s0 if s0 is not None else q.new_zeros(b, h, dk, v.shape[-1])
    outs = []
    for t in range(t_len):
        decay = 1.0 if g is None else torch.exp(g[:, :, t])[..., None, None]
        state = decay * state + k[:, :, t, :, None] * v[:, :, t, None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], state))
    return torch.stack(outs, dim=2), state


def oracle_diagonal(q, k, v, gk, gv, s0):
    b, h, t_len, dk = q.shape
    state = s0 if s0 is not None else q.new_zeros(b, h, dk, v.shape[-1])
    outs = []
    for t in range(t_len):
        if gk is not None:
            state = torch.exp(gk[:, :, t])[..., :, None] * state
        if gv is not None:
            state = state * torch.exp(gv[:, :, t])[..., None, :]
        state = state + k[:, :, t, :, None] * v[:, :, t, None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], state))
    return torch.stack(outs, dim=2), state


def oracle_elementwise(q, k, v, g, g_scale, s0):
    """S_t = exp(g_t (⊙ g_scale_t)) ⊙ S_{t-1} + k_t v_t^T, the log-gates broadcast per entry."""
    b, h, t_len, dk = q.shape
    state = s0 if s0 is not None else q.new_zeros(b, h, dk, v.shape[-1])
    gate = g if g_scale is None else g * g_scale
    gate = gate.expand(b, h, t_len, dk, v.shape[-1])
    outs = []
    for t in range(t_len):
        state = torch.exp(gate[:, :, t]) * state + k[:, :, t, :, None] * v[:, :, t, None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], state))
    return torch.stack(outs, dim=2), state


def oracle_delta(q, k, v, beta, g, s0):
    """S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + k_t v_t^T (v already scaled)."""
    b, h, t_len, dk = q.shape
    state = s0 if s0 is not None else q.new_zeros(b, h, dk, v.shape[-1])
    outs = []
    for t in range(t_len):
        k_t = k[:, :, t]
        k_dot_s = torch.einsum("bhk,bhkv->bhv", k_t, state)
        state = state - beta[:, :, t, None, None] * k_t[..., :, None] * k_dot_s[..., None, :]
        if g is not None:
            state = torch.exp(g[:, :, t])[..., None, None] * state
        state = state + k_t[..., :, None] * v[:, :, t, None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], state))
    return torch.stack(outs, dim=2), state


def oracle_dplr(q, k, v, a, b, gk, s0):
    """S_t = (diag(exp(gk_t)) + b_t a_t^T) S_{t-1} + k_t v_t^T (gk None: no decay)."""
    bs, h, t_len, dk = q.shape
    state = s0 if s0 is not None else q.new_zeros(bs, h, dk, v.shape[-1])
    outs = []
    for t in range(t_len):
        read = torch.einsum("bhk,bhkv->bhv", a[:, :, t], state)  # a_t^T S_{t-1}
        if gk is not None:
            state = torch.exp(gk[:, :, t])[..., :, None] * state
        state = state + b[:, :, t, :, None] * read[..., None, :]
        state = state + k[:, :, t, :, None] * v[:, :, t, None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], state))
    return torch.stack(outs, dim=2), state


def dplr_inputs(t_len, *, gate=True, init=True, seed=0):
    """RWKV-7's form: a = -kk, b = kk ⊙ alpha with unit kk and alpha in (0, 1)."""
    inputs = make_inputs(t_len, gate="gk" if gate else None, init=init, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1000)
    shape = inputs["k"].shape
    kk = torch.nn.functional.normalize(
        torch.randn(shape, generator=gen, dtype=torch.float64), dim=-1
    )
    inputs["a"] = -kk
    inputs["b"] = kk * torch.rand(shape, generator=gen, dtype=torch.float64)
    return inputs


def oracle_dplr_value(q, k, v, a, gk, s0):
    """M_t = M_{t-1} (diag(exp(gk_t)) + a_t k_t^T) + v_t k_t^T on M [K, V] (the transition on
    the value axis), o_t = q_t M_t (gk None: no decay)."""
    bs, h, t_len, dk = q.shape
    state = s0 if s0 is not None else q.new_zeros(bs, h, dk, k.shape[-1])
    outs = []
    for t in range(t_len):
        read = torch.einsum("bhkv,bhv->bhk", state, a[:, :, t])  # M_{t-1} a_t
        if gk is not None:
            state = state * torch.exp(gk[:, :, t])[..., None, :]
        state = state + (read + v[:, :, t])[..., :, None] * k[:, :, t, None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], state))
    return torch.stack(outs, dim=2), state


def dplr_value_inputs(t_len, *, gate=True, init=True, seed=0):
    """The gated Oja rule on M = H^T: a unit k (H's value direction), beta in (0, 1), the
    rank-1 read a = -beta exp(gk) ⊙ k, and v = beta times H's key, of the state's K rows."""
    base = make_inputs(t_len, gate="gv" if gate else None, init=init, seed=seed)
    gen = torch.Generator().manual_seed(seed + 2000)
    q, v = base["q"], base["k"]  # [.., DK]: the state's rows
    k = torch.nn.functional.normalize(base["v"], dim=-1)  # [.., DV]: the state's columns
    beta = torch.rand(*k.shape[:-1], 1, generator=gen, dtype=torch.float64)
    decay = torch.exp(base["gv"]) if gate else 1.0
    inputs = {"q": q, "k": k, "v": beta * v, "a": -beta * decay * k}
    if gate:
        inputs["gk"] = base["gv"]
    if init:
        inputs["initial_state"] = base["initial_state"]
    return inputs


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def make_inputs(
    t_len, *, gate="g", init=True, delta=False, log_scale=False, seed=0, b=B, nh=NH, dk=DK, dv=DV
):
    """float64 inputs; gate in {None, 'g', 'gk', 'gv', 'gkgv'}; log_scale: a write scale's log
    per token (the stable kernel's)."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    inputs = {
        "q": randn(b, nh, t_len, dk) / math.sqrt(dk),
        "k": randn(b, nh, t_len, dk),
        "v": randn(b, nh, t_len, dv),
    }
    if delta:
        inputs["k"] = torch.nn.functional.normalize(inputs["k"], dim=-1)
        inputs["beta"] = torch.sigmoid(randn(b, nh, t_len))
    if gate == "g":
        inputs["g"] = torch.nn.functional.logsigmoid(randn(b, nh, t_len) + 2.0)
    if gate in ("gk", "gkgv"):
        inputs["gk"] = torch.nn.functional.logsigmoid(randn(b, nh, t_len, dk) + 2.0)
    if gate in ("gv", "gkgv"):
        inputs["gv"] = torch.nn.functional.logsigmoid(randn(b, nh, t_len, dv) + 2.0)
    if log_scale:
        inputs["log_scale"] = 3 * randn(b, nh, t_len)
    if gate == "full":
        inputs["g"] = torch.nn.functional.logsigmoid(randn(b, nh, t_len, dk, dv) + 2.0)
    if init:
        inputs["initial_state"] = randn(b, nh, dk, dv)
    return inputs


def forward_and_grads(fn, inputs, dtype, cotangents, **kwargs):
    """Run fn on leaf copies of inputs in dtype; return (outputs, grads by name)."""
    leaves = {name: x.detach().to(dtype).requires_grad_(True) for name, x in inputs.items()}
    outputs = fn(**leaves, **kwargs)
    if not isinstance(outputs, tuple):
        outputs = (outputs,)
    loss = sum((out * cot.to(dtype)).sum() for out, cot in zip(outputs, cotangents, strict=True))
    names = list(leaves)
    grads = torch.autograd.grad(loss, [leaves[n] for n in names])
    return [o.detach() for o in outputs], dict(zip(names, grads, strict=True))


def rel_err(a, ref):
    a = a.to(torch.float64)
    diff = torch.linalg.vector_norm(a - ref).item()
    floor = ABS_FLOOR * math.sqrt(ref.numel())
    return diff / max(torch.linalg.vector_norm(ref).item(), floor)


def check_against_oracle(kernel, oracle, inputs, tol=TOL, **kwargs):
    """fp32 kernel vs float64 oracle: outputs, final state and every input gradient."""
    gen = torch.Generator().manual_seed(123)
    # random cotangents shaped like the oracle outputs
    with torch.no_grad():
        ref_values = oracle(**inputs)
    ref_values = ref_values if isinstance(ref_values, tuple) else (ref_values,)
    cotangents = [torch.randn(r.shape, generator=gen, dtype=torch.float64) for r in ref_values]
    ref_out, ref_grads = forward_and_grads(oracle, inputs, torch.float64, cotangents)
    out, grads = forward_and_grads(kernel, inputs, torch.float32, cotangents, **kwargs)
    assert all(o.dtype == torch.float32 for o in out)
    errors = {}
    for i, (o, r) in enumerate(zip(out, ref_out, strict=True)):
        assert o.shape == r.shape
        errors[("o", "state")[i]] = rel_err(o, r)
    for name in ref_grads:
        errors["d" + name] = rel_err(grads[name], ref_grads[name])
    bad = {n: e for n, e in errors.items() if not e <= tol}
    assert not bad, f"errors above {tol}: {bad} (all: {errors})"
    return errors


T_VALUES = [1, 7, 64, 100]
CHUNKS = [4, 16, 64]


# ---------------------------------------------------------------------------
# accuracy vs oracle
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("gate", ["g", None])
@pytest.mark.parametrize("init", [True, False])
@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("t_len", T_VALUES)
def test_chunk_scalar_decay(t_len, chunk, init, gate):
    inputs = make_inputs(t_len, gate=gate, init=init)

    def oracle(q, k, v, g=None, initial_state=None):
        return oracle_scalar(q, k, v, g, initial_state)

    check_against_oracle(chunk_scalar_decay, oracle, inputs, chunk_size=chunk)


@pytest.mark.parametrize("gate", ["g", None])
@pytest.mark.parametrize("t_len", T_VALUES)
def test_parallel_scalar_decay(t_len, gate):
    inputs = make_inputs(t_len, gate=gate, init=False)

    def oracle(q, k, v, g=None):
        return oracle_scalar(q, k, v, g, None)[0]

    check_against_oracle(parallel_scalar_decay, oracle, inputs)


@pytest.mark.parametrize("gate", ["gk", "gv", "gkgv"])
@pytest.mark.parametrize("init", [True, False])
@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("t_len", T_VALUES)
def test_chunk_diagonal(t_len, chunk, init, gate):
    inputs = make_inputs(t_len, gate=gate, init=init)

    def oracle(q, k, v, gk=None, gv=None, initial_state=None):
        return oracle_diagonal(q, k, v, gk, gv, initial_state)

    check_against_oracle(chunk_diagonal, oracle, inputs, chunk_size=chunk)


@pytest.mark.parametrize("gate", ["g", None])
@pytest.mark.parametrize("init", [True, False])
@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("t_len", T_VALUES)
def test_chunk_delta(t_len, chunk, init, gate):
    inputs = make_inputs(t_len, gate=gate, init=init, delta=True)

    def oracle(q, k, v, beta, g=None, initial_state=None):
        return oracle_delta(q, k, v, beta, g, initial_state)

    check_against_oracle(chunk_delta, oracle, inputs, chunk_size=chunk)


def _elementwise_oracle(q, k, v, g, initial_state=None, g_scale=None):
    return oracle_elementwise(q, k, v, g, g_scale, initial_state)


def _check_elementwise(inputs, chunk_size):
    """Against the oracle with autograd (the checkpointed spans) and without it (the spans
    written in place)."""
    check_against_oracle(chunk_elementwise, _elementwise_oracle, inputs, chunk_size=chunk_size)
    with torch.no_grad():
        out = chunk_elementwise(**{n: x.float() for n, x in inputs.items()}, chunk_size=chunk_size)
        ref = _elementwise_oracle(**inputs)
    for o, r in zip(out, ref, strict=True):
        assert o.dtype == torch.float32 and rel_err(o, r) <= TOL


@pytest.mark.parametrize("init", [True, False])
@pytest.mark.parametrize("chunk", [1, *CHUNKS])
@pytest.mark.parametrize("t_len", T_VALUES)
def test_chunk_elementwise(t_len, chunk, init):
    _check_elementwise(make_inputs(t_len, gate="full", init=init), chunk)


@pytest.mark.parametrize("shift", [-8.0, 0.0, 8.0, 25.0])
def test_chunk_elementwise_factored_gate_near_0_and_1(shift):
    """A per-token vector times a per-head matrix (Mamba-1's dt_t * A), broadcast views: decays
    near 1 (logsigmoid(25) ~ -1e-11) and near 0 (about exp(-8 * 4) per token) stay accurate,
    the gradients of both factors included."""
    gen = torch.Generator().manual_seed(5)
    inputs = make_inputs(70, gate=None, seed=3)
    dt = torch.nn.functional.logsigmoid(
        torch.randn(B, NH, 70, 1, DV, generator=gen, dtype=torch.float64) + shift
    )
    a = 0.5 + 4 * torch.rand(1, NH, 1, DK, DV, generator=gen, dtype=torch.float64)
    inputs.update(g=dt, g_scale=a)
    _check_elementwise(inputs, 16)


@pytest.mark.parametrize("t_len", [7, 37])
def test_chunk_elementwise_gate_constant_in_time(t_len):
    """A gate constant in time (a T axis of 1, as a per-head parameter is) on a sequence that is
    not whole chunks: the padding after the last token, where that gate is not zero, does not
    reach the final state."""
    inputs = make_inputs(t_len, gate="full", seed=6)
    inputs["g"] = inputs["g"][:, :, :1].clone()
    _check_elementwise(inputs, 16)


def test_chunk_elementwise_hard_reset():
    """A decay of exactly 0 (log-gate -inf) forgets the state, with finite gradients."""
    inputs = make_inputs(30, gate="full", seed=4)
    inputs["g"][:, :, 9] = -math.inf
    _check_elementwise(inputs, 8)


def test_chunk_elementwise_several_spans():
    """Wide states run in several spans: the state passes between them, the last one padded,
    and the gradients flow back through every span's checkpoint."""
    from mixc.backends.pytorch.kernels.elementwise import _span_chunks

    inputs = make_inputs(150, gate="full", b=2, nh=4, dk=32, dv=64, seed=13)
    assert _span_chunks(inputs["q"], inputs["v"], 16) * 16 < 150
    _check_elementwise(inputs, 16)


@pytest.mark.parametrize("gate", [True, False])
@pytest.mark.parametrize("init", [True, False])
@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("t_len", T_VALUES)
def test_chunk_dplr(t_len, chunk, init, gate):
    inputs = dplr_inputs(t_len, gate=gate, init=init)

    def oracle(q, k, v, a, b, gk=None, initial_state=None):
        return oracle_dplr(q, k, v, a, b, gk, initial_state)

    check_against_oracle(chunk_dplr, oracle, inputs, chunk_size=chunk)


@pytest.mark.parametrize("gate", [True, False])
@pytest.mark.parametrize("init", [True, False])
@pytest.mark.parametrize("chunk", [4, 16])
@pytest.mark.parametrize("t_len", [1, 7, 100])
def test_chunk_dplr_value(t_len, chunk, init, gate):
    """The value-side kernel (two passes: chunk_dplr, then chunk_diagonal) against a loop of its
    own recurrence: outputs, final state and every input's gradient."""
    inputs = dplr_value_inputs(t_len, gate=gate, init=init, seed=t_len)

    def oracle(q, k, v, a, gk=None, initial_state=None):
        return oracle_dplr_value(q, k, v, a, gk, initial_state)

    check_against_oracle(chunk_dplr_value, oracle, inputs, chunk_size=chunk)


RWKV7_LEAST_LOG_DECAY = -0.6065306597126334  # -exp(-0.5) sigmoid(d) >= -exp(-0.5)


@pytest.mark.parametrize(("chunk", "direct"), [(4, True), (32, True), (64, False)])
@pytest.mark.parametrize("t_len", [37, 100])  # both run C = 64 as asked
def test_chunk_dplr_gate_bound(t_len, chunk, direct, monkeypatch):
    """A gate with a proven lower bound (RWKV-7's): where a chunk cannot decay below 2^-30
    (32 * 0.61 < log 2^30 < 64 * 0.61) its scores are one matmul, elsewhere the block split;
    both against the oracle, with autograd and without."""
    import mixc.backends.pytorch.kernels.dplr as dplr_kernels

    inputs = dplr_inputs(t_len, seed=6)
    gen = torch.Generator().manual_seed(7)
    noise = torch.randn(inputs["gk"].shape, generator=gen, dtype=torch.float64)
    inputs["gk"] = RWKV7_LEAST_LOG_DECAY * torch.sigmoid(noise)
    calls = []
    direct_scores = dplr_kernels._dplr_scores_direct

    def counted(*args):
        calls.append(args[0].shape)
        return direct_scores(*args)

    monkeypatch.setattr(dplr_kernels, "_dplr_scores_direct", counted)

    def oracle(q, k, v, a, b, gk, initial_state):
        return oracle_dplr(q, k, v, a, b, gk, initial_state)

    kwargs = {"chunk_size": chunk, "gk_min": RWKV7_LEAST_LOG_DECAY}
    check_against_oracle(chunk_dplr, oracle, inputs, **kwargs)
    with torch.no_grad():
        ref = oracle(**inputs)
        out = chunk_dplr(**{n: x.float() for n, x in inputs.items()}, **kwargs)
    for o, r in zip(out, ref, strict=True):
        assert rel_err(o, r) <= TOL
    assert bool(calls) == direct


@pytest.mark.parametrize("chunk", [1, 2, 32, 128])
def test_other_chunk_sizes(chunk):
    """Chunk sizes outside the main grid (several sub-chunks at 32/128, trivial chunks at 1/2)."""
    t_len = 45
    inputs = make_inputs(t_len, gate="g", seed=1)
    check_against_oracle(
        chunk_scalar_decay,
        lambda q, k, v, g, initial_state: oracle_scalar(q, k, v, g, initial_state),
        inputs,
        chunk_size=chunk,
    )
    inputs = make_inputs(t_len, gate="gkgv", seed=2)
    check_against_oracle(
        chunk_diagonal,
        lambda q, k, v, gk, gv, initial_state: oracle_diagonal(q, k, v, gk, gv, initial_state),
        inputs,
        chunk_size=chunk,
    )
    inputs = make_inputs(t_len, gate="g", delta=True, seed=3)
    check_against_oracle(
        chunk_delta,
        lambda q, k, v, beta, g, initial_state: oracle_delta(q, k, v, beta, g, initial_state),
        inputs,
        chunk_size=chunk,
    )
    inputs = dplr_inputs(t_len, seed=4)
    check_against_oracle(
        chunk_dplr,
        lambda q, k, v, a, b, gk, initial_state: oracle_dplr(q, k, v, a, b, gk, initial_state),
        inputs,
        chunk_size=chunk,
    )


def test_k_equals_v_dims_and_single_head():
    inputs = make_inputs(33, gate="gkgv", b=1, nh=1, dk=5, dv=5, seed=4)
    check_against_oracle(
        chunk_diagonal,
        lambda q, k, v, gk, gv, initial_state: oracle_diagonal(q, k, v, gk, gv, initial_state),
        inputs,
        chunk_size=16,
    )


def _strong_mixed_gate(shape, gen):
    """Log-gates mixing strong (-20 .. -1e3) and ordinary decays."""
    strong = -torch.exp(
        torch.empty(shape, dtype=torch.float64).uniform_(math.log(20), math.log(1e3), generator=gen)
    )
    mild = torch.nn.functional.logsigmoid(
        torch.randn(shape, generator=gen, dtype=torch.float64) + 2.0
    )
    pick = torch.rand(shape, generator=gen, dtype=torch.float64) < 0.3
    return torch.where(pick, strong, mild)


def test_strong_mixed_decay_accuracy():
    """Accuracy (not only finiteness) when some gates nearly zero the state."""
    gen = torch.Generator().manual_seed(5)
    t_len = 200
    inputs = make_inputs(t_len, gate=None, b=1, nh=2, seed=5)
    inputs["g"] = _strong_mixed_gate((1, 2, t_len), gen)
    check_against_oracle(
        chunk_scalar_decay,
        lambda q, k, v, initial_state, g: oracle_scalar(q, k, v, g, initial_state),
        inputs,
        chunk_size=64,
    )
    inputs = make_inputs(t_len, gate=None, b=1, nh=2, seed=6)
    inputs["gk"] = _strong_mixed_gate((1, 2, t_len, DK), gen)
    inputs["gv"] = _strong_mixed_gate((1, 2, t_len, DV), gen)
    check_against_oracle(
        chunk_diagonal,
        lambda q, k, v, initial_state, gk, gv: oracle_diagonal(q, k, v, gk, gv, initial_state),
        inputs,
        chunk_size=64,
    )
    inputs = make_inputs(t_len, gate=None, b=1, nh=2, delta=True, seed=7)
    inputs["g"] = _strong_mixed_gate((1, 2, t_len), gen)
    check_against_oracle(
        chunk_delta,
        lambda q, k, v, beta, initial_state, g: oracle_delta(q, k, v, beta, g, initial_state),
        inputs,
        chunk_size=64,
    )


@pytest.mark.parametrize("chunk", [4, 8, 32, 64])
@pytest.mark.parametrize("beta", [1.0, 2.0])
def test_unit_lower_inverse_with_nearly_parallel_keys(chunk, beta):
    """The triangular inverse keeps the block recursion's accuracy where it is hardest: keys
    nearly parallel (A close to beta times all-ones), beta up to 2 (negative eigenvalues)."""
    gen = torch.Generator().manual_seed(chunk)
    k = torch.ones(4, chunk, 64, dtype=torch.float64)
    k = torch.nn.functional.normalize(
        k + 0.01 * torch.randn(k.shape, generator=gen, dtype=k.dtype), dim=-1
    )
    a = (beta * k @ k.mT).tril(-1)
    ref = torch.linalg.inv(torch.eye(chunk, dtype=torch.float64) + a)
    err = (_unit_lower_inverse(a.float()).double() - ref).abs().max().item()
    # the recursion on 1 x 1 blocks reaches about 3e-7 (beta = 1) and 3e-5 (beta = 2) here
    assert err <= (1e-6 if beta == 1.0 else 1e-4) * ref.abs().max().item()


@pytest.mark.parametrize("kernel", ["scalar", "delta"])
def test_hard_reset_gate(kernel):
    """A log-gate of -inf (decay exactly 0) resets the state: outputs and final state match
    the oracle, and every gradient is finite."""
    delta = kernel == "delta"
    inputs = make_inputs(50, gate="g", b=1, nh=2, delta=delta, seed=9)
    inputs["g"][:, :, [0, 17, 31, 32, 49]] = float("-inf")
    fn = chunk_delta if delta else chunk_scalar_decay
    with torch.no_grad():
        out = fn(**{n: x.float() for n, x in inputs.items()}, chunk_size=16)
        if delta:
            ref = oracle_delta(
                **{n: inputs[n] for n in ("q", "k", "v", "beta", "g")}, s0=inputs["initial_state"]
            )
        else:
            ref = oracle_scalar(
                **{n: inputs[n] for n in ("q", "k", "v", "g")}, s0=inputs["initial_state"]
            )
    for o, r in zip(out, ref, strict=True):
        assert rel_err(o, r) <= TOL
    leaves = {n: x.float().requires_grad_(True) for n, x in inputs.items()}
    o, state = fn(**leaves, chunk_size=16)
    (o.sum() + state.sum()).backward()
    assert all(torch.isfinite(x.grad).all() for x in leaves.values())


# ---------------------------------------------------------------------------
# extreme decays at long T: finite outputs and gradients
# ---------------------------------------------------------------------------


def _assert_finite_everything(fn, inputs, **kwargs):
    gen = torch.Generator().manual_seed(9)
    leaves = {n: x.detach().float().requires_grad_(True) for n, x in inputs.items()}
    outputs = fn(**leaves, **kwargs)
    if not isinstance(outputs, tuple):
        outputs = (outputs,)
    loss = sum((o * torch.randn(o.shape, generator=gen)).sum() for o in outputs)
    grads = torch.autograd.grad(loss, list(leaves.values()))
    for o in outputs:
        assert torch.isfinite(o).all()
    for name, gr in zip(leaves, grads, strict=True):
        assert torch.isfinite(gr).all(), f"non-finite gradient of {name}"


@pytest.mark.parametrize("log_gate", [-20.0, -30.0, -1e3, -1e4, -1e-6])
def test_extreme_decay_long_sequence_is_finite(log_gate):
    t_len = 4096
    base = make_inputs(t_len, gate=None, b=1, nh=2, seed=8)
    g = torch.full((1, 2, t_len), log_gate, dtype=torch.float64)

    _assert_finite_everything(chunk_scalar_decay, dict(base, g=g), chunk_size=64)
    gk = torch.full((1, 2, t_len, DK), log_gate, dtype=torch.float64)
    gv = torch.full((1, 2, t_len, DV), log_gate, dtype=torch.float64)
    _assert_finite_everything(chunk_diagonal, dict(base, gk=gk, gv=gv), chunk_size=64)
    _assert_finite_everything(chunk_diagonal, dict(base, gk=gk), chunk_size=64)
    delta_inputs = make_inputs(t_len, gate=None, b=1, nh=2, delta=True, seed=8)
    _assert_finite_everything(chunk_delta, dict(delta_inputs, g=g), chunk_size=64)
    short = {n: x[:, :, :512] for n, x in base.items() if n != "initial_state"}
    _assert_finite_everything(parallel_scalar_decay, dict(short, g=g[:, :, :512]))


def test_delta_long_sequence_matches_oracle():
    """DeltaNet (no decay) over a long sequence stays accurate (errors do not compound)."""
    inputs = make_inputs(2048, gate=None, b=1, nh=1, delta=True, seed=10)
    check_against_oracle(
        chunk_delta,
        lambda q, k, v, beta, initial_state: oracle_delta(q, k, v, beta, None, initial_state),
        inputs,
        chunk_size=64,
    )


@pytest.mark.parametrize("gate", ["g", None, "gk", "gkgv", "delta"])
def test_several_spans(gate):
    """Wide heads and a long sequence run in several spans on CPU: the state passes between
    spans, the last span is padded, and the gradients flow back through every span. Without
    autograd the spans write into one output tensor instead: same numbers."""
    delta = gate == "delta"
    inputs = make_inputs(
        120, gate="g" if delta else gate, b=4, nh=8, dk=64, dv=64, delta=delta, seed=13
    )
    if delta:
        kernel = chunk_delta

        def oracle(q, k, v, beta, g, initial_state):
            return oracle_delta(q, k, v, beta, g, initial_state)

    elif gate in ("g", None):
        kernel = chunk_scalar_decay

        def oracle(q, k, v, initial_state, g=None):
            return oracle_scalar(q, k, v, g, initial_state)

    else:
        kernel = chunk_diagonal

        def oracle(q, k, v, initial_state, gk=None, gv=None):
            return oracle_diagonal(q, k, v, gk, gv, initial_state)

    q, v = inputs["q"].float(), inputs["v"].float()
    assert _span_tokens(q, v, 16) < 120  # really several spans
    check_against_oracle(kernel, oracle, inputs, chunk_size=16)
    with torch.no_grad():
        out = kernel(**{n: x.float() for n, x in inputs.items()}, chunk_size=16)
        ref = oracle(**inputs)
    for o, r in zip(out, ref, strict=True):
        assert rel_err(o, r) <= TOL


OWN_BACKWARD = {
    "scalar": chunk_scalar_decay,
    "delta": chunk_delta,
    "diagonal": chunk_diagonal,
}


@pytest.mark.parametrize("kernel", sorted(OWN_BACKWARD))
@pytest.mark.parametrize("gate", ["g", None])
def test_own_backward_is_differentiable(kernel, gate):
    """The scalar-decay, delta and (key-side) diagonal kernels have their own backward: torch's
    numerical gradient checks agree with it (first order) and with its own derivative (second
    order), in float64, over a padded last chunk, with an initial state and a hard reset (a
    gate of -inf) in the middle."""
    delta = kernel == "delta"
    if kernel == "diagonal":
        gate = gate and "gk"
    inputs = make_inputs(10, gate=gate, b=1, nh=2, dk=3, dv=2, delta=delta, seed=21)
    if gate:
        inputs[gate][:, 1, 5] = float("-inf")
    names = list(inputs)
    leaves = [inputs[n].clone().requires_grad_(True) for n in names]
    fn_kernel = OWN_BACKWARD[kernel]

    def fn(*args):
        return fn_kernel(**dict(zip(names, args, strict=True)), chunk_size=4)

    assert torch.autograd.gradcheck(fn, leaves)
    assert torch.autograd.gradgradcheck(fn, leaves)


@pytest.mark.parametrize("kernel", sorted(OWN_BACKWARD))
def test_own_backward_runs_twice(kernel):
    """A retained graph back-propagated twice, over several spans, gives the same gradients:
    the own backward consumes nothing of what its forward kept."""
    delta = kernel == "delta"
    gate = "gk" if kernel == "diagonal" else "g"
    inputs = make_inputs(120, gate=gate, b=4, nh=8, dk=64, dv=64, delta=delta, seed=23)
    leaves = {n: x.float().requires_grad_(True) for n, x in inputs.items()}
    assert _span_tokens(leaves["q"], leaves["v"], 16) < 120  # several spans
    o, state = OWN_BACKWARD[kernel](**leaves, chunk_size=16)
    loss = o.square().sum() + state.sum()
    first = torch.autograd.grad(loss, list(leaves.values()), retain_graph=True)
    second = torch.autograd.grad(loss, list(leaves.values()))
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


@pytest.mark.parametrize("kernel", sorted(OWN_BACKWARD))
@pytest.mark.parametrize("gate", ["g", None])
def test_own_backward_keeps_little(kernel, gate):
    """The own backward keeps the inputs and a few per-chunk tensors: the masked scores and the
    states entering each chunk (and T = (I + A)^{-1} for the delta rule), at C = K = V two
    (three) inputs' worth beyond the inputs, where autograd through the chunked form kept 5 to
    28 inputs' worth of intermediates."""
    delta = kernel == "delta"
    if kernel == "diagonal":
        gate = gate and "gk"
    t_len, size = 256, 16
    inputs = make_inputs(t_len, gate=gate, b=1, nh=2, dk=size, dv=size, delta=delta, seed=22)
    leaves = {n: x.float().requires_grad_(True) for n, x in inputs.items()}
    kept = {}

    def pack(x):
        kept[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes()
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        OWN_BACKWARD[kernel](**leaves, chunk_size=size)
    for x in leaves.values():
        kept.pop(x.untyped_storage().data_ptr(), None)
    one_input = leaves["q"].numel() * 4
    assert 0 < sum(kept.values()) <= (3.2 if delta else 2.2) * one_input


@pytest.mark.parametrize("kernel", ["scalar", "delta"])
def test_decay_constant_in_time(kernel):
    """A per-head decay broadcast over time (stride 0, as generated modules pass a constant)
    builds one decay mask for all chunks of a whole span; the padded last span takes the
    general path. Outputs, final state and gradients, the decay's own included, match the
    oracle, with and without autograd."""
    delta = kernel == "delta"
    b, nh, t_len = 4, 8, 120  # spans of 7 chunks of 16: one whole span, one padded
    inputs = make_inputs(t_len, gate=None, b=b, nh=nh, dk=64, dv=64, delta=delta, seed=5)
    gen = torch.Generator().manual_seed(6)
    inputs["log_decay"] = torch.nn.functional.logsigmoid(
        torch.randn(nh, generator=gen, dtype=torch.float64) + 2.0
    )

    def over_time(log_decay):
        return log_decay[None, :, None].expand(b, nh, t_len)

    def fn(q, k, v, initial_state, log_decay, beta=None):
        g = over_time(log_decay)
        assert g.stride(2) == 0
        if delta:
            return chunk_delta(q, k, v, beta, g, initial_state, chunk_size=16)
        return chunk_scalar_decay(q, k, v, g, initial_state, chunk_size=16)

    def oracle(q, k, v, initial_state, log_decay, beta=None):
        g = over_time(log_decay)
        if delta:
            return oracle_delta(q, k, v, beta, g, initial_state)
        return oracle_scalar(q, k, v, g, initial_state)

    assert _span_tokens(inputs["q"].float(), inputs["v"].float(), 16) == 112
    check_against_oracle(fn, oracle, inputs)
    with torch.no_grad():
        out = fn(**{n: x.float() for n, x in inputs.items()})
        ref = oracle(**inputs)
    for o, r in zip(out, ref, strict=True):
        assert rel_err(o, r) <= TOL


# ---------------------------------------------------------------------------
# structure required by the code generator
# ---------------------------------------------------------------------------

PUBLIC = [
    "chunk_scalar_decay",
    "parallel_scalar_decay",
    "chunk_scalar_decay_stable",
    "chunk_scalar_decay_rank",
    "chunk_diagonal",
    "chunk_delta",
    "chunk_elementwise",
    "chunk_dplr",
    "chunk_dplr_value",
]
KERNEL_FILES = [*SHARED_FILES, *CLASS_FILES]
SHARED = {f"mixc.backends.pytorch.kernels.{name}": name for name in SHARED_FILES}


def _kernel_file(name):
    return importlib.import_module(f"mixc.backends.pytorch.kernels.{name}")


def _top_level_definitions(file):
    """The top-level functions and classes of one kernel file, by name, in source order."""
    tree = ast.parse(inspect.getsource(_kernel_file(file)))
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}


def _all_definitions():
    """The top-level definitions of every kernel file, the shared ones first, then CLASS_FILES."""
    return {name: n for file in KERNEL_FILES for name, n in _top_level_definitions(file).items()}


def _called_helpers(func_name, tree_funcs):
    found, stack = set(), [func_name]
    while stack:
        node = tree_funcs[stack.pop()]
        for sub in ast.walk(node):
            # helpers, and the public kernels that a kernel made of others calls
            name = sub.id if isinstance(sub, ast.Name) else ""
            if name in tree_funcs and (name.startswith("_") or name in KERNELS):
                if sub.id not in found:
                    found.add(sub.id)
                    stack.append(sub.id)
    return found


@pytest.mark.parametrize("file", KERNEL_FILES)
def test_module_structure(file):
    """A kernel file holds a docstring, imports of torch (a class file also imports helpers from
    the shared files, operators from common) and documented top-level definitions, its classes
    autograd Functions (a kernel's own backward) but the registry of operators: the generator
    copies only definitions into a module that imports torch."""
    module = _kernel_file(file)
    source = inspect.getsource(module)
    tree = ast.parse(source)
    assert ast.get_docstring(tree), f"{file} lacks a module docstring"
    imports, public = set(), set()
    for node in tree.body[1:]:
        if isinstance(node, ast.Import):
            imports.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module.rsplit(".", 1)[-1] in CLASS_FILES:
            # a kernel made of other classes' kernels imports their public kernels
            owner = node.module.rsplit(".", 1)[-1]
            assert file in CLASS_FILES and owner != file, ast.unparse(node)
            names = {alias.name for alias in node.names}
            assert names <= {n for n, f in KERNELS.items() if f == owner}, ast.unparse(node)
        elif isinstance(node, ast.ImportFrom):
            # a class file imports from the shared files, operators from common
            assert node.module in SHARED and file not in ("common", node.module), ast.unparse(node)
            assert file in CLASS_FILES or SHARED[node.module] == "common", ast.unparse(node)
            shared = _top_level_definitions(SHARED[node.module])
            assert {alias.name for alias in node.names} <= set(shared), ast.unparse(node)
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            assert ast.get_docstring(node), f"{node.name} lacks a docstring"
            if isinstance(node, ast.ClassDef) and node.name != "_Operators":
                bases = [ast.unparse(b) for b in node.bases]
                assert bases == ["torch.autograd.Function"], node.name
            if not node.name.startswith("_"):
                public.add(node.name)
        else:
            raise AssertionError(f"{file}: not an import or a definition: {ast.unparse(node)}")
    assert imports <= {"math", "torch", "torch.nn.functional"}, imports
    assert ".item()" not in source
    assert public == {name for name, owner in KERNELS.items() if owner == file}


def test_public_kernels():
    """KERNELS lists every public kernel of the class files, and nothing else."""
    assert set(KERNELS) == set(PUBLIC)
    for name, file in KERNELS.items():
        assert callable(getattr(_kernel_file(file), name)), name


@pytest.mark.parametrize("name", PUBLIC)
def test_kernel_source_is_what_the_kernel_reaches(name):
    """kernel_source copies a kernel and exactly the helpers it reaches, each once, in the order
    of the kernel files (common first) and of each file."""
    funcs = _all_definitions()
    copied = [node.name for node in ast.parse(kernel_source([name])).body]
    assert set(copied) == {name} | _called_helpers(name, funcs)
    assert copied == [n for n in funcs if n in copied]


def test_kernel_source_of_several_kernels():
    """Several kernels share one copy of their helpers, whatever the order they are named in."""
    funcs = _all_definitions()
    names = ["chunk_delta", "parallel_scalar_decay"]
    source = kernel_source(names)
    assert kernel_source([*names[::-1], *names]) == source
    copied = [node.name for node in ast.parse(source).body]
    reached = {helper for name in names for helper in _called_helpers(name, funcs)}
    assert sorted(copied) == sorted({*names, *reached})


def test_kernel_source_rejects_unknown_names():
    with pytest.raises(ValueError, match="chunk_nothing"):
        kernel_source(["chunk_delta", "chunk_nothing"])


# each kernel's inputs (float64) for T tokens: its gates and optional inputs
KERNEL_INPUTS = {
    "chunk_scalar_decay": lambda t, seed: make_inputs(t, gate="g", seed=seed),
    "parallel_scalar_decay": lambda t, seed: make_inputs(t, gate="g", init=False, seed=seed),
    "chunk_scalar_decay_stable": lambda t, seed: make_inputs(
        t, gate="g", log_scale=True, seed=seed
    ),
    # one write a token here (k as wide as q); several: tests/backends/test_several_writes.py
    "chunk_scalar_decay_rank": lambda t, seed: make_inputs(t, gate="g", seed=seed),
    "chunk_diagonal": lambda t, seed: make_inputs(t, gate="gkgv", seed=seed),
    "chunk_delta": lambda t, seed: make_inputs(t, gate="g", delta=True, seed=seed),
    "chunk_elementwise": lambda t, seed: make_inputs(t, gate="full", seed=seed),
    "chunk_dplr": lambda t, seed: dplr_inputs(t, seed=seed),  # with its own per-channel gate
    "chunk_dplr_value": lambda t, seed: dplr_value_inputs(t, seed=seed),
}


def kernel_inputs(name, t_len, seed):
    """KERNEL_INPUTS[name] in fp32, with the keyword arguments the kernel takes."""
    inputs = {n: x.float() for n, x in KERNEL_INPUTS[name](t_len, seed).items()}
    return inputs, ({} if name == "parallel_scalar_decay" else {"chunk_size": 8})


@pytest.mark.parametrize("name", PUBLIC)
def test_copied_source_runs_standalone(name):
    """Mimic the generator: the kernel_source of one kernel, run in a fresh namespace, gives the
    same outputs, with and without autograd, and the same gradients, bit for bit."""
    header = "import math\nimport torch\nimport torch.nn.functional as F\n\n"
    namespace = {}
    exec(compile(header + kernel_source([name]), f"<generated {name}>", "exec"), namespace)
    inputs, kwargs = kernel_inputs(name, 20, seed=11)

    def results(kernel):
        with torch.no_grad():
            plain = kernel(**inputs, **kwargs)
        leaves = {n: x.clone().requires_grad_(True) for n, x in inputs.items()}
        tracked = kernel(**leaves, **kwargs)
        plain, tracked = (x if isinstance(x, tuple) else (x,) for x in (plain, tracked))
        grads = torch.autograd.grad(sum(o.sum() for o in tracked), list(leaves.values()))
        return [*plain, *tracked, *grads]

    got, want = results(namespace[name]), results(getattr(_kernel_file(KERNELS[name]), name))
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    "name",
    # the chunked kernels are captured by default inside the generated modules
    # (tests/backends/test_torch_compile.py), so alone with -m slow; the quadratic one here
    [n if n.startswith("parallel") else pytest.param(n, marks=pytest.mark.slow) for n in PUBLIC],
)
def test_torch_compile_fullgraph(name):
    """The kernels trace as one graph (forward and backward) under torch.compile."""
    import torch._dynamo

    torch._dynamo.reset()
    inputs, kwargs = kernel_inputs(name, 40, seed=12)
    fn = getattr(_kernel_file(KERNELS[name]), name)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    leaves = {n: x.clone().requires_grad_(True) for n, x in inputs.items()}
    out = compiled(**leaves, **kwargs)
    out = out if isinstance(out, tuple) else (out,)
    grads = torch.autograd.grad(sum(o.sum() for o in out), list(leaves.values()))
    ref = fn(**inputs, **kwargs)
    ref = ref if isinstance(ref, tuple) else (ref,)
    for a, b in zip(out, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert all(torch.isfinite(gr).all() for gr in grads)


@pytest.mark.parametrize("T", [1, 7, 40])
def test_the_stable_kernel_is_the_scaled_kernel_times_its_row_scales(T):
    """chunk_scalar_decay_stable(..., s) returns o exp(-m) and m, where o is chunk_scalar_decay's
    output for the values scaled by exp(s), and the same final state (float64, where exp(s)
    does not overflow); its largest row term is exp(0) = 1."""
    from mixc.backends.pytorch.kernels.scalar_decay import chunk_scalar_decay_stable

    x = make_inputs(T, log_scale=True, seed=3)
    scaled = {**x, "v": x["v"] * x["log_scale"].exp()[..., None]}
    del scaled["log_scale"]
    o, state = chunk_scalar_decay(**scaled, chunk_size=8)
    o_scaled, m, final = chunk_scalar_decay_stable(**x, chunk_size=8)
    torch.testing.assert_close(o_scaled * m.exp()[..., None], o, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(final, state, rtol=1e-12, atol=1e-12)
    assert (o_scaled.abs().amax() < 1e3) and torch.isfinite(m).all()
