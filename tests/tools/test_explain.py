"""`mixc explain` and `mixc graph`: the report, its JSON model and schema, costs with sizes, the
dependency-graph pictures, and the exit codes (0 ok, 1 spec errors, 2 usage errors)."""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path

import pytest

from mixc import load_spec
from mixc.analysis.plan import analyze
from mixc.cli import main
from mixc.errors import MixcError
from mixc.tools.explain import explain
from mixc.tools.render import render
from mixc.tools.report import SCHEMA_VERSION, Explanation
from tests.analysis.test_analysis import ROWS
from tests.analysis.test_analysis import VARIANT_ROWS as VARIANTS

SPECS = Path(__file__).parents[2] / "specs"
SHIPPED = sorted(p.name for p in SPECS.glob("*.mix"))
ANSI = re.compile(r"\x1b\[")

#: A piece of the derived parallel form that each class must print.
MATH = {
    "identity": "Y = (Q K^T ⊙ M) V + Q S_0",
    "scalar constant": "Y = (Q K^T ⊙ L) V + diag(exp(b)) Q S_0,  L_ij = exp(b_i - b_j)",
    "scalar data-dependent": "Y = (Q K^T ⊙ L) V + diag(exp(b)) Q S_0,  L_ij = exp(b_i - b_j)",
    "diagonal value-side": "y_i = Σ_{j<=i} (q_i · k_j) (exp(b_i - b_j) ⊙ v_j) + exp(b_i) ⊙ (S_0^T q_i)",
    "diagonal key-side": "y_i = Σ_{j<=i} ((q_i ⊙ exp(b_i - b_j)) · k_j) v_j + S_0^T (q_i ⊙ exp(b_i))",
    "identity minus rank-1": "T = (I + tril(diag(β) K K^T, -1))^{-1} diag(β),  W = T K,  U = T V",
    "scalar decay times identity minus rank-1": "Y = diag(exp(b)) Q S_0 + (Q K^T ⊙ Γ) (U - W S_0)",
    "elementwise gate": "S_i = exp(b_i) ⊙ S_0 + Σ_{j<=i} exp(b_i - b_j) ⊙ k_j v_j^T,  y_i = q_i S_i",
    "diagonal times identity minus rank-1": "T = (I - [A B]')^{-1},  W = T (A ⊙ exp(c_{r-1}))",
    "diagonal plus low rank": "Y = (Q ⊙ exp(c) + [Q B] W) S_0 + [Q K] V + [Q B] U'",
    "value-side (transposed) diagonal times identity minus rank-1": "pass 1, chunk_dplr on S^T "
    "with the queries a one token early: u_t = S_{t-1} a_t",
    "general dense": "S_t = G_t(S_{t-1}) + W_t, evaluated for t = 1..T in order",
}


def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:  # argparse usage errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def spec_file(tmp_path: Path, text: str, name: str = "variant.mix") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ----------------------------------------------------------------------------- the text report


@pytest.mark.parametrize("name", SHIPPED)
def test_text_report_of_each_shipped_spec(capsys, name):
    code, out, err = run(capsys, "explain", SPECS / name)
    assert code == 0, err
    assert not ANSI.search(out)  # piped: plain text
    plan = analyze(load_spec(SPECS / name))
    assert plan.mixer.name in out and plan.mixer.description in out
    for s in plan.states:
        assert f": {s.transition.label}  (rule {s.transition.rule.name}:" in out
        assert MATH[s.transition.label] in out
    assert f"algorithm: {plan.algorithm}" in out
    assert "Parallel form" in out and "Cost per token and head" in out
    for w in plan.warnings:
        assert w.render() in out


def test_a_value_side_state_is_said_to_be_transposed_with_its_kernel(capsys):
    """The gated Oja rule acts on H from the left: explain says so, and names the kernel that
    runs it on the transpose; the JSON report carries the same line, and a key-side state none."""
    code, out, err = run(capsys, "explain", SPECS / "gated_oja.mix")
    assert code == 0, err
    assert "H [V, K]: value-side (transposed) diagonal times identity minus rank-1" in out
    assert "transposed: a value-side (transposed) transition: it acts on H from the left" in out
    assert "kernel: chunk_dplr_value" in out
    code, out, err = run(capsys, "explain", "--json", SPECS / "gated_oja.mix")
    (state,) = json.loads(out)["states"]
    assert "kernel: chunk_dplr_value" in state["transposed"]
    code, out, err = run(capsys, "explain", "--json", SPECS / "kda.mix")
    assert json.loads(out)["states"][0]["transposed"] is None


