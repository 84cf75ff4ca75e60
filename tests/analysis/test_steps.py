"""Several update steps per token (DeltaProduct): the composition is found by the algebra, however
it is spelled, and runs as sub-tokens of the class's kernel; each spelling's chunk, recurrent and
step forms agree with the float64 oracle (`mixc fuzz`), and a prefill with chunk then step equals
one pass."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mixc
from mixc import load_spec
from mixc.analysis.plan import analyze
from mixc.check import fuzz
from mixc.errors import NotYetImplemented

ROOT = Path(__file__).resolve().parents[2]

HEAD = "mixer dp\nin q[K], k1[K], v1[V], b1, k2[K], v2[V], b2{extra}\nstate H[V, K]\n"


def step(prev: str, n: int, decay: str = "") -> str:
    k = f"l2norm(k{n}_t)"
    return f"{decay}{prev} (I - 2 b{n}_t {k} {k}^T) + 2 b{n}_t v{n}_t {k}^T"


#: The same two steps a token, spelled in several ways, and a gated and a three-step version.
SPELLINGS = {
    "nested": HEAD.format(extra="") + f"H_t = ({step('H_{t-1}', 1)}) (I - 2 b2_t "
    "l2norm(k2_t) l2norm(k2_t)^T) + 2 b2_t v2_t l2norm(k2_t)^T\ny_t = H_t q_t\n",
    "through a value": HEAD.format(extra="")
    + f"U_t = {step('H_{t-1}', 1)}\nH_t = {step('U_t', 2)}\ny_t = H_t q_t\n",
    "outer step distributed": HEAD.format(extra="") + f"U_t = {step('H_{t-1}', 1)}\n"
    "H_t = U_t - 2 b2_t U_t l2norm(k2_t) l2norm(k2_t)^T + 2 b2_t v2_t l2norm(k2_t)^T\n"
    "y_t = H_t q_t\n",
    "gated first step": HEAD.format(extra=", g")
    + f"U_t = {step('H_{t-1}', 1, 'exp(g_t) ')}\nH_t = {step('U_t', 2)}\ny_t = H_t q_t\n",
    "three steps": HEAD.format(extra=", k3[K], v3[V], b3")
    + f"U_t = {step('H_{t-1}', 1)}\nW_t = {step('U_t', 2)}\nH_t = {step('W_t', 3)}\n"
    "y_t = H_t q_t\n",
}


@pytest.mark.parametrize("name", list(SPELLINGS))
def test_the_steps_are_found_and_run_as_sub_tokens(name):
    plan = analyze(load_spec(text=SPELLINGS[name]))
    (state,) = plan.states
    steps = state.transition.steps
    n = 3 if name == "three steps" else 2
    assert plan.chunkable and len(steps) == n
    assert [str(tr.args.beta) for tr in steps] == [f"2 b{i}_t" for i in range(1, n + 1)]
    assert [str(tr.args.key) for tr in steps] == [f"l2norm(k{i}_t)" for i in range(1, n + 1)]
    assert [str(w.value) for w in state.writes] == [f"v{i}_t" for i in range(1, n + 1)]
    gated = [bool(tr.gates) for tr in steps]
    assert gated == [name == "gated first step"] + [False] * (n - 1)
    (group,) = plan.groups
    assert group.kernel == "delta" and len(group.sub_tokens) == n
    assert f"{n} steps per token as sub-tokens" in state.transition.rule.matched


def test_steps_written_in_the_other_order_are_other_steps():
    spec = HEAD.format(extra="") + f"U_t = {step('H_{t-1}', 2)}\nH_t = {step('U_t', 1)}\n"
    plan = analyze(load_spec(text=spec + "y_t = H_t q_t\n"))
    assert [str(tr.args.key) for tr in plan.states[0].transition.steps] == [
        "l2norm(k2_t)",
        "l2norm(k1_t)",
    ]


def test_steps_of_a_class_without_sub_tokens_stay_recurrent():
    # a product of two general matrices per token: no class runs it chunked
    spec = (
        "mixer m\nin q[K], k[K], v[V], a[V, V]\nstate H[V, K]\n"
        "U_t = a_t H_{t-1} + v_t k_t^T\nH_t = a_t U_t + v_t k_t^T\ny_t = H_t q_t\n"
    )
    plan = analyze(load_spec(text=spec))
    assert not plan.chunkable and not plan.states[0].transition.steps


def test_reading_the_state_before_the_steps_is_a_located_nyi():
    spec = HEAD.format(extra="") + f"U_t = {step('H_{t-1}', 1)}\nH_t = {step('U_t', 2)}\n"
    with pytest.raises(NotYetImplemented) as err:
        analyze(load_spec(text=spec + "y_t = H_t q_t + H_{t-1} q_t\n"))
    message = str(err.value)
    assert "2 steps a token" in message and "H_{t-1}" in message and "<string>:6:" in message


@pytest.mark.parametrize("examples", [3, pytest.param(10, marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", ["nested", "gated first step", "three steps"])
def test_each_spelling_passes_the_fuzzer(name, examples, tmp_path):
    """Three drawn examples a spelling by default, ten with -m slow."""
    path = tmp_path / "dp.mix"
    path.write_text(SPELLINGS[name])
    report = fuzz(path, examples=examples)
    assert report.ok, report.failure.summary()


def test_prefill_with_chunk_then_step_equals_one_pass():
    module = mixc.load(ROOT / "specs" / "deltaproduct.mix")
    torch.manual_seed(0)
    B, T, NH, K, V = 2, 11, 2, 4, 3
    inputs = {
        "q": torch.randn(B, T, NH, K, dtype=torch.float64),
        "k1": torch.randn(B, T, NH, K, dtype=torch.float64),
        "v1": torch.randn(B, T, NH, V, dtype=torch.float64),
        "b1": torch.rand(B, T, NH, dtype=torch.float64),
        "k2": torch.randn(B, T, NH, K, dtype=torch.float64),
        "v2": torch.randn(B, T, NH, V, dtype=torch.float64),
        "b2": torch.rand(B, T, NH, dtype=torch.float64),
    }
    whole, final = module.recurrent(**inputs, output_final_state=True)
    cut = 7
    y, state = module.chunk(
        **{n: x[:, :cut] for n, x in inputs.items()}, output_final_state=True, chunk_size=4
    )
    ys = [y]
    for t in range(cut, T):
        y_t, state = module.step(**{n: x[:, t] for n, x in inputs.items()}, state=state)
        ys.append(y_t[:, None])
    torch.testing.assert_close(torch.cat(ys, 1), whole, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(state, final, rtol=1e-12, atol=1e-12)
