"""Backends: objects of type `Backend` (mixc.backends.base), each rendering a lowered program.

`BACKENDS` names every backend; `get(name)` is the one `--backend name` asks for. Neither
backend imports torch or triton to render: their kernels are read as text.
"""

from __future__ import annotations

from mixc.backends.base import Backend
from mixc.backends.pytorch import BACKEND as PYTORCH
from mixc.backends.triton import BACKEND as TRITON
from mixc.errors import MixcError

__all__ = ["BACKENDS", "Backend", "get"]

BACKENDS: dict[str, Backend] = {b.name: b for b in (PYTORCH, TRITON)}


def get(name: str) -> Backend:
    if name not in BACKENDS:
        raise MixcError(f"unknown backend {name!r}; available: {', '.join(sorted(BACKENDS))}")
    return BACKENDS[name]
