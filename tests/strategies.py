"""Hypothesis strategies for random well-formed mixc IR.

The IR is syntactically valid (every name lexes as one NAME, numbers are in the parser's canonical
form) but need not type-check: it is for round trips through the printer and the parser.
"""

import math

from hypothesis import strategies as st

from mixc.frontend.ir import (
    BINARY_OPS,
    Binary,
    Call,
    Decl,
    Equation,
    Identity,
    LetFn,
    Mixer,
    Name,
    Neg,
    Number,
    Param,
    Timed,
    Transpose,
)
from mixc.frontend.verify import RESERVED

KEYWORDS = {"mixer", "in", "param", "state", "let"}
_ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def _valid(name: str) -> bool:
    # `I` is the identity; a last segment `_t` would read as a time index
    return name not in RESERVED and name not in KEYWORDS and not name.endswith("_t")


# A letter, then letters and digits, then `_segment`s. Names that trip printers up (T, which
# follows ^ in a transpose; e, which follows a number in 1e5; a name ending in _t) come often.
_generated = st.builds(
    lambda first, rest, segments: first + rest + "".join("_" + s for s in segments),
    st.sampled_from(_ALNUM[:52]),
    st.text(_ALNUM, max_size=4),
    st.lists(st.text(_ALNUM, min_size=1, max_size=3), max_size=2),
)
names = st.one_of(st.sampled_from(["T", "e", "E", "x", "q_t2", "a_t_b", "Tx", "e5"]), _generated)
names = names.filter(_valid)

_ints = st.integers(min_value=0, max_value=10**30).map(str)
_floats = st.floats(min_value=0.0, allow_nan=False, allow_infinity=False)
_floats = _floats.filter(lambda x: math.copysign(1.0, x) > 0).map(repr)
numbers = st.builds(Number, st.one_of(_ints, _floats))

leaves = st.one_of(
    numbers,
    st.builds(Name, names),
    st.builds(Timed, names, st.integers(min_value=-3, max_value=3)),
    st.just(Identity()),
)


def _extend(children):
    return st.one_of(
        st.builds(Neg, children),
        st.builds(Transpose, children),
        st.builds(Binary, st.sampled_from(BINARY_OPS), children, children),
        st.builds(Call, names, st.lists(children, min_size=1, max_size=3).map(tuple)),
    )


exprs = st.recursive(leaves, _extend, max_leaves=12)

sizes = st.one_of(names, st.integers(min_value=1, max_value=4096).map(str))
shapes = st.lists(sizes, max_size=2).map(tuple)
decls = st.builds(Decl, names, shapes)
params = st.builds(Param, names, shapes, st.none() | exprs)
lets = st.builds(LetFn, names, st.lists(names, min_size=1, max_size=3).map(tuple), exprs)
equations = st.builds(Equation, names, exprs)

# A description is one line between double quotes: no quote, no line break, no control character.
descriptions = st.text(
    st.characters(exclude_characters='"\n', exclude_categories=("Cc", "Cs")), max_size=20
)


def _tuples(strategy, max_size=3):
    return st.lists(strategy, max_size=max_size).map(tuple)


mixers = st.builds(
    Mixer,
    names,
    st.none() | descriptions,
    _tuples(decls),
    _tuples(params),
    _tuples(decls),
    _tuples(lets),
    _tuples(equations, 4),
)


# Mixers over a few names that clash and refer to each other, as in real specs: inputs, states,
# values, parameters, lets and sizes share one small pool. Most do not verify; the verifier must
# say why with a SpecError, whatever they contain.
_pool = st.sampled_from(["q", "k", "v", "H", "z", "y", "g", "f", "x", "A", "K", "h", "I"])
_small_leaves = st.one_of(
    st.builds(Number, st.sampled_from(["0", "1", "0.5"])),
    st.builds(Name, _pool),
    st.builds(Timed, _pool, st.integers(min_value=-2, max_value=1)),
    st.just(Identity()),
)


def _small_extend(children):
    return st.one_of(
        st.builds(Neg, children),
        st.builds(Transpose, children),
        st.builds(Binary, st.sampled_from(BINARY_OPS), children, children),
        st.builds(
            Call,
            st.sampled_from(["exp", "diag", "l2norm", "f", "g", "x"]),
            st.lists(children, min_size=1, max_size=2).map(tuple),
        ),
    )


_small_exprs = st.recursive(_small_leaves, _small_extend, max_leaves=8)
_small_shapes = st.lists(st.sampled_from(["K", "V", "1", "0", "I"]), max_size=3).map(tuple)
_small_decls = st.builds(Decl, _pool, _small_shapes)
small_mixers = st.builds(
    Mixer,
    _pool,
    st.none(),
    _tuples(_small_decls, 4),
    _tuples(st.builds(Param, _pool, _small_shapes, st.none() | _small_exprs), 2),
    _tuples(_small_decls, 2),
    _tuples(
        st.builds(LetFn, _pool, st.lists(_pool, min_size=1, max_size=2).map(tuple), _small_exprs), 2
    ),
    _tuples(st.builds(Equation, _pool, _small_exprs), 4),
)
