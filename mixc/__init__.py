"""mixc: a compiler for sequence mixers with a matrix state.

>>> import mixc
>>> spec = mixc.load_spec("specs/deltanet.mix")  # a path; spec text is given as text=...
>>> module = mixc.load(text=spec.source.text)
"""

from mixc.analysis.plan import analyze
from mixc.driver import clear_cache, compile_source, load
from mixc.errors import MixcError, NotYetImplemented, Source, SpecError
from mixc.frontend.parser import parse
from mixc.frontend.spec import Spec, load_spec
from mixc.frontend.verify import verify
from mixc.version import __version__

__all__ = [
    "MixcError",
    "NotYetImplemented",
    "Source",
    "Spec",
    "SpecError",
    "__version__",
    "analyze",
    "clear_cache",
    "compile_source",
    "load",
    "load_spec",
    "parse",
    "verify",
]
