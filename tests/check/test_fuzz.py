"""`mixc fuzz`: every shipped spec passes, a correct compiled file passes with --module, the
derived input ranges are the ones the specs need, and the command's exit codes and output."""

from __future__ import annotations

import re
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings

import mixc
from mixc import cli
from mixc.check import Example, check, examples, forms, fuzz, input_ranges
from mixc.check.tolerance import reference
from tests.mixers import run_mixc

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted((ROOT / "specs").glob("*.mix"))
IDS = [p.stem for p in SPECS]
#: Shipped specs fuzzed only with -m slow: each is built from mechanisms the default run fuzzes
#: in another spec (Mamba-3 MIMO: Mamba-3 SISO's angles, mamba3_trapezoid's joined writes) and
#: takes twice as long as them; its own reference test (tests/backends/test_mamba3_mimo.py)
#: runs by default.
SLOW = {"mamba3_mimo"}


def test_cli_passes_and_prints_one_summary_line() -> None:
    result = run_mixc("fuzz", "specs/gla.mix", "--examples", "8", "--seed", "3")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == ""  # no progress bar when stderr is not a terminal
    lines = result.stdout.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(
        "mixc fuzz specs/gla.mix: 8 examples passed (float32); worst relative error"
    )
    for form in ("recurrent", "step", "chunk"):
        assert f" {form} " in lines[0]


NON_CAUSAL = {"hydra", "bidirectional_gla"}


@pytest.mark.parametrize(
    "path", [pytest.param(p, id=p.stem, marks=[pytest.mark.slow] * (p.stem in SLOW)) for p in SPECS]
)
def test_every_shipped_spec_passes(path: Path) -> None:
    report = fuzz(path, examples=12, seed=1)
    assert report.ok, report.failure.summary() + "\n" + report.failure.example.describe()
    assert report.examples == 12
    forms = set(report.worst)
    # a non-causal mixer (a backward state) has no step form
    assert {"recurrent", "step"} <= forms or (path.stem in NON_CAUSAL and "step" not in forms)
    assert {"chunk", "packed"} <= forms
    assert ("parallel" in forms) == (
        path.stem
        in {
            "linear_attention",
            "linear_attention_normalized",
            "retnet",
            "gated_retention",
            "mamba2",
            "mamba3",
            "mamba3_mimo",
            "mamba3_trapezoid",
            "ema",
            "linear_attention_rope",
            "transformer_vq",
            "stacked",
            "hydra",
        }
    )
    assert all(a <= 1e-5 and b <= 1e-4 for a, b in report.worst.values())


def test_the_examples_readme_lists_every_example_spec() -> None:
    """examples/specs/README.md's table names exactly the specs of its folder (none since
    Mamba-3 SISO and MIMO shipped; the README says what rank r written compactly would need)."""
    folder = ROOT / "examples" / "specs"
    listed = re.findall(r"^\| `(\w+\.mix)` \|", (folder / "README.md").read_text("utf-8"), re.M)
    assert sorted(listed) == sorted(p.name for p in folder.glob("*.mix"))


@pytest.mark.parametrize(
    "path", sorted((ROOT / "examples" / "specs").glob("*.mix")), ids=lambda p: p.stem
)
def test_every_example_spec_passes_in_float64(path: Path) -> None:
    """The mixers in examples/specs (not shipped yet: its README says what they miss) compute
    what they say, in every form, in float64."""
    report = fuzz(path, examples=6, seed=1, dtype="float64")
    assert report.ok, report.failure.summary() + "\n" + report.failure.example.describe()
    assert {"recurrent", "step", "chunk"} <= set(report.worst)


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
@pytest.mark.parametrize("path", SPECS, ids=IDS)
def test_every_shipped_spec_passes_in_other_precisions(path: Path, dtype: str) -> None:
    report = fuzz(path, examples=4, seed=2, dtype=dtype, max_T=40)
    assert report.ok, report.failure.summary()
    if dtype == "float64":
        assert all(a <= 1e-10 and b <= 1e-10 for a, b in report.worst.values())


