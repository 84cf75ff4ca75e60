"""Malformed input: the front end either accepts it or raises a MixcError that points inside it.

Nothing else may escape (no IndexError from a bad span, no RecursionError from deep nesting, no
UnicodeError from junk bytes), and nothing may hang.
"""

import random
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import mixc
from mixc.errors import MixcError, Source, SpecError, SpecSyntaxError
from mixc.frontend.parser import MAX_SPEC_BYTES, decode
from tests.mixers import answered_within
from tests.strategies import small_mixers

ROOT = Path(__file__).resolve().parents[2]
SPEC_TEXTS = [p.read_text(encoding="utf-8") for p in sorted((ROOT / "specs").glob("*.mix"))]

# Pieces of the spec language, and near misses, to insert into valid specs.
VOCABULARY = [
    "mixer", "in", "param", "state", "let", "=", "(", ")", "[", "]", ",", "+", "-", "*", "/",
    "@", ".", "^", "^T", "ᵀ", "⊙", "·", "−", "_t", "_{t-1}", "_{t+1}", "_{t-2}", "_", "{", "}",
    "H", "q_t", "H_t", "H_{t-1}", "I", "h", "t", "exp(", "diag(", "l2norm(", "phi(", "sum", "lambda",
    "0", "1", "0.5", "1e999", "9" * 5000, '"', "#", "\n", "\r", "\r\n", "\\\n", "\t", " ", "\x00",
    "\ufeff", "а", "\u00a0", "\u2028", "\x85",
]  # fmt: skip

BAD_CHARACTERS = "\x00\x01\x0b\x1b\x7f\x85\r\t\x0c\u2028\ufeff\ud800"


def check(text: str) -> None:
    """load_spec on `text` succeeds, or raises a MixcError located inside `text`."""
    try:
        mixc.load_spec(Source(text))
    except SpecError as err:
        assert_located(err, text)
    except MixcError:
        pass


def assert_located(err: SpecError, text: str) -> None:
    lines = text.split("\n")
    line, column = err.span.line, err.span.column
    assert 1 <= line <= len(lines) + 1, (line, len(lines))
    length = len(lines[line - 1].removesuffix("\r")) if line <= len(lines) else 0
    assert 1 <= column <= length + 1, (line, column, length)
    assert err.span.end_line >= line
    assert str(err).startswith(f"<string>:{line}:{column}: ")


# ----------------------------------------------------------------------------- random text


@given(st.text())
def test_random_text(text: str) -> None:
    check(text)


@given(st.text(st.characters(codec=None, exclude_categories=())))
def test_random_unicode_with_surrogates_and_controls(text: str) -> None:
    check(text)


@given(st.text(st.sampled_from(BAD_CHARACTERS + "mixer inqH_t=()^T+-\n"), max_size=60))
def test_random_control_characters(text: str) -> None:
    check(text)


@given(st.binary(), st.sampled_from(["latin-1", "utf-8", "utf-16"]))
def test_binary_junk_decoded_arbitrarily(data: bytes, codec: str) -> None:
    check(data.decode(codec, "replace"))


@given(st.binary(max_size=300))
def test_binary_junk_as_file_contents(data: bytes) -> None:
    try:
        source = decode(data, "<string>")
    except SpecError as err:
        assert_located(err, data.decode("utf-8", "replace"))
        return
    check(source.text)


@given(st.text(max_size=30))
def test_load_spec_of_any_string(text: str) -> None:
    """Any str as a path, and as spec text: either way only MixcError comes out."""
    for how in ({"spec": text}, {"text": text}):
        try:
            mixc.load_spec(**how)
        except MixcError:
            pass


@given(st.lists(st.sampled_from(VOCABULARY), max_size=40).map(" ".join))
def test_random_token_soup(text: str) -> None:
    check("mixer m\n" + text)


# ----------------------------------------------------------------------------- edited specs


@st.composite
def edited_specs(draw) -> str:
    text = draw(st.sampled_from(SPEC_TEXTS))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["delete", "insert", "replace", "token", "swap"]))
        i = draw(st.integers(0, len(text)))
        if kind == "delete":
            text = text[:i] + text[i + draw(st.integers(1, 8)) :]
        elif kind == "insert":
            text = text[:i] + draw(st.sampled_from(VOCABULARY) | st.text(max_size=3)) + text[i:]
        elif kind == "replace":
            text = text[:i] + draw(st.characters()) + text[i + 1 :]
        elif kind == "token":  # delete, duplicate or replace one whitespace-separated token
            tokens = list(re.finditer(r"\S+", text))
            if tokens:
                m = draw(st.sampled_from(tokens))
                new = draw(st.sampled_from(["", m.group() + " " + m.group(), *VOCABULARY]))
                text = text[: m.start()] + new + text[m.end() :]
        else:
            lines = text.split("\n")
            a, b = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
            lines[a], lines[b] = lines[b], lines[a]
            text = "\n".join(lines)
    return text


@given(edited_specs())
def test_edited_specs(text: str) -> None:
    check(text)


# ----------------------------------------------------------------------------- random IR


