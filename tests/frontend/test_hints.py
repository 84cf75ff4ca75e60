"""Every name a hint suggests passes the verifier: a refused name's hint, applied, gives a spec
that loads."""

from __future__ import annotations

import re

import pytest

import mixc
from mixc.errors import SpecError
from mixc.frontend.verify import RESERVED

SPEC = (
    "mixer m\nin {x}[K], k[K], v[V]\nstate H[V, K]\nH_t = H_{{t-1}} + v_t k_t^T\ny_t = H_t {x}_t\n"
)
# names the grammar reads as something else before the verifier sees them
UNPARSABLE = {"in", "let", "mixer", "param", "state", "t", "I"}


@pytest.mark.parametrize("name", sorted(n for n in RESERVED if n.isidentifier() and n[0].isalpha()))
def test_rename_hints_suggest_names_that_load(name: str) -> None:
    try:
        mixc.load_spec(text=SPEC.format(x=name))
    except SpecError as err:
        if name in UNPARSABLE and "reserved" not in err.message:
            return
        hint = re.fullmatch(r"rename it, e\.g\. (\w+) or (\w+)", err.hint or "")
        assert hint, (name, err.message, err.hint)
        for suggestion in hint.groups():
            mixc.load_spec(text=SPEC.format(x=suggestion))
    else:
        pytest.fail(f"{name} is reserved but was accepted")
