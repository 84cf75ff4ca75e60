"""Values that are not finite whatever the inputs: a parameter default that is not finite at some
head (`1 / h` at head 0), and a division by a product with 0 (`1 / (0 H_{t-1})`). Each is
refused at check time, located, saying which head or why; defaults that are finite at every
head still compile."""

from __future__ import annotations

import pytest

import mixc
from mixc.errors import SpecAnalysisError
from mixc.frontend.constants import HEADS_CHECKED
from mixc.nn import MixerLayer

HEAD = "mixer m\nin q[K], k[K], v[V], a\n"
BODY = "state H[V, K]\nH_t = g H_{t-1} + v_t k_t^T\ny_t = H_t q_t\n"


def _refused(text: str) -> str:
    with pytest.raises(SpecAnalysisError) as info:
        mixc.load_spec(text=text)
    return str(info.value)


@pytest.mark.parametrize(
    "default, head",
    [
        ("1 / h", 0),
        ("h^-1", 0),
        ("h ^ (0 - 2)", 0),
        ("sqrt(h - 1)", 0),
        ("log(h)", 0),
        ("1 / (h - 3)", 3),
        ("log(h - 5) + 1", 0),
        ("2 / (2 h - 14)", 7),
        ("1 / (h * h - 4)", 2),
    ],
)
def test_a_default_not_finite_at_a_head_is_refused(default: str, head: int) -> None:
    message = _refused(HEAD + f"param g = {default}\n" + BODY)
    first = message.split("\n")[0]
    assert first.startswith("<string>:3:11: error: the default of g is not finite at ")
    assert f"at head h = {head}:" in first
    assert "^" in message and "hint:" in message


def test_a_default_through_a_let_names_the_default() -> None:
    text = HEAD + "let f(x) = 1 / x\nparam g = 0.5 + f(h - 1)\n" + BODY
    message = _refused(text)
    assert message.startswith("<string>:3:12: error: the default of g is not finite at head h = 1")
    assert "in the default 0.5 + f(h - 1) at line 4" in message


@pytest.mark.parametrize(
    "default", ["1 - 2^(-5 - h)", "1 / (h + 1)", "sqrt(h)", "log(h + 2)", "h", "0.5"]
)
def test_defaults_finite_at_every_head_compile(default: str) -> None:
    module = mixc.load(text=HEAD + f"param g = {default}\n" + BODY)
    assert "g" in dict(module.PARAM_DEFAULTS)


def test_a_layer_with_more_heads_than_check_tries_checks_its_own() -> None:
    bad = HEADS_CHECKED + 6
    spec = mixc.Source(HEAD + f"param g = 1 / (h - {bad})\n" + BODY)
    mixc.load_spec(spec)  # finite at every head check tries
    MixerLayer(spec, hidden_size=HEADS_CHECKED, num_heads=bad, sizes={"K": 1, "V": 1})
    with pytest.raises(mixc.MixcError, match=f"param g: .* not finite at head h = {bad} "):
        MixerLayer(spec, hidden_size=HEADS_CHECKED, num_heads=bad + 1, sizes={"K": 1, "V": 1})


@pytest.mark.parametrize(
    "update, at",
    [
        ("1 / (0 H_{t-1}) + v_t k_t^T", "1 / 0 H_{t-1}"),
        ("H_{t-1} / (a_t * 0) + v_t k_t^T", "H_{t-1} / (a_t * 0)"),
        ("H_{t-1} + v_t k_t^T / (0 * a_t)", "v_t k_t^T / (0 * a_t)"),
        ("H_{t-1} + v_t k_t^T / (0 / a_t)", "v_t k_t^T / (0 / a_t)"),
        ("H_{t-1} + log(0 a_t) v_t k_t^T", "log(0 a_t)"),
    ],
)
def test_dividing_by_a_product_with_zero_is_refused(update: str, at: str) -> None:
    text = HEAD + "state H[V, K]\n" + f"H_t = {update}\ny_t = H_t q_t\n"
    message = _refused(text)
    first = message.split("\n")[0]
    assert first.startswith("<string>:4:") and f"error: {at} " in first, first
    assert "^" in message


def test_a_product_with_zero_elsewhere_still_compiles() -> None:
    text = HEAD + "state H[V, K]\nH_t = H_{t-1} + 0 * a_t v_t k_t^T + v_t k_t^T\ny_t = H_t q_t\n"
    assert mixc.load(text=text).FORMS
