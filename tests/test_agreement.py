"""`mixc check`, `mixc explain` and `mixc compile` never disagree.

All three start from the same plan (`mixc.driver.plan`), so a spec one of them accepts the
others accept, and what `explain` says a spec has (a chunked form, its classes) is what the
compiled module has. Checked over the shipped specs, specs at the edges of what compiles, random
specs of every class and mutations of the shipped specs.
"""

import contextlib
import importlib.util
import io
import json
import random
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from mixc import cli
from mixc.check import random_specs
from tests.frontend.test_malformed import VOCABULARY

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted((ROOT / "specs").glob("*.mix"))

EDGES = {
    # a scalar state read as the output: no linear readout
    "scalar_state_output": "mixer a\nin k, v\nstate s\ns_t = s_{t-1} + k_t v_t\ny_t = s_t\n",
    # a matrix state divided by a vector state: a shape error
    "matrix_over_vector": "mixer a\nin k[K], v[V]\nstate N[V, K], d[K]\n"
    "N_t = N_{t-1} + v_t k_t^T\nd_t = d_{t-1} + k_t\ny_t = N_t / d_t\n",
    # the delta rule erasing along one key and writing along another: diagonal plus low rank
    "delta_two_keys": "mixer a\nin q[K], k[K], v[V], u[K], beta\nstate H[V, K]\n"
    "H_t = H_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t u_t^T\ny_t = H_t q_t\n",
    # two outputs: the modules return one
    "two_outputs": "mixer a\nin q[K], k[K], v[V]\nstate H[V, K]\nH_t = H_{t-1} + v_t k_t^T\n"
    "y_t = H_t q_t\nz_t = H_t k_t\n",
    # not affine, and a full elementwise gate: recurrent only
    "not_affine": "mixer a\nin q[K], k[K], v[V]\nstate H[V, K]\n"
    "H_t = tanh(H_{t-1}) + v_t k_t^T\ny_t = H_t q_t\n",
    "full_gate": "mixer a\nin q[K], k[K], v[V], G[V, K]\nstate H[V, K]\n"
    "H_t = sigmoid(G_t) * H_{t-1} + v_t k_t^T\ny_t = H_t q_t\n",
    # a value-side gate: chunked, its summary acting from the left
    "value_gate": "mixer a\nin q[K], k[K], v[V], a[V]\nstate H[V, K]\n"
    "H_t = diag(sigmoid(a_t)) H_{t-1} + v_t k_t^T\ny_t = H_t q_t\n",
    # a rank-2 write: recurrent only
    "rank_2": "mixer a\nin q[K], k[K], v[V], u[V], w[K]\nstate H[V, K]\n"
    "H_t = H_{t-1} + v_t k_t^T + u_t w_t^T\ny_t = H_t q_t\n",
}


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(list(argv))
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(f"agreement_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def assert_agree(text: str, tmp: Path) -> None:
    spec = tmp / "spec.mix"
    spec.write_text(text, encoding="utf-8")
    out = tmp / "compiled.py"
    out.unlink(missing_ok=True)
    check = _run("check", "-q", str(spec))
    explain = _run("explain", "--json", str(spec))
    compiled = _run("compile", str(spec), "-o", str(out))
    codes = (check[0], explain[0], compiled[0])
    assert len(set(codes)) == 1, f"check, explain, compile exited {codes}\n{text}\n{compiled[2]}"
    if codes[0] != 0:
        # the same error, word for word; check goes on to the front end's independent ones
        assert explain[2] == compiled[2], text
        assert check[2].startswith(compiled[2]), text
        assert not out.exists()
        return
    report = json.loads(explain[1])
    module = _load(out)
    assert report["chunkable"] is ("chunk" in module.FORMS), text
    forms = {f["name"]: f for f in report["forms"]}
    assert tuple(n for n, f in forms.items() if f["available"] and n != "summary") == module.FORMS
    _assert_summary_agrees(module, forms["summary"], text)
    assert {s["name"]: s["transition_class"] for s in report["states"]} == module.CLASSES, text


def _assert_summary_agrees(module, form: dict, text: str) -> None:
    """`summary` computes exactly when explain says it does, else raises the reason given."""
    import torch

    from mixc import load_spec
    from mixc.check import sample_inputs

    args = sample_inputs(load_spec(text=module.SPEC), dict.fromkeys(_sizes(module), 4), 8, heads=2)
    if form["available"]:
        transitions, finals = module.summary(*args, chunk_size=4)
        parts = [*_flat(transitions), *_flat(finals)]
        assert parts and all(torch.isfinite(x).all() for x in parts), text
        return
    with pytest.raises(Exception, match="no transition summary") as caught:
        module.summary(*args, chunk_size=4)
    assert form["reason"].replace("NYI: ", "")[:40] in str(caught.value), text


def _flat(x) -> list:
    return [y for item in x for y in _flat(item)] if isinstance(x, tuple) else [x]


def _sizes(module) -> set[str]:
    decls = (*module.INPUTS, *module.PARAMS, *module.PARAM_DEFAULTS, *module.STATES)
    return {d for _, shape in decls for d in shape if not d.isdigit()}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_specs_agree(path: Path, tmp_path: Path) -> None:
    assert_agree(path.read_text(encoding="utf-8"), tmp_path)


@pytest.mark.parametrize("name", sorted(EDGES))
def test_edge_specs_agree(name: str, tmp_path: Path) -> None:
    assert_agree(EDGES[name], tmp_path)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(random_specs())
def test_random_specs_agree(tmp_path: Path, text: str) -> None:
    assert_agree(text, tmp_path)


def _mutations(n: int, seed: int = 0) -> list[str]:
    """Shipped specs with a piece of the language inserted or a span deleted, at random."""
    rng = random.Random(seed)
    texts = [p.read_text(encoding="utf-8") for p in SHIPPED]
    out = []
    for _ in range(n):
        text = rng.choice(texts)
        at = rng.randrange(len(text))
        if rng.random() < 0.5:
            out.append(text[:at] + rng.choice(VOCABULARY[:60]) + text[at:])
        else:
            out.append(text[:at] + text[at + rng.randrange(1, 12) :])
    return out


@pytest.mark.parametrize("index", range(60))
def test_mutated_specs_agree(index: int, tmp_path: Path) -> None:
    assert_agree(_mutations(60)[index], tmp_path)