def test_parallel_form_uses_the_specs_own_names(capsys):
    _, out, _ = run(capsys, "explain", SPECS / "gated_retention.mix")
    assert "Q rows = q_t,  K rows = k_t,  V rows = v_t,  g = logsigmoid(a_t)" in out
    assert "b = cumsum(g)" in out
    assert "log-gate: scalar: sigmoid(a_t) -> logsigmoid(a_t)   proven in (0, 1]" in out
    _, out, _ = run(capsys, "explain", SPECS / "mamba2.mix")
    assert "Q rows = C_t,  K rows = B_t,  V rows = dt_t x_t,  g = dt_t A" in out
    assert "y = Y[H] + D x_t   (linear + skip)" in out
    assert "write:    rank 1: value x_t, key B_t, scale dt_t" in out
    _, out, _ = run(capsys, "explain", SPECS / "linear_attention_normalized.mix")
    assert "V rows = [v_t, 1],  one pass for H, z" in out
    assert "y = num / den,  num = Y[H],  den = Y[z]   (ratio)" in out
    assert "_r1 = z_t . (elu(q_t) + 1)" in out
    _, out, _ = run(capsys, "explain", SPECS / "retnet.mix")
    assert "(so L_ij = (gamma)^(i - j))" in out
    _, out, _ = run(capsys, "explain", SPECS / "deltanet.mix")
    assert "erase:    I - β k k^T with β = beta_t, k = k_t" in out
    assert "stable only if: |k_t| = 1 not proven" in out


@pytest.mark.parametrize("name", VARIANTS)
def test_report_of_every_variant(capsys, tmp_path, name):
    row = ROWS[name]
    path = spec_file(tmp_path, row.spec)
    code, out, err = run(capsys, "explain", path)
    assert code == 0, err
    for state, want in row.states.items():
        assert f"  {state} " in out and f": {want.label}  (rule {want.rule}:" in out
        for gate in want.gates:
            side, rest = gate.split(": ", 1)
            decay_log = rest.rsplit(" ", 1)[0]
            assert f"log-gate: {side}: {decay_log}   " in out
    assert ("algorithm: recurrent only" in out) is not row.chunkable
    code, out, _ = run(capsys, "explain", path, "--json")
    report = Explanation.model_validate_json(out)
    assert [s.transition_class for s in report.states] == [w.label for w in row.states.values()]
    assert len(report.warnings) == len(row.warnings)


def test_sequential_only_spec_exits_0_and_says_why(capsys, tmp_path):
    path = spec_file(
        tmp_path,
        "mixer s\nin q[K], k[K], v[V]\nstate H[V, K]\nH_t = tanh(H_{t-1}) + v_t k_t^T\ny_t = H_t q_t\n",
    )
    code, out, _ = run(capsys, "explain", path)
    assert code == 0
    assert "algorithm: recurrent only" in out
    assert "sequential only: H: not affine: tanh(...) of a state is not linear in it" in out
    assert "none: H_t is not an affine function of H_{t-1}" in out


def test_warnings_are_rendered_with_a_caret(capsys, tmp_path):
    exceed = spec_file(
        tmp_path,
        "mixer e\nin q[K], k[K], v[V], x\nstate H[V, K]\nH_t = exp(x_t) H_{t-1} + v_t k_t^T\ny_t = H_t q_t\n",
    )
    code, out, _ = run(capsys, "explain", exceed)
    assert code == 0
    assert f"{exceed}:4:7: warning: cannot prove the decay exp(x_t) of H is in (0, 1]" in out
    assert "  4 | H_t = exp(x_t) H_{t-1} + v_t k_t^T\n    |       ^^^^^^^^\n" in out
    unread = spec_file(
        tmp_path,
        "mixer u\nin q[K], k[K], v[V]\nstate H[V, K], U[V, K]\nH_t = H_{t-1} + v_t k_t^T\n"
        "U_t = U_{t-1} + v_t k_t^T\ny_t = H_t q_t\n",
        "unread.mix",
    )
    _, out, _ = run(capsys, "explain", unread)
    assert f"{unread}:3:16: warning: state U is never read by an output" in out
    assert "  3 | state H[V, K], U[V, K]\n    |                ^^^^^^^\n" in out


def test_colour_only_on_a_terminal():
    report = explain(load_spec(SPECS / "gla.mix"))
    plain, coloured = io.StringIO(), io.StringIO()
    render(report, file=plain)
    render(report, file=coloured, color=True, width=120)
    assert not ANSI.search(plain.getvalue())
    assert ANSI.search(coloured.getvalue())
    assert re.sub(r"\x1b\[[0-9;]*m", "", coloured.getvalue()).split() == plain.getvalue().split()


# ----------------------------------------------------------------------------- JSON


