"""Several readouts of one state in one kernel pass (issue 31): a state read by several queries
at t, y1 = H_t q1_t and y2 = H_t q2_t, runs the class's queries kernel once with the queries
as m rows a token (the state passed from chunk to chunk once for them all), its outputs split
after. Checked against the float64 oracle (mixc fuzz), the kernel against a loop written out
here, and the cases that keep a pass a query (a read before the update, a folded write)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

import mixc
from mixc.backends.pytorch.kernels.scalar_decay import chunk_scalar_decay_rank
from mixc.check import fuzz
from mixc.lowering import dump, lower
from mixc.tools.explain import explain
from mixc.tools.render import render
from tests.mixers import rel

ROOT = Path(__file__).resolve().parents[2]
f64 = torch.float64


def _spec(inputs: str, update: str, out: str) -> str:
    return f"mixer variant\nin    {inputs}\nstate H[V, K]\nH_t = {update}\n{out}\n"


#: States read by two or three queries at t: one write a token, and writes joined.
STACKED = {
    "one write, two queries": _spec(
        "q[K], p[K], k[K], v[V], g", "exp(g_t) H_{t-1} + v_t k_t^T", "y_t = (H_t q_t) * (H_t p_t)"
    ),
    "no decay, two queries": _spec(
        "q[K], p[K], k[K], v[V]", "H_{t-1} + v_t k_t^T", "y_t = H_t q_t - 2 silu(H_t p_t)"
    ),
    "joined writes, three queries": _spec(
        "q[K], p[K], r[K], k[K], v[V], u[V], w[K], g",
        "exp(g_t) H_{t-1} + v_t k_t^T + u_t w_t^T + u_{t-1} k_{t-1}^T",
        "y_t = (H_t q_t) * (H_t p_t) + H_t r_t",
    ),
}


def _calls(text: str):
    return lower(mixc.analyze(mixc.load_spec(text=text))).calls


@pytest.mark.parametrize("name", list(STACKED))
def test_several_queries_run_one_pass_as_the_oracle_does(tmp_path, name):
    (call,) = _calls(STACKED[name])
    assert call.stacked and call.kernel == "chunk_scalar_decay_rank"
    assert len(call.queries) == 3 - ("three" not in name)
    path = tmp_path / "variant.mix"
    path.write_text(STACKED[name])
    report = fuzz(path, examples=5, seed=5)
    assert report.ok, report.failure.summary()
    assert "chunk" in report.worst


def test_the_lowering_and_explain_say_so_and_the_module_calls_the_kernel_once():
    text = STACKED["one write, two queries"]
    assert "2 queries in one pass" in dump(lower(mixc.analyze(mixc.load_spec(text=text))))
    out = io.StringIO()
    render(explain(mixc.load_spec(text=text)), file=out)
    assert "the 2 queries in one pass of the scalar_decay_rank kernel" in out.getvalue()
    source = mixc.compile_source(text=text)
    chunk = source[source.index("\ndef chunk(") : source.index("\ndef parallel(")]
    assert chunk.count("_chunk_scalar_decay_rank(") == 1


@pytest.mark.parametrize(
    "out",
    ["y_t = (H_t q_t) * (H_{t-1} p_t)", "y_t = H_t q_t"],
    ids=["a read before the update", "one query"],
)
def test_a_read_before_the_update_or_one_query_keeps_its_own_pass(out):
    (call,) = _calls(_spec("q[K], p[K], k[K], v[V], g", "exp(g_t) H_{t-1} + v_t k_t^T", out))
    assert not call.stacked


def test_a_folded_state_keeps_a_pass_a_query():
    # Mamba-3 SISO's lagged write folds (mixc.analysis.folds); its readouts are corrected one
    # by one, so the fold and the stacking do not combine
    calls = lower(mixc.analyze(mixc.load_spec(ROOT / "specs" / "mamba3.mix"))).calls
    assert not any(c.stacked for c in calls)


def _loop(queries, k, v, g, state):
    """S_t = exp(g_t) S_{t-1} + sum_r k_{t,r} v_{t,r}^T, o_{t,i} = q_{t,i} S_t, token by token."""
    outs = [[] for _ in queries]
    for t in range(k[0].shape[2]):
        decay = 1.0 if g is None else g[:, :, t].exp()[..., None, None]
        writes = sum(k_r[:, :, t, :, None] * v_r[:, :, t, None, :] for k_r, v_r in zip(k, v))
        state = decay * state + writes
        for o, q in zip(outs, queries):
            o.append((q[:, :, t, None, :] @ state)[:, :, 0])
    return [torch.stack(o, 2) for o in outs], state


@pytest.mark.parametrize("gated", [True, False], ids=["gated", "no decay"])
@pytest.mark.parametrize("chunk_size", [4, 16])
def test_the_kernel_with_several_queries_matches_a_loop(gated, chunk_size):
    gen = torch.Generator().manual_seed(2)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=f64).requires_grad_()

    B, NH, T, K, V = 2, 2, 11, 4, 3
    queries = [randn(B, NH, T, K) for _ in range(3)]
    k, v = [randn(B, NH, T, K) for _ in range(2)], [randn(B, NH, T, V) for _ in range(2)]
    g = (-torch.rand(B, NH, T, generator=gen, dtype=f64)).requires_grad_() if gated else None
    state = randn(B, NH, K, V)
    outs, final = chunk_scalar_decay_rank(queries, k, v, g, state, chunk_size=chunk_size)
    ref_outs, ref_final = _loop(queries, k, v, g, state)
    assert isinstance(outs, list) and len(outs) == 3
    for o, ref in zip(outs, ref_outs):
        assert rel(o, ref) < 1e-12
    assert rel(final, ref_final) < 1e-12
    weights = [torch.randn(o.shape, generator=gen, dtype=f64) for o in outs]
    w_final = torch.randn(final.shape, generator=gen, dtype=f64)
    inputs = [*queries, *k, *v, state, *([g] if gated else [])]

    def loss(os, s):
        return sum((o * w).sum() for o, w in zip(os, weights)) + (s * w_final).sum()

    grads = torch.autograd.grad(loss(outs, final), inputs)
    ref_grads = torch.autograd.grad(loss(ref_outs, ref_final), inputs)
    for d, ref in zip(grads, ref_grads):
        assert rel(d, ref) < 1e-11


def test_a_non_finite_value_reaches_no_earlier_output_of_any_query():
    gen = torch.Generator().manual_seed(4)
    B, NH, T, K, V = 1, 2, 13, 4, 3
    queries = [torch.randn(B, NH, T, K, generator=gen) for _ in range(2)]
    k, v = torch.randn(B, NH, T, K, generator=gen), torch.randn(B, NH, T, V, generator=gen)
    g = -torch.rand(B, NH, T, generator=gen)
    state = torch.randn(B, NH, K, V, generator=gen)
    clean, _ = chunk_scalar_decay_rank(queries, k, v, g, state, chunk_size=4)
    v[:, :, 6] = float("nan")
    poisoned, _ = chunk_scalar_decay_rank(queries, k, v, g, state, chunk_size=4)
    for o, ref in zip(poisoned, clean):
        assert torch.equal(o[:, :, :6], ref[:, :, :6])
        assert o[:, :, 6:].isnan().all()
