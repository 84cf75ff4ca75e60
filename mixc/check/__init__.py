"""Checking compiled modules against the float64 oracle, by stage.

- `ranges`: how to draw every argument (input ranges from the analysis' plan, stress modes);
- `sampling`: what to draw (examples, their tensors, any-size draws);
- `tolerance`: the oracle's result and how close a form must come to it;
- `forms`: every form of a module run on one example and measured;
- `contract`: the module under test (compiled, or a file) and what it must define;
- `fuzz`: the hypothesis search over examples;
- `reproducer`: the runnable script that replays a failure;
- `random_specs`: random valid specs, to fuzz the compiler itself;
- `command`: `mixc fuzz` on the command line.
"""

from mixc.check.command import run_command
from mixc.check.fuzz import Failure, Invalid, Report, Result, check, compare, fuzz, reference
from mixc.check.random_specs import GATE_FORMS, random_specs
from mixc.check.ranges import InputRanges, Range, decays_near_one, input_ranges
from mixc.check.reproducer import reproducer
from mixc.check.sampling import Example, draws, examples, make_case, sample_inputs, sample_states

__all__ = [
    "GATE_FORMS",
    "Example",
    "Failure",
    "InputRanges",
    "Invalid",
    "Range",
    "Report",
    "Result",
    "check",
    "compare",
    "decays_near_one",
    "draws",
    "examples",
    "fuzz",
    "input_ranges",
    "make_case",
    "random_specs",
    "reference",
    "reproducer",
    "run_command",
    "sample_inputs",
    "sample_states",
]
