"""The shipped specs are the test matrix: each parses, verifies, prints and parses back, and
`mixc check` accepts them. Also: the CLI's exit codes, and Unicode spellings."""

from pathlib import Path

import pytest

import mixc
from mixc import load_spec, parse
from tests.mixers import run_mixc

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted((ROOT / "specs").glob("*.mix"))


def test_specs_are_shipped() -> None:
    assert len(SPECS) >= 9


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_spec_parses_and_verifies(path: Path) -> None:
    spec = load_spec(path)
    assert spec.mixer.name == path.stem
    assert spec.mixer.equations
    assert set(spec.shapes) == {eq.target for eq in spec.mixer.equations}


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_spec_round_trips(path: Path) -> None:
    mixer = load_spec(path).mixer
    text = str(mixer)
    assert parse(text) == mixer
    assert str(parse(text)) == text
    assert load_spec(text=text).mixer == mixer  # the printed form verifies too


def test_check_accepts_every_spec() -> None:
    result = run_mixc("check", *(str(p.relative_to(ROOT)) for p in SPECS))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    for path in SPECS:
        assert f"# {path.relative_to(ROOT)}: ok" in result.stdout


def test_check_prints_the_normal_form() -> None:
    result = run_mixc("check", "specs/deltanet.mix")
    assert result.returncode == 0
    normal = result.stdout.split("\n", 1)[1]
    assert normal == str(load_spec(ROOT / "specs" / "deltanet.mix").mixer)


def test_check_reports_a_bad_spec_without_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.mix"
    bad.write_text("mixer bad\nin q[K]\ny_t = q_t +\n", encoding="utf-8")
    result = run_mixc("check", "bad.mix", str(ROOT / "specs" / "gla.mix"), cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith("bad.mix:3:12: error: unexpected end of line\n")
    assert "  3 | y_t = q_t +\n" in result.stderr
    assert "Traceback" not in result.stderr
    assert "gla.mix: ok" in result.stdout  # the good spec after it is still checked


def test_check_reports_a_missing_file() -> None:
    result = run_mixc("check", "-q", "no/such/spec.mix")
    assert result.returncode == 1
    assert result.stderr == "no/such/spec.mix: no such spec file\n"
    assert result.stdout == ""


@pytest.mark.parametrize(
    "args", [[], ["check"], ["frobnicate", "x.mix"], ["check", "--bogus", "x"]]
)
def test_usage_error_exits_2(args: list[str]) -> None:
    result = run_mixc(*args)
    assert result.returncode == 2
    assert result.stderr.startswith("usage: mixc")
    assert "Traceback" not in result.stderr


UNICODE_PAIRS = [
    # ⊙ is *, · is ., ᵀ is ^T, − is -, and a @ b is the juxtaposition a b
    ("H_t = G_t ⊙ H_{t-1} + v_t k_tᵀ", "H_t = G_t * H_{t-1} + v_t k_t^T"),
    ("H_t = H_{t−1} + v_t k_t^T", "H_t = H_{t-1} + v_t k_t^T"),
    ("H_t = H_{t-1} − v_t k_t^T", "H_t = H_{t-1} - v_t k_t^T"),
    ("H_t = −H_{t-1} + v_t k_t^T", "H_t = -H_{t-1} + v_t k_t^T"),
    ("H_t = H_{t-1} + (v_t · q_t) v_t k_t^T", "H_t = H_{t-1} + (v_t . q_t) v_t k_t^T"),
    ("H_t = H_{t-1} + v_t @ k_t^T", "H_t = H_{t-1} + v_t k_t^T"),
    ("H_t = H_{t-1} @ (I - v_t @ k_t^T)", "H_t = H_{t-1} (I - v_t k_t^T)"),
    ("H_t = 2^(−1) H_{t-1} + v_t k_t^T", "H_t = 2^(-1) H_{t-1} + v_t k_t^T"),
]


@pytest.mark.parametrize(("fancy", "plain"), UNICODE_PAIRS)
def test_unicode_and_ascii_spellings_agree(fancy: str, plain: str) -> None:
    head = "mixer m\nin q[K], k[K], v[K], G[K, K]\nstate H[K, K]\n"
    tail = "\ny_t = H_t q_t\n"
    assert parse(head + fancy + tail) == parse(head + plain + tail)
    assert load_spec(text=head + fancy + tail).mixer == load_spec(text=head + plain + tail).mixer


def test_shipped_unicode_spec_matches_its_ascii_spelling() -> None:
    path = ROOT / "specs" / "gated_general.mix"
    text = path.read_text(encoding="utf-8")
    assert "⊙" in text
    assert load_spec(text=text.replace("⊙", "*")).mixer == load_spec(path).mixer


def test_version() -> None:
    result = run_mixc("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"mixc {mixc.__version__}"


# ----------------------------------------------------------------------------- paths and text


def test_a_str_is_always_a_path_and_text_is_said_so(tmp_path: Path, monkeypatch) -> None:
    """A file named like spec text is read as a file, not parsed as its own name; text comes as
    text=; a Source passes through; load, load_spec and compile_source agree."""
    deltanet = (ROOT / "specs" / "deltanet.mix").read_text(encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    for name in ("mixer la.mix", "mixer la\nin q.mix"):
        (tmp_path / name).write_text(deltanet, encoding="utf-8")
        assert load_spec(name).source == mixc.Source(deltanet, name)
        assert load_spec(tmp_path / name).mixer.name == "deltanet"
        assert mixc.load(name).SPEC == deltanet
    given = mixc.Source(deltanet, "given.mix")
    assert load_spec(given).source is given
    assert load_spec(text=deltanet).source == mixc.Source(deltanet, "<string>")
    assert mixc.load(text=deltanet).SPEC == deltanet
    assert mixc.compile_source(text=deltanet) == mixc.compile_source(mixc.Source(deltanet))
    assert mixc.load(load_spec(given)) is mixc.load(given)


def test_spec_text_given_as_a_path_says_how_to_give_text() -> None:
    with pytest.raises(mixc.MixcError, match=r"no such spec file \(to give spec text rather"):
        load_spec("mixer m\nin q[K]\n")
    with pytest.raises(mixc.MixcError, match=r"no such spec file$"):
        load_spec("no/such.mix")


@pytest.mark.parametrize(
    "call",
    [
        lambda: load_spec(),
        lambda: load_spec("a.mix", text="mixer m"),
        lambda: load_spec(3),
        lambda: load_spec(text=b"mixer m"),
        lambda: mixc.load(),
    ],
    ids=["neither", "both", "a number", "bytes as text", "load with neither"],
)
def test_a_spec_is_a_path_a_source_or_text_exactly_once(call) -> None:
    with pytest.raises(TypeError):
        call()
