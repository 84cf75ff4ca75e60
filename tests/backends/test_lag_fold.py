"""A lagged write under the token's decay folded into the previous token's own write
(mixc.analysis.folds, issue 31): which states fold, and that the folded chunked form computes
what the float64 oracle does (outputs, final states and gradients, packed sequences and a
prefill continued by steps included)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mixc
from mixc.check import fuzz
from mixc.lowering import dump, lower

ROOT = Path(__file__).resolve().parents[2]


def _variant(
    update: str, out: str = "y_t = H_t q_t", inputs: str = "q[K], k[K], v[V], g, c"
) -> str:
    return f"mixer variant\nin    {inputs}\nstate H[V, K]\nH_t = {update}\n{out}\n"


#: Updates whose lagged write carries the decay (folded), by class.
FOLDED = {
    "scalar decay": _variant(
        "exp(g_t) H_{t-1} + sigmoid(c_t) exp(g_t) v_{t-1} k_{t-1}^T + v_t k_t^T"
    ),
    "no decay": _variant("H_{t-1} + 0.5 v_{t-1} k_{t-1}^T + c_t v_t k_t^T"),
    "constant decay": "mixer variant\nin    q[K], k[K], v[V], c\nparam gamma = 0.9\n"
    "state H[V, K]\nH_t = gamma H_{t-1} + gamma c_t v_{t-1} k_{t-1}^T + v_t k_t^T\n"
    "y_t = H_t q_t\n",
}

#: Two writes that do not fold (joined instead): the lagged scale lacks the decay, or the
#: writes are not one token apart.
JOINED = {
    "scale without the decay": _variant("exp(g_t) H_{t-1} + c_t v_{t-1} k_{t-1}^T + v_t k_t^T"),
    "another key": _variant("exp(g_t) H_{t-1} + exp(g_t) v_{t-1} q_{t-1}^T + v_t k_t^T"),
}


def _chunk_line(text: str) -> str:
    program = dump(lower(mixc.analyze(mixc.load_spec(text=text))))
    return next(line for line in program.splitlines() if line.startswith("  H: chunk_"))


@pytest.mark.parametrize("name", FOLDED)
def test_a_lagged_write_under_the_decay_folds(name):
    assert "chunk_scalar_decay from" in _chunk_line(FOLDED[name])
    assert "the lagged write folded" in _chunk_line(FOLDED[name])


@pytest.mark.parametrize("name", JOINED)
def test_other_writes_stay_joined(name):
    assert "chunk_scalar_decay_rank" in _chunk_line(JOINED[name])


@pytest.mark.parametrize("spec", ["mamba3", "mamba3_trapezoid"])
def test_the_shipped_trapezoids_fold(spec):
    text = (ROOT / "specs" / f"{spec}.mix").read_text()
    assert "the lagged write folded" in _chunk_line(text)


@pytest.mark.parametrize("name", [*FOLDED, *JOINED])
def test_folded_and_joined_agree_with_the_oracle(tmp_path, name):
    path = tmp_path / "variant.mix"
    path.write_text({**FOLDED, **JOINED}[name])
    report = fuzz(path, examples=15, seed=3)
    assert report.ok, report.failure.summary()


def test_a_prefill_in_pieces_continues_as_one_pass():
    """The folded write reads the carried token at each call's first token: two calls carrying
    the state, then steps, give one call's outputs and final state (float64)."""
    module = mixc.load(ROOT / "specs" / "mamba3.mix")
    g = torch.Generator().manual_seed(0)
    B, T, NH, P, N, R = 2, 23, 2, 3, 8, 2
    f64 = torch.float64

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=f64)

    sp = torch.nn.functional.softplus
    args = [r(B, T, NH, P), r(B, T, NH, P), sp(r(B, T, NH)), sp(r(B, T, NH)), r(B, T, NH, N)]
    args += [r(B, T, NH, N), r(B, T, NH), r(B, T, NH, R)]
    params = [r(NH), r(NH, N), r(NH, N)]
    whole, final = module.chunk(*args, *params, output_final_state=True, chunk_size=4)
    first = [a[:, :11] for a in args]
    y1, state = module.chunk(*first, *params, output_final_state=True, chunk_size=4)
    second = [a[:, 11:20] for a in args]
    y2, state = module.chunk(*second, *params, initial_state=state, output_final_state=True)
    ys = [y1, y2]
    for t in range(20, T):
        y, state = module.step(*[a[:, t] for a in args], *params, state=state)
        ys.append(y[:, None])
    torch.testing.assert_close(torch.cat(ys, 1), whole, rtol=1e-10, atol=1e-12)
    for got, want in zip(state, final, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("spec", ["mamba3", "mamba3_trapezoid"])
def test_a_library_without_the_strict_read_folds_as_the_oracle_does(spec):
    """The Triton library's scalar-decay kernel reads the state after the token's update only:
    a folded call then reads G_{t-1} q_t as the kernel's inclusive read one token later, moved
    back (it once read G_t q_t, 0.34 off the oracle at T = 1)."""
    pytest.importorskip("triton")
    report = fuzz(ROOT / "specs" / f"{spec}.mix", backend="triton", examples=2, seed=0, max_T=12)
    assert report.ok, report.failure.summary()
