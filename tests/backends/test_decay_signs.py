"""Decays whose sign is not proven (issue 33, case 6). The chunked forms (chunk, parallel,
summary) work with log(decay), NaN at a negative decay, where the recurrence multiplies by it:

- a decay the spec computes whose sign interval arithmetic cannot prove (`q_t . k_t`,
  `tanh(a_t)`, `silu(w_t)`, `log(sigmoid(a_t))`, `sum(k_t)`, a negative constant) has no
  chunked form: FORMS lists recurrent and step, chunk() raises NYI naming the decay, and
  `explain` and `check` say so;
- a decay the caller passes as it is (an input `a_t`, `G_t`, `diag(a_t)`, a parameter without a
  default) keeps its chunked forms, which refuse a negative entry at run time, naming it;
- a decay proven >= 0 but possibly 0 (`relu(a_t)`, `a_t^2`) keeps them unchecked, and agrees
  with the recurrence on N(0, 1) inputs (half the decays exactly 0).
"""

from __future__ import annotations

import json
import re

import pytest
import torch

import mixc
from mixc.cli import main
from mixc.errors import InputError

HEAD = "mixer m\nin q[K], k[K], v[V], a, w, b[K], G[V, K]\nparam lam\nstate H[V, K]\n"
TAIL = " + v_t k_t^T\ny_t = H_t q_t\n"

#: Decays the spec computes, sign not proven: no chunked form.
COMPUTED = {
    "dot": "(q_t . k_t) H_{t-1}",
    "silu": "silu(w_t) H_{t-1}",
    "tanh": "tanh(a_t) H_{t-1}",
    "log_sigmoid": "log(sigmoid(a_t)) H_{t-1}",
    "sum": "sum(k_t) H_{t-1}",
    "minus_sigmoid": "-sigmoid(a_t) H_{t-1}",
    "shifted": "(a_t - 0.5) H_{t-1}",
    "negative_constant": "-0.5 H_{t-1}",
    "product": "sigmoid(w_t) tanh(a_t) H_{t-1}",
    "diag_tanh": "H_{t-1} diag(tanh(b_t))",
    "value_side": "diag(silu(v_t)) H_{t-1}",
    "full_gate": "tanh(G_t) ⊙ H_{t-1}",
}
#: Decays the caller passes as they are: checked at run time by the chunked forms.
PASSED = {
    "input": ("a_t H_{t-1}", "a"),
    "diag_input": ("H_{t-1} diag(b_t)", "b"),
    "full_input": ("G_t ⊙ H_{t-1}", "G"),
    "parameter": ("lam H_{t-1}", "lam"),
    "times_sigmoid": ("sigmoid(w_t) a_t H_{t-1}", "a"),
}
#: Decays proven >= 0 that can be exactly 0: the chunked forms as they are.
NONNEGATIVE = {
    "relu": "relu(a_t) H_{t-1}",
    "square": "a_t^2 H_{t-1}",
    "diag_relu": "H_{t-1} diag(relu(b_t))",
    "full_relu": "relu(G_t) ⊙ H_{t-1}",
    "relu_times_sigmoid": "0.5 relu(a_t) sigmoid(w_t) H_{t-1}",
}


def _spec(update: str):
    return mixc.load_spec(text=HEAD + "H_t = " + update + TAIL)


def _args(spec, seed: int = 0, positive: bool = False):
    """N(0, 1) inputs and parameters (their absolute values with `positive`), float64."""
    gen = torch.Generator().manual_seed(seed)
    sizes = {"K": 3, "V": 2}
    out = []
    for d in spec.mixer.inputs:
        out.append(torch.randn(2, 11, 2, *(sizes[s] for s in d.shape), generator=gen).double())
    out += [torch.randn(2, generator=gen).double() for p in spec.mixer.params if not p.default]
    return [x.abs() for x in out] if positive else out


