"""Hypothesis profiles: "ci" (the default) is derandomized, so every run tries the same examples;
"dev" tries ten times as many, with fresh randomness. Choose with HYPOTHESIS_PROFILE=dev."""

import os

from hypothesis import settings

# The Triton backend's tests run its kernels in triton's interpreter, which is chosen when triton
# is first imported (torch may import it too): so before any test module runs.
os.environ.setdefault("TRITON_INTERPRET", "1")

settings.register_profile("ci", deadline=None, derandomize=True, database=None, max_examples=200)
settings.register_profile("dev", deadline=None, max_examples=2000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