@given(small_mixers)
def test_verify_of_random_ir(m) -> None:
    """IR built in code (no spans) is verified, or refused with a SpecError."""
    try:
        mixc.verify(m)
    except SpecError as err:
        assert str(err).startswith(f"<spec>:{err.span.line}:{err.span.column}: error: ")


@given(small_mixers)
def test_load_spec_of_printed_random_ir(m) -> None:
    check(str(m))


# ----------------------------------------------------------------------------- explicit cases

HEAD = "mixer m\nin q[K], k[K], v[V]\nstate H[V, K]\nH_t = H_{t-1} + v_t k_t^T\n"


def load_quickly(spec) -> mixc.Spec | MixcError:
    """load_spec of spec text (a str), a Source or a path, returning the MixcError it raised; it
    must take under 5 s."""
    with answered_within(what="load_spec"):
        try:
            return mixc.load_spec(text=spec) if isinstance(spec, str) else mixc.load_spec(spec)
        except MixcError as err:
            return err


def test_empty_file(tmp_path: Path) -> None:
    (tmp_path / "empty.mix").write_bytes(b"")
    err = load_quickly(tmp_path / "empty.mix")
    assert isinstance(err, SpecSyntaxError)
    assert err.message == "empty spec"


@pytest.mark.parametrize("text", ["", "   ", "\n\n", "# only\n# comments\n", "  # indented\n"])
def test_nothing_but_blanks_and_comments(text: str) -> None:
    err = load_quickly(Source(text))
    assert isinstance(err, SpecSyntaxError)
    assert err.message == "empty spec"


def test_huge_file(tmp_path: Path) -> None:
    path = tmp_path / "huge.mix"
    path.write_text(HEAD + "y_t = H_t q_t" + " + H_t q_t" * 1_000_000 + "\n", encoding="utf-8")
    assert path.stat().st_size > 10_000_000
    err = load_quickly(path)
    assert isinstance(err, SpecSyntaxError)
    assert err.message == f"spec is longer than {MAX_SPEC_BYTES:,} bytes"


def test_huge_text() -> None:
    err = load_quickly(HEAD + "y_t = H_t q_t" + " + H_t q_t" * 1_000_000 + "\n")
    assert isinstance(err, SpecSyntaxError)
    assert "longer than" in err.message


def test_ten_thousand_parentheses_around_a_name() -> None:
    spec = load_quickly(HEAD + "y_t = H_t " + "(" * 10_000 + "q_t" + ")" * 10_000 + "\n")
    assert isinstance(spec, mixc.Spec)
    assert spec.mixer == mixc.load_spec(text=HEAD + "y_t = H_t q_t\n").mixer


def test_five_thousand_nested_sums() -> None:
    text = HEAD + "y_t = H_t " + "(" * 5_000 + "q_t" + " + q_t)" * 5_000 + "\n"
    err = load_quickly(text)
    assert isinstance(err, SpecSyntaxError)
    assert err.message.startswith("expression nested too deeply")
    assert_located(err, text)


@pytest.mark.parametrize("terms", [5_000, 100_000])
def test_long_sums(terms: int) -> None:
    text = HEAD + "y_t = H_t q_t" + " + H_t q_t" * terms + "\n"
    err = load_quickly(text)
    assert isinstance(err, SpecSyntaxError)
    assert err.message.startswith(("expression nested too deeply", "spec is longer than"))
    assert_located(err, text)


@pytest.mark.parametrize("minus", ["-", "- ", "−"])
def test_fifty_thousand_unary_minuses(minus: str) -> None:
    text = HEAD + "y_t = H_t " + minus * 50_000 + "q_t\n"
    err = load_quickly(text)
    assert isinstance(err, SpecSyntaxError)
    assert err.message.startswith(("expression nested too deeply", "spec is longer than"))
    assert_located(err, text)
    assert max(len(line) for line in str(err).splitlines()) < 200  # a window, not the whole line


def test_deep_power_tower() -> None:
    text = HEAD + "y_t = H_t q_t * 2" + "^2" * 5_000 + "\n"
    err = load_quickly(text)
    assert isinstance(err, SpecSyntaxError)
    assert_located(err, text)


def test_long_chain_of_lets() -> None:
    lets = "".join(f"let f{i}(x) = f{i - 1}(x) + 1\n" for i in range(1, 2_000))
    text = HEAD + "let f0(x) = x\n" + lets + "y_t = f1999(1) H_t q_t\n"
    err = load_quickly(text)
    assert isinstance(err, SpecSyntaxError)
    assert err.message.startswith("expression nested too deeply")


@pytest.mark.parametrize("body", ["f(x)", "g(x)"])
def test_recursive_lets(body: str) -> None:
    err = load_quickly(HEAD + f"let f(x) = {body}\nlet g(x) = f(x)\ny_t = f(1) H_t q_t\n")
    assert isinstance(err, SpecError)


def test_binary_junk_file(tmp_path: Path) -> None:
    path = tmp_path / "junk.mix"
    path.write_bytes(random.Random(0).randbytes(4096))
    err = load_quickly(path)
    assert isinstance(err, SpecSyntaxError)
    assert err.message.startswith("spec is not UTF-8 text")


