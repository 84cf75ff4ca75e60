"""The PyTorch backend: a plan -> a standalone module that imports only torch."""

from mixc.backends.pytorch.emitter import NAME, emit, supports

__all__ = ["NAME", "emit", "supports"]
