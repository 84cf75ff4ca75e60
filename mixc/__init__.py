"""mixc: a compiler for sequence mixers with a matrix state.

>>> import mixc
>>> spec = mixc.load_spec("specs/deltanet.mix")
"""

__version__ = "0.1.0"

from ._compile import compile_source, load
from ._frontend import Spec, load_spec
from ._parser import parse
from ._verify import verify
from .analysis import analyze
from .errors import MixcError, NotYetImplemented, SpecError

__all__ = [
    "MixcError",
    "NotYetImplemented",
    "Spec",
    "SpecError",
    "__version__",
    "analyze",
    "compile_source",
    "load",
    "load_spec",
    "parse",
    "verify",
]