@pytest.mark.parametrize("update", COMPUTED.values(), ids=COMPUTED.keys())
def test_a_computed_decay_of_unproven_sign_has_no_chunked_form(update: str) -> None:
    spec = _spec(update)
    plan = mixc.analyze(spec)
    assert plan.forms.names() == ("recurrent", "step")
    # a negative constant factor (-1, -0.5) was refused before, as not positive
    assert re.search("can be negative|is not positive", plan.reason)
    module = mixc.load(spec)
    assert module.FORMS == ("recurrent", "step") and not hasattr(module, "parallel")
    args = _args(spec)
    y, _ = module.recurrent(*args)
    assert torch.isfinite(y).all()
    with pytest.raises(mixc.MixcError, match=r"NYI: no chunked form \(H: (NYI: )?the decay"):
        module.chunk(*args)
    with pytest.raises(mixc.MixcError, match="NYI: no transition summary"):
        module.summary(*args)


@pytest.mark.parametrize(("update", "name"), PASSED.values(), ids=PASSED.keys())
def test_a_decay_passed_in_is_checked_by_the_chunked_forms(update: str, name: str) -> None:
    spec = _spec(update)
    plan = mixc.analyze(spec)
    assert [c.name for c in plan.sign_checks] == [name]
    module = mixc.load(spec)
    chunked = [f for f in ("chunk", "parallel") if f in module.FORMS]
    assert chunked
    args = _args(spec)
    y, _ = module.recurrent(*args)
    assert torch.isfinite(y).all()
    for form in [*chunked, "summary"]:
        with pytest.raises(InputError, match=rf"^{name}: the decay .* has negative entries"):
            getattr(module, form)(*args)
    good = _args(spec, positive=True)
    ref, _ = module.recurrent(*good)
    for form in chunked:
        out, _ = getattr(module, form)(*good)
        torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("update", NONNEGATIVE.values(), ids=NONNEGATIVE.keys())
def test_a_decay_proven_nonnegative_runs_chunked_unchecked(update: str) -> None:
    spec = _spec(update)
    plan = mixc.analyze(spec)
    assert plan.chunkable and plan.sign_checks == ()
    module = mixc.load(spec)
    args = _args(spec)
    ref, _ = module.recurrent(*args)
    for form in [f for f in ("chunk", "parallel") if f in module.FORMS]:
        out, _ = getattr(module, form)(*args)
        torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)


def test_explain_and_check_say_what_the_module_does(tmp_path, capsys) -> None:
    computed = tmp_path / "computed.mix"
    computed.write_text(HEAD + "H_t = " + COMPUTED["dot"] + TAIL, encoding="utf-8")
    passed = tmp_path / "passed.mix"
    passed.write_text(HEAD + "H_t = " + PASSED["input"][0] + TAIL, encoding="utf-8")

    assert main(["explain", str(computed), "--json"]) == 0
    forms = {f["name"]: f for f in json.loads(capsys.readouterr().out)["forms"]}
    assert [n for n, f in forms.items() if f["available"]] == ["recurrent", "step"]
    assert "can be negative" in forms["chunk"]["reason"]
    assert main(["explain", str(passed), "--json"]) == 0
    forms = {f["name"]: f for f in json.loads(capsys.readouterr().out)["forms"]}
    assert all(forms[n]["available"] for n in ("chunk", "parallel", "summary"))
    assert all("a (the decay a_t of H)" in forms[n]["checks"] for n in ("chunk", "parallel"))
    assert forms["recurrent"]["checks"] is None

    assert main(["explain", str(computed)]) == 0
    text = capsys.readouterr().out
    assert "forms: recurrent, step\n" in text and "can be negative" in text
    assert main(["check", str(computed), str(passed)]) == 0
    out = capsys.readouterr().out
    assert "# forms: recurrent, step; no chunk or parallel: H: the decay q_t . k_t can be" in out
    assert "# chunk and parallel check at run time that a (the decay a_t of H) has no neg" in out


def test_the_check_holds_in_a_compiled_graph_too() -> None:
    """torch.compile cannot branch on a tensor's values: there the check is an assertion in the
    graph, so a negative decay is an error with the same message, never a silent NaN."""
    update, name = next(iter(PASSED.values()))
    spec = _spec(update)
    module = mixc.load(spec)
    torch._dynamo.reset()
    compiled = torch.compile(module.chunk, fullgraph=True, backend="aot_eager")
    good = _args(spec, positive=True)
    torch.testing.assert_close(compiled(*good)[0], module.recurrent(*good)[0])
    with pytest.raises(RuntimeError, match=rf"{name}: the decay .* has negative entries"):
        compiled(*_args(spec))
