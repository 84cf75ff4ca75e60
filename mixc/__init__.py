"""mixc: a compiler for sequence mixers with a matrix state.

    >>> import mixc
    >>> spec = mixc.load_spec("specs/deltanet.mix")
"""

from ._frontend import Spec, load_spec
from ._parser import parse
from ._verify import verify
from .errors import MixcError, NotYetImplemented, SpecError

__version__ = "0.1.0"

__all__ = [
    "MixcError",
    "NotYetImplemented",
    "Spec",
    "SpecError",
    "__version__",
    "load_spec",
    "parse",
    "verify",
]