@pytest.mark.parametrize("name", SHIPPED)
def test_json_validates_and_round_trips(capsys, name):
    code, out, _ = run(capsys, "explain", SPECS / name, "--json")
    assert code == 0
    data = json.loads(out)
    assert data["schema_version"] == SCHEMA_VERSION
    report = Explanation.model_validate(data)
    assert Explanation.model_validate_json(report.model_dump_json()) == report
    assert report == explain(load_spec(SPECS / name))
    plan = analyze(load_spec(SPECS / name))
    assert [s.transition_class for s in report.states] == [s.transition.label for s in plan.states]
    assert [s.rule for s in report.states] == [s.transition.rule.name for s in plan.states]
    assert report.chunkable is plan.chunkable and report.algorithm == plan.algorithm
    assert [g.states for g in report.groups] == [list(g.states) for g in plan.groups]


def test_json_fields_are_stable_and_documented(capsys):
    code, out, _ = run(capsys, "explain", "--json-schema")
    assert code == 0
    schema = json.loads(out)
    assert schema["properties"]["schema_version"]["const"] == SCHEMA_VERSION
    models = [schema, *schema["$defs"].values()]
    for model in models:
        for field, spec in model["properties"].items():
            assert re.fullmatch(r"[a-z][a-z0-9_]*", field), field
            assert spec.get("description"), f"{model.get('title')}.{field} has no description"
    assert set(schema["required"]) >= {
        "mixer",
        "states",
        "outputs",
        "algorithm",
        "costs",
        "parallel_form",
    }


def test_json_of_mamba2_has_the_facts(capsys):
    _, out, _ = run(capsys, "explain", SPECS / "mamba2.mix", "--json")
    data = json.loads(out)
    (h,) = data["states"]
    assert (h["transition_class"], h["rule"]) == ("scalar data-dependent", "scalar_data")
    assert h["gates"] == [
        {
            "side": "scalar",
            "decay": "exp(dt_t A)",
            "log": "dt_t A",
            "proven": False,
            "note": "in (0, 1] only if dt_t A <= 0",
            "location": {"line": 7, "column": 7, "end_line": 7, "end_column": 17},
        }
    ]
    assert h["writes"] == [{"value": "x_t", "key": "B_t", "scale": "dt_t"}]
    (y,) = data["outputs"]
    assert (y["form"], y["expr"], y["skip"]) == ("linear + skip", "_r0 + D x_t", "D x_t")
    roles = {i["name"]: i["roles"] for i in data["inputs"]}
    assert roles["C"] == ["query of H"] and roles["B"] == ["key of H"]
    assert data["warnings"][0]["location"]["line"] == 7


# ----------------------------------------------------------------------------- costs and --sizes


def test_sizes_fill_the_cost_formulas(capsys):
    code, out, _ = run(
        capsys,
        "explain",
        SPECS / "linear_attention.mix",
        "--json",
        "--sizes",
        "K=64,V=64,T=4096,C=64",
    )
    assert code == 0
    costs = json.loads(out)["costs"]
    assert costs["sizes"] == {"K": 64, "V": 64, "T": 4096, "C": 64} and costs["missing"] == []
    chunked = costs["total"]["chunked"]
    assert chunked["flops"]["formula"] == "2*C*K + 2*C*V + 4*K*V + C"
    assert chunked["flops"]["value"] == 2 * 64 * 64 + 2 * 64 * 64 + 4 * 64 * 64 + 64
    assert costs["total"]["recurrent"]["bytes"]["value"] == 8 * 64 * 64 + 4 * 64 + 4 * 64
    assert costs["total"]["quadratic"]["flops"]["value"] == 2 * 64 * 4096 * 2 + 4096
    _, out, _ = run(
        capsys, "explain", SPECS / "linear_attention.mix", "--sizes", "K=64,V=64,T=4096,C=64"
    )
    assert "= 32,832" in out and "sizes: K=64, V=64, T=4096, C=64" in out


def test_without_sizes_formulas_have_no_numbers(capsys):
    _, out, _ = run(capsys, "explain", SPECS / "mamba2.mix", "--json", "--sizes", "N=64")
    costs = json.loads(out)["costs"]
    assert costs["missing"] == ["C", "P", "T"]
    assert costs["total"]["recurrent"]["flops"] == {"formula": "5*N*P", "value": None}


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        ("K=", "must be a positive integer"),
        ("K=0", "must be a positive integer"),
        ("K=sixty", "must be a positive integer"),
        ("K64", "is not NAME=NUMBER"),
        ("K=1,K=2", "given twice"),
        ("Q=3", "unknown size Q (sizes of linear_attention: C, K, T, V)"),
    ],
)
def test_malformed_sizes_are_usage_errors(capsys, sizes, message):
    code, out, err = run(capsys, "explain", SPECS / "linear_attention.mix", "--sizes", sizes)
    assert code == 2
    assert message in err and "error:" in err and not out


