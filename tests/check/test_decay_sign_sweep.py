"""The sweep of benchmarks/decay_sign_sweep.py as a slow test (issue 33, case 6): 1,000 random
specs over every transition form, and specs with decays of any sign, compiled and run chunk and
parallel against recurrent on N(0, 1) inputs. Every disagreement must be one that explain and
check announce (no chunked form, or the run-time sign check); any other is a failure, as is a
module that does not load. Minutes on two cores:

    python -m pytest tests/check/test_decay_sign_sweep.py -m slow
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "decay_sign_sweep.py"


def _sweep_module():
    spec = importlib.util.spec_from_file_location("decay_sign_sweep", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_no_unannounced_disagreement_over_random_specs() -> None:
    result = _sweep_module().sweep(n_random=1000)
    assert result["specs"] >= 1000
    failures = "\n\n".join(f"{detail}\n{text}" for text, detail in result["failures"][:5])
    assert not result["failures"], f"{len(result['failures'])} failures, the first:\n{failures}"
    assert result["outcomes"]["agree"] > result["specs"]  # most specs have chunk and parallel


def test_the_hostile_specs_of_the_sweep_are_all_announced() -> None:
    """The fast part: a third of the specs with decays of any sign (all of them in the slow
    test), one seed."""
    sweep = _sweep_module()
    for text in sweep.hostile_specs()[::3]:
        for outcome, detail in sweep.judge(text):
            assert outcome in ("agree", "refused", "no chunked form"), f"{detail}\n{text}"
