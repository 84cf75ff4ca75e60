"""The Triton backend: a plan -> a standalone module that imports torch and triton, whose chunked
forms run fused Triton kernels where the class has one (see emitter.py)."""

from mixc.backends.triton.emitter import NAME, emit, kernel_notes, supports

__all__ = ["NAME", "emit", "kernel_notes", "supports"]
