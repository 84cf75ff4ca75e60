"""Several rank-1 writes a token into one state (issue 30): every chunkable class runs them, as
sub-tokens of its kernel (the transition on the first, steps that only write after it) or, where
the class has a joined kernel (the scalar decay), joined along the key and value axes. Checked
against the float64 oracle, and the joined kernel against a loop written out here."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

import mixc
from mixc.backends.pytorch.kernels.scalar_decay import chunk_scalar_decay_rank
from mixc.check import fuzz
from mixc.lowering import dump, lower
from mixc.oracle.interpret import interpret
from mixc.tools.explain import explain
from mixc.tools.render import render
from tests.mixers import positional, random_states, rel, spec_inputs

ROOT = Path(__file__).resolve().parents[2]
f64 = torch.float64


def _variant(inputs: str, update: str, out: str = "y_t = H_t q_t", extra: str = "") -> str:
    return f"mixer variant\nin    {inputs}\n{extra}state H[V, K]\nH_t = {update}\n{out}\n"


#: One update a class, each with two or three writes a token (inputs at t-1 among them).
CLASSES = {
    "identity, a shifted write": _variant(
        "q[K], k[K], v[V]", "H_{t-1} + v_t k_t^T + 0.5 v_{t-1} k_{t-1}^T"
    ),
    "scalar decay, three writes": _variant(
        "q[K], k[K], v[V], u[V], w[K], g",
        "exp(g_t) H_{t-1} + v_t k_t^T + u_t w_t^T + u_{t-1} k_{t-1}^T",
    ),
    "diagonal": _variant(
        "q[K], k[K], v[V], u[V], w[K], g[K]", "H_{t-1} diag(exp(g_t)) + v_t k_t^T + u_t w_t^T"
    ),
    "delta rule, the erase's write second": _variant(
        "q[K], k[K], v[V], u[V], w[K], g, beta",
        "exp(g_t) H_{t-1} (I - beta_t l2norm(k_t) l2norm(k_t)^T) + u_t w_t^T"
        " + beta_t v_t l2norm(k_t)^T",
    ),
    "diagonal plus low rank": _variant(
        "q[K], k[K], v[V], u[V], w[K], g[K], a[K]",
        "H_{t-1} (diag(exp(-exp(g_t))) - l2norm(a_t) (l2norm(a_t) * sigmoid(g_t))^T)"
        " + v_t k_t^T + u_t w_t^T",
    ),
    "elementwise gate": _variant(
        "q[K], k[K], v[V], u[V], w[K], dt",
        "exp(dt_t * A) ⊙ H_{t-1} + v_t k_t^T + dt_t u_t w_t^T",
        extra="param A[V, K]\n",
    ),
}


@pytest.mark.parametrize("name", list(CLASSES))
def test_every_class_chunks_several_writes_as_the_oracle_does(tmp_path, name):
    path = tmp_path / "variant.mix"
    path.write_text(CLASSES[name])
    report = fuzz(path, examples=5, seed=3)
    assert report.ok, report.failure.summary()
    assert "chunk" in report.worst


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
@pytest.mark.parametrize(
    "source", [*CLASSES.values(), "mamba3_trapezoid", "gla_rank2"], ids=[*CLASSES, "m3", "gla2"]
)
def test_several_writes_wide(tmp_path, source, dtype):
    path = ROOT / "specs" / f"{source}.mix"
    if "\n" in source:
        path = tmp_path / "variant.mix"
        path.write_text(source)
    report = fuzz(path, examples=60, seed=11, dtype=dtype)
    assert report.ok, report.failure.summary()


def test_the_scalar_decay_joins_its_writes_and_other_classes_interleave_them():
    """The registry decides (TransitionClass.joined_kernel); the parallel form and the summary
    run sub-tokens in every class."""
    three = dump(lower(mixc.analyze(mixc.load_spec(text=CLASSES["scalar decay, three writes"]))))
    assert "H: chunk_scalar_decay_rank from the carried states, 3 writes a token joined" in three
    assert "H: parallel_scalar_decay from zero, 3 sub-tokens a token" in three
    gla = dump(lower(mixc.analyze(mixc.load_spec(ROOT / "specs" / "gla_rank2.mix"))))
    assert "H: chunk_diagonal from the carried states, 2 sub-tokens a token" in gla


def test_explain_names_the_writes_and_gives_no_split_hint():
    out = io.StringIO()
    render(explain(mixc.load_spec(text=CLASSES["scalar decay, three writes"])), file=out)
    assert "3 writes a token joined, the transition once" in out.getvalue()
    assert "chunked: the 3 writes joined, K = [K_1 ... K_3]" in out.getvalue()
    assert "split" not in out.getvalue()


def _loop(q, k, v, g, state, rank):
    """S_t = exp(g_t) S_{t-1} + sum_r k_{t,r} v_{t,r}^T, o_t = q_t S_t: one token, one write at a
    time, the writes laid side by side along the last axis."""
    K, V = q.shape[-1], v.shape[-1] // rank
    outs = []
    for t in range(q.shape[2]):
        if g is not None:
            state = torch.exp(g[:, :, t])[..., None, None] * state
        for r in range(rank):
            key, value = k[:, :, t, r * K : (r + 1) * K], v[:, :, t, r * V : (r + 1) * V]
            state = state + key[..., :, None] * value[..., None, :]
        outs.append((q[:, :, t, :, None] * state).sum(-2))
    return torch.stack(outs, 2), state


@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("chunk_size", [4, 16])
@pytest.mark.parametrize("rank, listed", [(3, False), (2, True), (3, True)])
def test_the_joined_kernel_matches_a_loop(gated, chunk_size, rank, listed):
    """The writes joined along the last axis, or given as lists of one key and one value a
    write (as generated code passes them; more than two are joined by the kernel)."""
    gen = torch.Generator().manual_seed(2)
    B, NH, T, K, V = 2, 3, 19, 5, 4

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=f64).requires_grad_()

    q, k, v = randn(B, NH, T, K), randn(B, NH, T, rank * K), randn(B, NH, T, rank * V)
    g = (-torch.rand(B, NH, T, generator=gen, dtype=f64)).requires_grad_() if gated else None
    S0 = randn(B, NH, K, V)
    keys, values = (k.split(K, -1), v.split(V, -1)) if listed else (k, v)
    o, S = chunk_scalar_decay_rank(q, keys, values, g, S0, chunk_size)
    o_ref, S_ref = _loop(q, k, v, g, S0, rank)
    assert rel(o, o_ref) <= 1e-12 and rel(S, S_ref) <= 1e-12
    leaves = [x for x in (q, k, v, g, S0) if x is not None]
    do, dS = torch.randn_like(o), torch.randn_like(S)
    got = torch.autograd.grad((o * do).sum() + (S * dS).sum(), leaves)
    want = torch.autograd.grad((o_ref * do).sum() + (S_ref * dS).sum(), leaves)
    for a, b in zip(got, want, strict=True):
        assert rel(a, b) <= 1e-12


def test_packed_sequences_shift_within_each_sequence_as_the_oracle_does():
    """The trapezoid's x_{t-1} and B_{t-1} in a packed batch: each sequence starts from its own
    carried token, never from the previous sequence's last one."""
    path = ROOT / "specs" / "mamba3_trapezoid.mix"
    spec, module = mixc.load_spec(path), mixc.load(path)
    lengths = [7, 1, 12, 3]
    gen = torch.Generator().manual_seed(4)
    pieces = [spec_inputs(spec, B=1, T=n, NH=2, generator=gen) for n in lengths]
    params = pieces[0][1]
    states = [random_states(spec, B=1, NH=2, generator=gen) for _ in lengths]
    packed = {name: torch.cat([p[0][name] for p in pieces], 1) for name in pieces[0][0]}
    init = tuple(torch.cat([s[c.name] for s in states]) for c in spec.mixer.carried)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    y, final = module.chunk(
        *positional(spec, packed, params),
        initial_state=init,
        output_final_state=True,
        chunk_size=4,
        cu_seqlens=cu,
    )
    outs = [interpret(spec, p[0], params, s) for p, s in zip(pieces, states, strict=True)]
    assert rel(y, torch.cat([o["y"] for o, _ in outs], 1)) <= 1e-12
    for i, c in enumerate(spec.mixer.carried):
        assert rel(final[i], torch.cat([f[c.name] for _, f in outs])) <= 1e-12, c.name


@pytest.mark.parametrize("name", ["diagonal", "delta rule, the erase's write second"])
def test_the_summary_acts_on_a_state_as_the_recurrence_does(name):
    """Context parallelism: a slice's summary (P, F) takes any state H_0 to H_0 P + F, the final
    state of the recurrence from H_0 (which the oracle checks above)."""
    source = mixc.Source(CLASSES[name])
    spec, module = mixc.load_spec(source), mixc.load(source)
    gen = torch.Generator().manual_seed(8)
    inputs, params = spec_inputs(spec, B=2, T=13, NH=2, generator=gen)
    H0 = random_states(spec, B=2, NH=2, generator=gen)["H"]
    args = positional(spec, inputs, params)
    P, F = module.summary(*args, chunk_size=4)
    _, H = module.recurrent(*args, initial_state=H0, output_final_state=True)
    assert rel(H0 @ P + F, H) <= 1e-12
