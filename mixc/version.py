"""The version of mixc (its own module, so the backends need not import the package)."""

__version__ = "0.1.0"
