"""What a request would allocate, checked against this machine's memory before anything is
allocated: a size that would need more than the machine has is a one-line MixcError naming
the option, not a failed allocation of terabytes (or an overflow inside torch)."""

from __future__ import annotations

import os

from mixc.errors import MixcError

__all__ = ["check_bytes", "device_memory", "gib", "machine_memory"]

#: Where the machine's memory cannot be read: 1 TiB.
_FALLBACK = 1 << 40


def machine_memory() -> int:
    """Bytes of physical memory of this machine (1 TiB where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return _FALLBACK


def device_memory(device: str = "cpu") -> int:
    """Bytes a run on `device` can hold: an accelerator's own memory where torch reports it,
    else this machine's."""
    if device != "cpu":
        try:
            import torch

            where = torch.device(device)
            if where.type == "cuda" and torch.cuda.is_available():
                return torch.cuda.get_device_properties(where).total_memory
        except (RuntimeError, ValueError, AssertionError):
            pass
    return machine_memory()


def gib(n: int | float) -> str:
    """Bytes for a message: `12.5 GiB`, or many TiB."""
    return f"{n / 2**30:,.1f} GiB" if n < 2**50 else f"{n / 2**40:,.3g} TiB"


def check_bytes(
    option: str, value, nbytes: int | float, what: str, limit: int | None = None
) -> None:
    """Refuse `nbytes` for `what` above `limit` (default: this machine's memory), naming
    `option` = `value`."""
    limit = machine_memory() if limit is None else limit
    if nbytes > limit:
        raise MixcError(
            f"{option}: {value} would need {gib(nbytes)} for {what}, more than this machine's "
            f"{gib(limit)} of memory"
        )