@settings(max_examples=8, suppress_health_check=list(HealthCheck))
@given(ex=examples(input_ranges(ROOT / "specs/gated_deltanet.mix"), max_T=40))
def test_bfloat16_within_four_times_the_rounded_oracle(ex: Example) -> None:
    p = input_ranges(ROOT / "specs/gated_deltanet.mix")
    worst, failure = check(
        p, mixc.load(ROOT / "specs/gated_deltanet.mix"), ex, dtype=torch.bfloat16
    )
    assert failure is None, failure.summary()
    assert worst["recurrent"][0] > 1e-4  # bf16 outputs: the bound is relative to bf16 rounding


def test_bfloat16_gradient_of_a_shared_input() -> None:
    """Found by this fuzzer: an input shared across heads had its gradient summed over heads in
    bfloat16 (repeat before the cast to fp32), ~10x the error of one bf16 rounding; fixed."""
    path = ROOT / "specs/gated_deltanet.mix"
    ex = Example(
        batch=1,
        heads=3,
        T=3,
        sizes=(("K", 1), ("V", 3)),
        chunk_sizes=(4,),
        initial_state=False,
        input_heads=(("q", 3), ("k", 3), ("v", 3), ("g", 1), ("beta", 3)),
        modes=(("k", "unit"), ("g", "tiny"), ("beta", "uniform")),
        override_defaults=False,
        seed=3,
    )
    _, failure = check(input_ranges(path), mixc.load(path), ex, dtype=torch.bfloat16)
    assert failure is None, failure.summary()


def test_module_file_passes(tmp_path: Path) -> None:
    path = ROOT / "specs/mamba2.mix"
    module = tmp_path / "mamba2_compiled.py"
    module.write_text(mixc.compile_source(path))
    report = fuzz(path, module, examples=8)
    assert report.ok, report.failure.summary()
    assert report.examples == 8 and "parallel" in report.worst


