"""Test settings shared by every test module.

Hypothesis profiles: "ci" (the default) is derandomized and keeps no example database, so every
run, serial or split over pytest-xdist workers, tries the same examples; "dev" tries ten times as
many, with fresh randomness. Choose with HYPOTHESIS_PROFILE=dev.

Under pytest-xdist (`-n auto`, as the README's test command runs) each worker gets its share of
the machine's cores as torch threads (`tests.mixers.THREADS`), so that no worker's thread pool
starves another's.
"""

import os

# The Triton backend's tests run its kernels in triton's interpreter, which is chosen when triton
# is first imported (torch may import it too): so before any test module runs, and before torch.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
from hypothesis import settings

from tests.interpreter import speed_up_the_interpreter
from tests.mixers import THREADS

settings.register_profile("ci", deadline=None, derandomize=True, database=None, max_examples=200)
settings.register_profile("dev", deadline=None, max_examples=2000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
torch.set_num_threads(THREADS)
speed_up_the_interpreter()  # the same numbers, without two of its costs (tests/interpreter.py)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """Under pytest-xdist without a --dist of the caller's, runs the tests `--dist worksteal`:
    xdist's default (`load`) hands each worker a long run of tests in order up front, and one
    worker got most of the Triton interpreter's tests (a third of the test time) while the
    other sat idle at the end (on 2 cores: 690 s against 505 s balanced, simulated from one
    run's durations); a worker that runs out steals half of the other's queue instead."""
    if getattr(config.option, "numprocesses", None) and config.option.dist == "no":
        config.option.dist = "worksteal"