def test_invalid_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.mix"
    path.write_bytes("mixer m\nin café\n".encode("latin-1"))
    err = load_quickly(path)
    assert isinstance(err, SpecSyntaxError)
    assert (err.span.line, err.span.column) == (2, 7)
    assert str(err).startswith(
        f"{path}:2:7: error: spec is not UTF-8 text (byte 0xe9 at offset 14)"
    )


def test_utf8_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "bom.mix"
    path.write_bytes(b"\xef\xbb\xbf" + (ROOT / "specs" / "deltanet.mix").read_bytes())
    assert load_quickly(path).mixer == mixc.load_spec(ROOT / "specs" / "deltanet.mix").mixer


@pytest.mark.parametrize("nul", ["\x00", "q\x00", "\x00\x00\x00"])
def test_nul_bytes(nul: str, tmp_path: Path) -> None:
    text = HEAD + f"y_t = H_t {nul}q_t\n"
    err = load_quickly(Source(text))
    assert isinstance(err, SpecSyntaxError)
    assert err.message == "control character U+0000 in the spec"
    assert_located(err, text)
    (tmp_path / "nul.mix").write_text(text, encoding="utf-8")
    assert isinstance(load_quickly(tmp_path / "nul.mix"), SpecSyntaxError)


def test_nul_in_a_path_like_string() -> None:
    assert type(load_quickly(Path("specs/\x00.mix"))) is MixcError


def test_cyrillic_confusable() -> None:
    text = HEAD + "y_t = H_t q_t\nz_t = \u0430_t\n"  # Cyrillic a
    err = load_quickly(Source(text))
    assert isinstance(err, SpecSyntaxError)
    assert (err.span.line, err.span.column) == (6, 7)
    assert err.hint == "type a instead"


@pytest.mark.parametrize("ending", ["\r", "\u2028", "\x85", "\x0c\n"])
def test_unusual_line_endings_keep_line_numbers(ending: str) -> None:
    text = "mixer m" + ending + "in q\ny_t = r_t\n"
    err = load_quickly(Source(text))
    assert isinstance(err, SpecError)
    assert_located(err, text)


def test_huge_integer_literal() -> None:
    # exact however long, within float64, which the generated code computes in
    spec = load_quickly(HEAD + "y_t = " + "0" * 10 + "9" * 300 + " H_t q_t\n")
    assert isinstance(spec, mixc.Spec)
    assert str(spec.mixer).endswith("y_t = " + "9" * 300 + " H_t q_t\n")
    text = HEAD + "y_t = " + "0" * 10 + "9" * 5_000 + " H_t q_t\n"
    err = load_quickly(Source(text))
    assert isinstance(err, SpecSyntaxError)
    assert err.message == "number 00000000009999999999... (5,010 digits) is too large"
    assert_located(err, text)


def test_huge_float_literal() -> None:
    err = load_quickly(Source(HEAD + "y_t = 1e999 H_t q_t\n"))
    assert isinstance(err, SpecSyntaxError)
    assert err.message == "number 1e999 is too large"


@pytest.mark.parametrize(
    "text",
    [
        "mixer m\nin q\ny_t = q_{t-" + "9" * 5_000 + "}\n",
        "mixer m\nin q\ny_{t-" + "9" * 5_000 + "} = q_t\n",
        "mixer m\nin q\ny_t = q_{t - 1234567}\n",
    ],
    ids=["in an expression", "on the left", "seven digits"],
)
def test_huge_time_offset(text: str) -> None:
    err = load_quickly(Source(text))
    assert isinstance(err, SpecSyntaxError)
    assert err.message == "time offset too large"
    assert_located(err, text)


def test_huge_size() -> None:
    err = load_quickly("mixer m\nin q[" + "9" * 5_000 + "]\ny_t = q_t\n")
    assert isinstance(err, SpecError)  # quickly: compared as text, never converted
    assert err.message == "size 99999999999999999999... (5,000 digits) of q is too large"
    err = load_quickly("mixer m\nin q[000]\ny_t = q_t\n")
    assert isinstance(err, SpecError)
    assert err.message == "size 000 of q must be at least 1"


def test_names_that_start_like_keywords() -> None:
    spec = load_quickly("mixer m\nin q, inq\nparam g, paramx\nparamy_t = g paramx q_t inq_t\n")
    assert isinstance(spec, mixc.Spec)


@pytest.mark.parametrize("size", ["99999999999999999999999", "65537", "0065537"])
def test_a_literal_size_out_of_range_is_located(size):
    """q[99999999999999999999999] passed check and then crashed fuzz, bench, synth and
    MixerLayer allocating it: refused where it is declared, with the largest size allowed."""
    head = "mixer m\nin q[{}], k[4], v[4]\nstate H[4, 4]\n"
    text = head.format(size) + "H_t = H_{t-1} + v_t k_t^T\ny_t = H_t k_t\n"
    with pytest.raises(mixc.MixcError, match=rf"^<string>:2:4: error: size {size} of q is too"):
        mixc.load_spec(text=text)
    mixc.load_spec(text=text.replace(f"q[{size}]", "q[65536]"))  # the largest is fine
