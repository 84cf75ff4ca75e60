"""Backends: a name, `supports(plan) -> reason | None` and `emit(plan) -> source`.

Backends are imported lazily, so one that needs an optional package costs nothing until used.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from mixc.errors import MixcError

#: Backend name -> module path. Each module defines NAME, supports(plan) and emit(plan); one
#: whose kernels differ by class also defines kernel_notes(plan), the lines `explain` prints.
REGISTRY = {"pytorch": "mixc.backends.pytorch", "triton": "mixc.backends.triton"}


def get(name: str) -> ModuleType:
    if name not in REGISTRY:
        raise MixcError(f"unknown backend {name!r}; available: {', '.join(sorted(REGISTRY))}")
    return importlib.import_module(REGISTRY[name])