def test_spec_errors_exit_1_and_usage_errors_exit_2(capsys, tmp_path):
    code, _, err = run(capsys, "explain", tmp_path / "missing.mix")
    assert code == 1 and "no such spec file" in err
    cyclic = spec_file(
        tmp_path,
        "mixer n\nin q[K], k[K], v[V]\nstate H[V, K]\na_t = b_t + 1\nb_t = a_t\nH_t = H_{t-1} + v_t k_t^T\ny_t = H_t q_t + a_t\n",
    )
    code, _, err = run(capsys, "explain", cyclic)
    assert code == 1 and "depends on itself at the same time step" in err and "^" in err
    assert "Traceback" not in err
    code, _, err = run(capsys, "explain")
    assert code == 2 and "SPEC" in err
    code, _, err = run(capsys, "graph", SPECS / "retnet.mix")
    assert code == 2 and "-o" in err


# ----------------------------------------------------------------------------- graph


@pytest.mark.parametrize("name", ["mamba2.mix", "linear_attention_normalized.mix"])
def test_graph_writes_png_and_svg(capsys, tmp_path, name):
    png, svg = tmp_path / "g.png", tmp_path / "g.svg"
    assert run(capsys, "graph", SPECS / name, "-o", png)[0] == 0
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") and png.stat().st_size > 1000
    assert run(capsys, "graph", SPECS / name, "-o", svg)[0] == 0
    text = svg.read_text()
    assert "<svg" in text and "t-1" in text and "stroke-dasharray" in text
    first = svg.read_bytes()
    run(capsys, "graph", SPECS / name, "-o", svg)
    assert svg.read_bytes() == first  # deterministic
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "g.png",
        "g.svg",
    ]  # no temporary files left


@pytest.mark.parametrize(
    "name, roles",
    [
        (
            "gated_deltanet",
            {
                ("k", "H"): ("key",),
                ("v", "H"): ("value",),
                ("beta", "H"): ("write scale", "erase"),
                ("g", "H"): ("decay",),
                ("H", "y"): ("read",),
                ("q", "y"): ("query of H",),
            },
        ),
        (
            "mamba2",
            {
                ("B", "H"): ("key",),
                ("x", "H"): ("value",),
                ("dt", "H"): ("write scale", "decay"),
                ("A", "H"): ("decay",),
                ("H", "y"): ("read",),
                ("C", "y"): ("query of H",),
                ("D", "y"): ("skip",),
                ("x", "y"): ("skip",),
            },
        ),
    ],
)
def test_graph_labels_every_edge_with_its_role(capsys, tmp_path, name, roles):
    from mixc.tools.graph import edge_roles

    plan = analyze(load_spec(SPECS / f"{name}.mix"))
    assert edge_roles(plan) == roles
    out = tmp_path / "g.svg"
    assert run(capsys, "graph", SPECS / f"{name}.mix", "-o", out)[0] == 0
    text = out.read_text()
    for labels in roles.values():
        assert f">{', '.join(labels)}<" in text


def test_graph_shows_derived_values(capsys, tmp_path):
    path = spec_file(
        tmp_path,
        "mixer d\nin q[K], k[K], v[V], x\nstate H[V, K]\na_t = sigmoid(x_t)\nH_t = a_t H_{t-1} + v_t k_t^T\ny_t = H_t q_t\n",
    )
    out = tmp_path / "d.svg"
    assert run(capsys, "graph", path, "-o", out)[0] == 0
    assert "derived value" in out.read_text()


@pytest.mark.parametrize("name", ["graph.pdf", "graph", "graph.PNG.txt"])
def test_graph_unknown_suffix_is_a_usage_error(capsys, tmp_path, name):
    code, _, err = run(capsys, "graph", SPECS / "retnet.mix", "-o", tmp_path / name)
    assert code == 2 and "use .png or .svg" in err
    assert not list(tmp_path.iterdir())


def test_graph_into_a_missing_directory_is_an_error(capsys, tmp_path):
    code, _, err = run(capsys, "graph", SPECS / "retnet.mix", "-o", tmp_path / "nope" / "g.png")
    assert code == 1 and "does not exist" in err


def test_graph_without_matplotlib_says_how_to_install_it(monkeypatch, tmp_path):
    from mixc.tools.graph import write_graph

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(MixcError, match="pip install matplotlib"):
        write_graph(analyze(load_spec(SPECS / "retnet.mix")), tmp_path / "g.png")
