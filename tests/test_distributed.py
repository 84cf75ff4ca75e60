"""Context parallelism on torch.distributed (gloo, CPU): 2 and 4 processes each hold a slice of
one sequence; outputs, the final state and gradients equal one process over the whole sequence,
for a scalar decay, a diagonal gate, the delta rule with a decay, a normaliser, elementwise
gates on a matrix state and on a vector state read entry by entry, value-side transitions (a
summary acting from the left), and pipelines (a state writing another's readouts, whose
summaries pass one state at a time), one of them reading a column."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).parent.parent
CASES = [
    "gated_retention",
    "gla",
    "gated_deltanet",
    "linear_attention_normalized",
    "mamba2",
    "mamba1",  # an elementwise gate: its summary acts as P * S_0 + F
    "hgrn",  # an elementwise gate on a vector state read entry by entry (a column)
    "kda",
    "stacked",  # a pipeline: H2 writes H1's readouts
    "reversed",  # the same, its states declared in the other order (SUMMARY_ORDER)
    "gsa",  # a value-side diagonal gate (Ks): its summary acts from the left, P @ S_0 + F
    "gated_oja",  # a value-side diagonal plus low rank: from the left too
    "precond_gdn",  # a pipeline whose first state is a column (A, read entry by entry)
    "two_sided",  # a pipeline whose first state is gated on both sides: acted on entry by entry
]
#: Specs of CASES given as text, not shipped.
TEXTS = {
    "reversed": "mixer reversed\nin    q[K], k[K], v[V], u[K], q2[K]\nstate H2[V, K], H1[V, K]\n"
    "H2_t = H2_{t-1} + (H1_t q_t) u_t^T\nH1_t = H1_{t-1} + v_t k_t^T\ny_t = H2_t q2_t\n",
    "two_sided": "mixer two_sided\nin q[K], k[K], v[V], a[K], b[V], u[K], q2[K]\n"
    "state H1[V, K], H2[V, K]\n"
    "H1_t = diag(sigmoid(b_t)) H1_{t-1} diag(sigmoid(a_t)) + v_t k_t^T\n"
    "H2_t = H2_{t-1} + (H1_t q_t) u_t^T\ny_t = H2_t q2_t\n",
    # value-side transitions with two writes a token (sub-tokens): summaries from the left
    "value_gate_2": "mixer value_gate_2\nin q[K], k[K], v[V], a[V], u[V], w[K]\n"
    "state H[V, K]\nH_t = diag(sigmoid(a_t)) H_{t-1} + v_t k_t^T + u_t w_t^T\ny_t = H_t q_t\n",
    "oja_2": "mixer oja_2\nin q[K], k[K], v[V], gv[V], beta, w[K]\nstate H[V, K]\n"
    "H_t = (I - beta_t l2norm(v_t) l2norm(v_t)^T) diag(exp(gv_t)) H_{t-1} "
    "+ beta_t l2norm(v_t) k_t^T + l2norm(v_t) w_t^T\ny_t = H_t q_t\n",
}


def _load(name):
    """(spec, module) of a case."""
    import mixc

    source = mixc.Source(TEXTS[name]) if name in TEXTS else ROOT / f"specs/{name}.mix"
    return mixc.load_spec(source), mixc.load(source)


T = 45


def _worker(rank, world, init_file, results):
    sys.path.insert(0, str(ROOT))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    from mixc.distributed import context_parallel
    from tests.mixers import positional, random_states, spec_inputs

    out = {}
    for name in CASES:
        spec, module = _load(name)
        inputs, params = spec_inputs(
            spec, B=2, T=T, NH=2, generator=torch.Generator().manual_seed(7)
        )
        states = random_states(spec, B=2, NH=2, generator=torch.Generator().manual_seed(8))
        init = tuple(states[s.name] for s in spec.mixer.states)
        bounds = [round(T * r / world) for r in range(world + 1)]
        lo, hi = bounds[rank], bounds[rank + 1]
        n = len(spec.mixer.inputs)
        full = positional(spec, inputs, params)
        local = [
            (a[:, lo:hi] if i < n else a).clone().requires_grad_(True) for i, a in enumerate(full)
        ]
        init_leaf = [s.clone().requires_grad_(True) for s in init]
        cp = context_parallel(module)
        y, final = cp(
            *local,
            initial_state=tuple(init_leaf) if len(init) > 1 else init_leaf[0],
            output_final_state=True,
            chunk_size=8,
        )
        final = final if isinstance(final, tuple) else (final,)
        cot = torch.randn(
            y.shape[0], T, *y.shape[2:], dtype=y.dtype, generator=torch.Generator().manual_seed(9)
        )[:, lo:hi]
        loss = (y * cot).sum()
        if rank == world - 1:  # the final state is replicated: put it in the loss on one rank
            loss = loss + sum((f * (i + 1)).sum() for i, f in enumerate(final))
        loss.backward()
        out[name] = {
            "y": y.detach(),
            "final": [f.detach() for f in final],
            "grads": [x.grad for x in local],
            "init_grads": [s.grad for s in init_leaf],
            "range": (lo, hi),
        }
    results[rank] = out
    dist.destroy_process_group()


def _reference(name):
    from tests.mixers import positional, random_states, spec_inputs

    spec, module = _load(name)
    inputs, params = spec_inputs(spec, B=2, T=T, NH=2, generator=torch.Generator().manual_seed(7))
    states = random_states(spec, B=2, NH=2, generator=torch.Generator().manual_seed(8))
    init = [states[s.name].clone().requires_grad_(True) for s in spec.mixer.states]
    full = [a.clone().requires_grad_(True) for a in positional(spec, inputs, params)]
    y, final = module.recurrent(
        *full, initial_state=tuple(init) if len(init) > 1 else init[0], output_final_state=True
    )
    final = final if isinstance(final, tuple) else (final,)
    cot = torch.randn(*y.shape, dtype=y.dtype, generator=torch.Generator().manual_seed(9))
    ((y * cot).sum() + sum((f * (i + 1)).sum() for i, f in enumerate(final))).backward()
    return (
        y.detach(),
        [f.detach() for f in final],
        [x.grad for x in full],
        [s.grad for s in init],
        len(spec.mixer.inputs),
    )


# four ranks: a summary passes through middle ranks too; two ranks (only a first and a last) with
# -m slow
@pytest.mark.parametrize("world", [pytest.param(2, marks=pytest.mark.slow), 4])
def test_context_parallel_matches_one_process(world):
    from tests.mixers import rel

    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp, ctx.Manager() as manager:
        results = manager.dict()
        init_file = os.path.join(tmp, "rendezvous")
        procs = [
            ctx.Process(target=_worker, args=(r, world, init_file, results)) for r in range(world)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=300)
        for p in procs:
            if p.is_alive():  # a hung collective must fail the test, not hang the run
                p.terminate()
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
        results = dict(results)
    for name in CASES:
        y_ref, final_ref, grads_ref, init_grads_ref, n = _reference(name)
        y = torch.cat([results[r][name]["y"] for r in range(world)], 1)
        assert rel(y, y_ref) <= 1e-12, name
        for r in range(world):
            for got, want in zip(results[r][name]["final"], final_ref):
                assert rel(got, want) <= 1e-12, (name, r)
        for i in range(n):
            g = torch.cat([results[r][name]["grads"][i] for r in range(world)], 1)
            assert rel(g, grads_ref[i]) <= 1e-10, (name, i)
        for i in range(n, len(grads_ref)):  # parameters: each rank holds part of the gradient
            g = sum(results[r][name]["grads"][i] for r in range(world))
            assert rel(g, grads_ref[i]) <= 1e-10, (name, "param", i)
        for j, want in enumerate(init_grads_ref):
            g = sum(results[r][name]["init_grads"][j] for r in range(world))
            assert rel(g, want) <= 1e-10, (name, "initial state")


@pytest.mark.parametrize(
    "name",
    [
        "stacked",
        "gsa",
        "gated_oja",
        "precond_gdn",
        "two_sided",
        "ema",
        "hgrn",
        "value_gate_2",
        "oja_2",
    ],
)
def test_a_summary_is_each_states_action_given_the_earlier_states(name):
    """One process: the summary, started from the earlier states' values at the slice's start
    (a pipeline's), gives each state's final state (from the recurrent form) for any start of
    its own, P and F at once, P acting as SUMMARY_ACTIONS says: S_0 P, from the left (a
    value-side transition: gsa's Ks, gated_oja), or entry by entry (a column: precond_gdn's A,
    ema; gates on both sides; hgrn's elementwise gate)."""
    import inspect

    from tests.mixers import positional, random_states, rel, spec_inputs

    spec, module = _load(name)
    inputs, params = spec_inputs(spec, B=2, T=37, NH=2, generator=torch.Generator().manual_seed(1))
    args = positional(spec, inputs, params)
    names = [s.name for s in spec.mixer.states]
    act = {
        "matmul": lambda s, P: s @ P if s.dim() == 4 else (s[..., None, :] @ P)[..., 0, :],
        "left": lambda s, P: P @ s,
        "elementwise": lambda s, P: P * s,
    }
    pipeline = "initial_state" in inspect.signature(module.summary).parameters
    assert pipeline == (name in ("stacked", "precond_gdn", "two_sided"))
    for seed in (2, 3):
        states = random_states(spec, B=2, NH=2, generator=torch.Generator().manual_seed(seed))
        start = tuple(states[n] for n in names)
        one = start if len(start) > 1 else start[0]
        _, finals = module.recurrent(*args, initial_state=one, output_final_state=True)
        # a state's own start is not read: the later states' are zeros here
        given = {"initial_state": (start[0], *map(torch.zeros_like, start[1:]))} if pipeline else {}
        Ps, Fs = module.summary(*args, chunk_size=8, **given)
        tupled = isinstance(finals, tuple)
        Ps, Fs, finals = (Ps, Fs, finals) if tupled else ((Ps,), (Fs,), (finals,))
        for n, s, P, F, final in zip(names, start, Ps, Fs, finals, strict=True):
            assert rel(act[module.SUMMARY_ACTIONS[n]](s, P) + F, final) <= 1e-12, (name, n)


SQUASH = "mixer squash\nin q[K], k[K], v[V]\nstate H[V, K]\nH_t = tanh(H_{t-1}) + v_t k_t^T\ny_t = H_t q_t\n"


def test_sequential_only_spec_is_refused():
    import mixc
    from mixc.distributed import context_parallel

    with pytest.raises(mixc.MixcError, match="context parallelism needs a chunked form"):
        context_parallel(mixc.load(text=SQUASH))
