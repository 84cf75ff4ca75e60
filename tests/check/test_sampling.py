"""`mixc.check.sampling` at any size: `sample_inputs` and `sample_states` draw what the fuzzer
draws, in the compiled module's order and layout; `decays_near_one` keeps every decay near 1;
the quickstart example, which draws from it, gets finite, agreeing forms for every spec."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

import mixc
from mixc.algebra.intervals import bounds
from mixc.check import (
    Example,
    decays_near_one,
    input_ranges,
    make_case,
    sample_inputs,
    sample_states,
)
from mixc.cli import main as cli_main
from mixc.frontend.ir import CHANNEL

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted((ROOT / "specs").glob("*.mix"))
SIZES = {"K": 5, "V": 3, "P": 3, "N": 5, "S": 4, "M": 4, "R": 2}


def _example(r, batch: int, heads: int, T: int, seed: int, modes=()) -> Example:
    sizes = tuple((s, SIZES[s]) for s in r.symbols)
    return Example(batch, heads, T, sizes, (), True, (), tuple(modes), False, seed)


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_sample_inputs_are_the_fuzzers_draws_in_argument_order(path: Path) -> None:
    r = input_ranges(path)
    modes = decays_near_one(r)
    got = sample_inputs(path, SIZES, 9, batch=2, heads=3, dtype=torch.float64, seed=11, modes=modes)
    case = make_case(r, _example(r, 2, 3, 9, 11, modes.items()))
    want = [case.inputs[n] for n in r.inputs] + [case.params[n] for n in r.params]
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape and torch.equal(a, b)
    module = mixc.load(path)
    assert [n for n, _ in module.INPUTS] + [n for n, _ in module.PARAMS] == [
        *r.inputs,
        *r.params,
    ]


def test_sample_inputs_layout_dtype_and_shared_heads() -> None:
    path = ROOT / "specs/mamba2.mix"
    x, dt, B, C, A, D = sample_inputs(
        path, SIZES, 7, batch=2, heads=4, dtype=torch.bfloat16, input_heads={"B": 2, "C": 1}
    )
    assert x.shape == (2, 7, 4, 3) and dt.shape == (2, 7, 4)
    assert B.shape == (2, 7, 2, 5) and C.shape == (2, 7, 1, 5)
    assert A.shape == (4,) and D.shape == (4,)
    assert all(t.dtype == torch.bfloat16 for t in (x, dt, B, C, A, D))
    assert (dt > 0).all() and (A < 0).all()


def test_sample_states_positive_denominator() -> None:
    path = ROOT / "specs/linear_attention_normalized.mix"
    H, z = sample_states(path, {"K": 5, "V": 3}, batch=2, heads=3, seed=4)
    assert H.shape == (2, 3, 3, 5) and z.shape == (2, 3, 5)
    assert (z >= 0).all() and (H < 0).any()


@pytest.mark.parametrize(
    "spec, modes",
    [
        ("gla", {"g": "tiny"}),
        ("gated_deltanet", {"g": "tiny"}),
        ("gated_retention", {"a": "high"}),
        ("mamba2", {"dt": "tiny", "A": "tiny"}),
        ("gated_general", {"G": "near 1"}),
        ("deltanet", {}),
        ("retnet", {}),
    ],
)
def test_decays_near_one_by_the_facts(spec: str, modes: dict[str, str]) -> None:
    assert decays_near_one(input_ranges(ROOT / "specs" / f"{spec}.mix")) == modes


def test_decays_near_one_follows_the_direction_of_the_gate() -> None:
    """A decay written 1 - sigmoid(a) is near 1 for a low a, not a high one."""
    text = (
        "mixer m\nin q[K], k[K], v[V], a\nstate H[V, K]\n"
        "H_t = (1 - sigmoid(a_t)) H_{t-1} + v_t k_t^T\ny_t = H_t q_t\n"
    )
    assert decays_near_one(input_ranges(mixc.load_spec(text=text))) == {"a": "low"}


#: Specs whose gates the sampler cannot draw near 1, each a strict xfail with its reason.
NOT_NEAR_ONE: dict[str, str] = {}


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(
            p,
            id=p.stem,
            marks=[pytest.mark.xfail(reason=NOT_NEAR_ONE[p.stem], strict=True)]
            if p.stem in NOT_NEAR_ONE
            else [],
        )
        for p in SPECS
    ],
)
def test_decays_near_one_are_near_one(path: Path) -> None:
    r = input_ranges(path)
    args = sample_inputs(path, SIZES, 64, heads=2, modes=decays_near_one(r), seed=3)
    env = {
        n: (x.double().min().item(), x.double().max().item())
        for n, x in zip((*r.inputs, *r.params), args, strict=True)
    }
    # a default may read the sizes drawn and a channel index below the largest of them
    env |= {s: (float(n), float(n)) for s, n in SIZES.items()}
    env[CHANNEL] = (0.0, max(SIZES.values()) - 1.0)
    defaults = {p.name: p.default for p in r.mixer.params if p.default is not None}
    for s in r.plan.states:
        # each log-gate (<= 0) within 0.5 of 0, each elementwise gate (in [0, 1]) of 1
        for c in s.transition.transition_class.decay_conditions(s.name, s.transition):
            assert bounds(c.expr, env, defaults)[0] > c.hi - 0.5, (path.stem, c.why)


#: The quickstart by default with one spec of each kind of module: a quadratic form too, the
#: README's spec, the elementwise class, DPLR; every shipped spec with -m slow.
QUICKSTART = {"linear_attention", "gated_deltanet", "mamba1", "rwkv7"}


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(p, id=p.stem, marks=() if p.stem in QUICKSTART else pytest.mark.slow)
        for p in SPECS
    ],
)
def test_quickstart_prints_finite_agreeing_forms(path: Path, tmp_path: Path, capsys) -> None:
    import importlib.util

    module = tmp_path / f"{path.stem}.py"
    assert cli_main(["compile", str(path), "-o", str(module)]) == 0
    loader = importlib.util.spec_from_file_location("quickstart", ROOT / "examples/quickstart.py")
    quickstart = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(quickstart)
    capsys.readouterr()
    quickstart.main(str(module))
    out = capsys.readouterr().out
    errors = [float(e) for e in re.findall(r"relative error (\S+)", out)]
    forms = mixc.load(path).FORMS
    assert len(errors) == ("chunk" in forms) + ("step" in forms), out
    assert all(math.isfinite(e) and e < 1e-4 for e in errors), out