def test_cli_module_passes(tmp_path: Path, capsys) -> None:
    module = tmp_path / "deltanet.py"
    module.write_text(mixc.compile_source(ROOT / "specs/deltanet.mix"))
    assert (
        cli.main(
            ["fuzz", str(ROOT / "specs/deltanet.mix"), "--module", str(module), "--examples", "6"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert f"--module {module}: 6 examples passed" in out


def test_same_seed_same_report(monkeypatch) -> None:
    """The oracle's results are not kept here (as in a new process): both runs compute them."""
    monkeypatch.setattr(forms, "ORACLE_CACHE_SIZE", 0)
    monkeypatch.setattr(forms, "_ORACLE", OrderedDict())
    a = fuzz(ROOT / "specs/gla.mix", examples=5, seed=11)
    b = fuzz(ROOT / "specs/gla.mix", examples=5, seed=11)
    assert a.worst == b.worst


def test_the_oracle_runs_once_an_example_for_several_modules(tmp_path: Path, monkeypatch) -> None:
    """A module file of a spec fuzzed with the seed its in-process module was fuzzed with draws
    the same examples: the oracle's results on them are kept, and the report is the same."""
    runs = []

    def counted(*args, **kwargs):
        runs.append(args[0])
        return reference(*args, **kwargs)

    monkeypatch.setattr(forms, "reference", counted)
    monkeypatch.setattr(forms, "_ORACLE", OrderedDict())
    path = ROOT / "specs/retnet.mix"
    a = fuzz(path, examples=3, seed=5)
    first = len(runs)
    module = tmp_path / "retnet.py"
    module.write_text(mixc.compile_source(path))
    b = fuzz(path, module, examples=3, seed=5)
    assert first >= 3 * 3 and len(runs) == first  # the oracle and two moved inputs, an example
    assert a.worst == b.worst


def test_progress_is_reported() -> None:
    seen = []
    fuzz(
        ROOT / "specs/retnet.mix",
        examples=4,
        progress=lambda done, total, phase: seen.append((done, total, phase)),
    )
    assert seen[-1] == (4, 4, "generating")
    assert [d for d, _, _ in seen] == sorted(d for d, _, _ in seen)


def test_spec_error_exits_1_with_a_located_message(tmp_path: Path) -> None:
    bad = tmp_path / "bad.mix"
    bad.write_text(
        "mixer bad\nin q[K], k[K], v[V]\nstate H[V, K]\nH_t = H_{t-1} + v_t k_t\ny_t = H_t q_t\n"
    )
    result = run_mixc("fuzz", str(bad), "--examples", "2")
    assert result.returncode == 1
    assert f"{bad}:4:" in result.stderr and "^" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["fuzz"],
        ["fuzz", "specs/gla.mix", "--examples", "0"],
        ["fuzz", "specs/gla.mix", "--examples", "many"],
        ["fuzz", "specs/gla.mix", "--dtype", "float16"],
        ["fuzz", "specs/gla.mix", "--device", "tpu"],
    ],
    ids=["no-spec", "zero-examples", "not-a-number", "dtype", "device"],
)
def test_usage_errors_exit_2(args, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(args)
    assert exc.value.code == 2
    assert "usage: mixc fuzz" in capsys.readouterr().err


@pytest.mark.parametrize(
    "module_text, message",
    [
        (None, "no such module file"),
        ("def broken(:\n", "cannot import (line 1): SyntaxError"),
        ("x = 1\n", "not a mixc module: it defines no INPUTS, STATES, recurrent, step"),
        (
            "INPUTS = (('q', ('K',)), ('k', ('K',)))\nSTATES = (('H', ('V', 'K')),)\n"
            "def recurrent(*a, **k): pass\ndef step(*a, **k): pass\n",
            "its INPUTS are (q, k) but the spec's inputs are (q, k, v, g)",
        ),
    ],
    ids=["missing", "syntax-error", "not-a-module", "wrong-inputs"],
)
def test_bad_module_exits_1(tmp_path: Path, capsys, module_text, message) -> None:
    module = tmp_path / "m.py"
    if module_text is not None:
        module.write_text(module_text)
    assert (
        cli.main(["fuzz", str(ROOT / "specs/gla.mix"), "--module", str(module), "--examples", "2"])
        == 1
    )
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_module_that_raises_is_a_failure(tmp_path: Path) -> None:
    source = mixc.compile_source(ROOT / "specs/linear_attention.mix")
    target = "def step("
    assert source.count(target) == 1
    module = tmp_path / "m.py"
    module.write_text(
        source.replace(
            target, "def step(*_, **__):\n    raise RuntimeError('boom')\n\n\ndef _old_step("
        )
    )
    report = fuzz(ROOT / "specs/linear_attention.mix", module, examples=3)
    assert not report.ok
    assert report.failure.form == "step" and report.failure.quantity == "call"
    assert report.failure.kind == "crash"
    assert "RuntimeError: boom" in report.failure.summary()


def test_an_example_on_which_the_recurrence_diverges_is_drawn_again() -> None:
    """A state that grows 10^4-fold a token is finite in the float64 oracle up to T of about 70,
    but past 1e19 its float32 products overflow: such an example is the recurrence's, not the
    module's, and is drawn again (with the oracle's inf too) instead of failing with inf."""
    text = """mixer grow "a state that grows 10^4-fold each token"
in    q[K], k[K], v[V]
state H[V, K]
H_t = 10000 H_{t-1} + v_t k_t^T
y_t = H_t q_t
"""
    report = fuzz(mixc.Source(text), examples=10, seed=0)
    assert report.ok, report.failure.summary()
    assert report.discarded > 0 and report.examples == 10  # as many passed as were asked for


def test_writes_that_share_a_key_run_chunked_as_one_write() -> None:
    """`(v - g ⊙ v) k^T` expands into two writes along one key, v k^T - (g ⊙ v) k^T: the analysis
    joins them into one rank-1 write (it was "rank 2: no chunked form"), and the chunked form
    of the joined write computes what the spec wrote."""
    text = """mixer input_gate "a scalar decay and an input gate on the values"
in    q[K], k[K], v[V], a, g[V]
state H[V, K]
H_t = sigmoid(a_t) H_{t-1} + (v_t - g_t * v_t) k_t^T
y_t = H_t q_t
"""
    report = fuzz(mixc.Source(text), examples=8, seed=3)
    assert report.ok, report.failure.summary()
    assert "chunk" in report.worst


# ----------------------------------------------------------------------------- input ranges


@pytest.mark.parametrize(
    "spec, domains",
    [
        ("gla", {"g": "negative", "k": "key", "q": "plain"}),
        ("gated_retention", {"a": "real", "k": "key"}),
        ("mamba2", {"dt": "positive", "A": "negative", "B": "key", "D": "plain"}),
        ("deltanet", {"k": "unit ball", "beta": "unit interval"}),
        ("gated_deltanet", {"k": "unit ball", "beta": "unit interval", "g": "negative"}),
        ("gated_general", {"G": "unit interval"}),
        ("linear_attention_normalized", {"k": "plain", "H": "state", "z": "positive state"}),
        ("retnet", {"k": "key", "H": "state"}),
        # a decay and a scalar erase strength that also scale a rank-1 term (DPLR's unit key)
        # are drawn by their own bounds, not as keys of norm <= 1; an input read there only
        # inside a bounded function (l2norm(k_t), sigmoid(d_t)) needs no bound at all
        ("precond_gdn", {"k": "plain", "g": "negative", "beta": "unit interval"}),
        ("comba", {"k": "unit ball", "d": "plain", "g": "negative", "beta": "unit interval"}),
        ("rwkv7", {"kappa": "plain", "alpha": "plain", "d": "real"}),
        # a vector read on one side of the rank-1 term only gates the key read on both
        ("gdn2", {"k": "unit ball", "b": "unit interval", "g": "negative", "w": "plain"}),
    ],
)
def test_ranges_come_from_the_facts(spec: str, domains: dict[str, str]) -> None:
    p = input_ranges(ROOT / "specs" / f"{spec}.mix")
    assert {n: p.range(n).domain for n in domains} == domains
    assert not p.notes


def test_ranges_do_not_depend_on_names() -> None:
    text = """mixer renamed
in    a1[Kk], b1[Kk], c1[Vv], d1, e1
state S[Vv, Kk]
S_t = exp(d1_t) S_{t-1} (I - e1_t b1_t b1_t^T) + e1_t c1_t b1_t^T
y_t = S_t a1_t
"""
    p = input_ranges(mixc.load_spec(text=text))
    assert {r.name: r.domain for r in p.ranges} == {
        "a1": "plain",
        "b1": "unit ball",
        "c1": "plain",
        "d1": "negative",
        "e1": "unit interval",
        "S": "state",
    }


def test_an_unprovable_decay_is_noted() -> None:
    text = (
        "mixer grows\nin q[K], k[K], v[V], a\nstate H[V, K]\n"
        "H_t = exp(a_t^2) H_{t-1} + v_t k_t^T\ny_t = H_t q_t\n"
    )
    p = input_ranges(mixc.load_spec(text=text))
    assert p.notes and "no input ranges provably satisfy" in p.notes[0]


def test_l2norm_sizes_are_at_least_two() -> None:
    text = "mixer m\nin q[K], k[K], v[V], b\nstate H[V, K]\nH_t = H_{t-1} (I - sigmoid(b_t) l2norm(k_t) l2norm(k_t)^T) + sigmoid(b_t) v_t l2norm(k_t)^T\ny_t = H_t q_t\n"
    p = input_ranges(mixc.load_spec(text=text))
    assert p.wide == {"K"}

    @settings(max_examples=30, database=None)
    @given(examples(p, max_size=3))
    def sizes(ex: Example) -> None:
        assert dict(ex.sizes)["K"] >= 2 and len({v for _, v in ex.sizes}) == 2

    sizes()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_exits_1(capsys) -> None:
    assert cli.main(["fuzz", str(ROOT / "specs/gla.mix"), "--device", "cuda"]) == 1
    assert "CUDA is not available" in capsys.readouterr().err
