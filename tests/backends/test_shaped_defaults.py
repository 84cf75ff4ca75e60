"""A shaped parameter with a default (`param u[K] = 0.5`): the default is one value per head
(it may read h), broadcast over the parameter's entries, and every form uses it as the oracle
does; a size the default cannot learn (no input and no parameter without a default has it) is
refused at check time, located."""

from __future__ import annotations

import pytest
import torch

import mixc
from mixc.check import fuzz
from mixc.errors import SpecShapeError

RWKV_LIKE = (
    "mixer bonus\nin r[K], k[K], v[V], w[K]\n{param}\nstate H[V, K]\n"
    "H_t = H_{{t-1}} diag(exp(-exp(w_t))) + v_t k_t^T\n"
    "y_t = H_{{t-1}} r_t + (r_t . (u * k_t)) v_t\n"
)


@pytest.mark.parametrize(
    "param", ["param u[K] = 0.5", "param u[K] = 1 - 2^(-1 - h)", "param u[K] = 0.5, A[2, K]"]
)
def test_a_shaped_default_is_used_by_every_form(param: str) -> None:
    spec = mixc.load_spec(text=RWKV_LIKE.format(param=param))
    report = fuzz(spec, examples=4, seed=5, max_T=12)
    assert report.ok, report.failure.summary()
    assert {"chunk", "recurrent", "step"} <= set(report.worst)


def test_the_default_broadcasts_per_head_and_an_override_wins() -> None:
    module = mixc.load(text="mixer m\nin x[K]\nparam u[K] = h + 1\ny_t = u * x_t\n")
    x = torch.ones(1, 2, 3, 4)
    y, _ = module.chunk(x)
    assert torch.equal(y, torch.tensor([1.0, 2.0, 3.0])[:, None].expand(1, 2, 3, 4))
    given = torch.full((3, 4), 7.0)
    assert torch.equal(module.recurrent(x, u=given)[0], 7 * x)


def test_a_size_only_the_defaulted_parameter_has_is_refused() -> None:
    with pytest.raises(SpecShapeError) as info:
        mixc.load_spec(text="mixer m\nin x\nparam u[P] = 0.5\ny_t = sum(u) * x_t\n")
    message = str(info.value)
    assert message.startswith("<string>:3:14: error: the size P of u is unknown")
    assert "^^^" in message and "hint:" in message


def test_a_size_from_a_later_parameter_without_a_default_is_enough() -> None:
    module = mixc.load(text="mixer m\nin x\nparam u[P] = 0.5, A[P]\ny_t = sum(u * A) * x_t\n")
    y, _ = module.chunk(torch.ones(1, 2, 1), torch.ones(1, 3))
    assert torch.equal(y, torch.full((1, 2, 1), 1.5))
