"""The exact text of the front end's error messages, one snapshot per kind of mistake.

Each message was read as a newcomer would read it: it names the place (file:line:col), echoes the
line with a caret under the problem, and says what was expected and how to fix it. A change to any
of these texts should be deliberate: update the snapshot in the same commit.
"""

from pathlib import Path

import pytest

import mixc
from mixc.errors import (
    NotYetImplemented,
    Source,
    SpecAnalysisError,
    SpecError,
    SpecNameError,
    SpecShapeError,
    SpecSyntaxError,
)

HEAD = "mixer m\nin q[K], k[K], v[V], beta\nstate H[V, K]\n"  # lines 1-3
UPDATE = "H_t = H_{t-1} + v_t k_t^T\n"
OUTPUT = "y_t = H_t q_t\n"


def error_of(spec) -> SpecError:
    """The error of loading `spec`: spec text (a str), a Source or a path."""
    with pytest.raises(SpecError) as info:
        mixc.load_spec(text=spec) if isinstance(spec, str) else mixc.load_spec(spec)
    return info.value


def test_the_common_spec_is_valid() -> None:
    mixc.load_spec(text=HEAD + UPDATE + OUTPUT)


CASES = [
    pytest.param(
        HEAD + UPDATE + "y_t = H_t qq_t\n",
        SpecNameError,
        """\
<string>:5:11: error: undefined name qq
  5 | y_t = H_t qq_t
    |           ^^^^
  expected: a declared input or state, or a per-token value defined by an equation
  hint: did you mean q_t?""",
        id="undefined_name",
    ),
    pytest.param(
        HEAD + "H_t = H_{t-1} + v_t k_t\n" + OUTPUT,
        SpecShapeError,
        """\
<string>:4:17: error: cannot multiply v_t [V] by k_t [K]
  4 | H_t = H_{t-1} + v_t k_t
    |                 ^^^^^^^
  expected: a matrix product whose inner sizes agree (v_t has 1 column, k_t has K rows)
  hint: v_t and k_t are both vectors; did you mean v_t k_t^T?""",
        id="missing_transpose",
    ),
    pytest.param(
        HEAD + "H_t = H_t + v_t k_t^T\n" + OUTPUT,
        SpecAnalysisError,
        """\
<string>:4:7: error: H_t on the right-hand side of its own update
  4 | H_t = H_t + v_t k_t^T
    |       ^^^
  hint: did you mean H_{t-1}?""",
        id="state_on_its_own_right_hand_side",
    ),
    pytest.param(
        HEAD + "H_t = H_{t-1} + v_{t+1} k_t^T\n" + OUTPUT,
        SpecAnalysisError,
        """\
<string>:4:17: error: v_{t+1} refers to a later token
  4 | H_t = H_{t-1} + v_{t+1} k_t^T
    |                 ^^^^^^^
  hint: read inputs and per-token values at t; a mixer reads later tokens through a backward state (G_t = a_t G_{t+1} + v_t k_t^T, read as G_t or G_{t+1})""",
        id="input_at_a_later_token",
    ),
    pytest.param(
        HEAD + "H_t = H_{t-1} + v_t k_t^T\ny_t = H_{t+1} q_t\n",
        SpecAnalysisError,
        """\
<string>:5:7: error: H_{t+1} refers to a later token, but H runs forward in time (its update does not read H_{t+1})
  5 | y_t = H_{t+1} q_t
    |       ^^^^^^^
  hint: read H_t or H_{t-1}; to read later tokens, declare a backward state: G_t = a_t G_{t+1} + v_t k_t^T""",
        id="forward_state_at_a_later_token",
    ),
    pytest.param(
        HEAD + "H_t = H_{t+1} + v_t k_t^T\ny_t = H_{t-1} q_t\n",
        NotYetImplemented,
        """\
<string>:5:7: error: NYI: H_{t-1}: H runs backward in time (its update reads H_{t+1}); a backward state is read at t or t+1
  5 | y_t = H_{t-1} q_t
    |       ^^^^^^^
  hint: did you mean H_{t+1}?""",
        id="backward_state_at_an_earlier_token",
    ),
    pytest.param(
        "mixer m\nin q[K], k[K], v[V]\nstate H[V, K], z[K]\n" + UPDATE + OUTPUT,
        SpecNameError,
        """\
<string>:3:16: error: state z has no update
  3 | state H[V, K], z[K]
    |                ^^^^
  expected: an equation z_t = ... z_{t-1} ...""",
        id="state_without_update",
    ),
    pytest.param(
        "mixer m\nin q[K], k[K], v[V], q\nstate H[V, K]\n" + UPDATE + OUTPUT,
        SpecNameError,
        """\
<string>:2:22: error: q is already declared as an input
  2 | in q[K], k[K], v[V], q
    |                      ^
  hint: the first is at line 2; rename one of them""",
        id="duplicate_declaration",
    ),
    pytest.param(
        HEAD + UPDATE + "H_t = beta_t H_{t-1}\n" + OUTPUT,
        SpecNameError,
        """\
<string>:5:1: error: second update of H
  5 | H_t = beta_t H_{t-1}
    | ^^^^^^^^^^^^^^^^^^^^
  hint: the first is at line 4; combine them into one equation""",
        id="duplicate_update",
    ),
    pytest.param(
        "mixer m\nin dt[P], x[P], k[N]\nstate H[P, N]\nH_t = H_{t-1} + (dt_t x_t) k_t^T\n"
        "y_t = H_t k_t\n",
        SpecShapeError,
        """\
<string>:4:18: error: cannot multiply dt_t [P] by x_t [P]
  4 | H_t = H_{t-1} + (dt_t x_t) k_t^T
    |                  ^^^^^^^^
  expected: a matrix product whose inner sizes agree (dt_t has 1 column, x_t has P rows)
  hint: dt_t and x_t are both vectors [P]; did you mean dt_t * x_t (elementwise, [P]) or \
dt_t x_t^T (an outer product, [P, P])?""",
        id="two_vectors_of_one_size",
    ),
    pytest.param(
        "mixer m\nin q[K], k[K], v[V]\nstate H[V, K]\nH_t = H_{t-1} + v_t k_t^T\ny_t = H_t v_t\n",
        SpecShapeError,
        """\
<string>:5:7: error: cannot multiply H_t [V, K] by v_t [V]
  5 | y_t = H_t v_t
    |       ^^^^^^^
  expected: a matrix product whose inner sizes agree (H_t has K columns, v_t has V rows)
  hint: v_t has as many rows as H_t; did you mean H_t^T v_t?""",
        id="matrix_times_a_vector_of_its_rows",
    ),
    pytest.param(
        HEAD + "param lambda\n" + UPDATE + OUTPUT,
        SpecNameError,
        """\
<string>:4:7: error: 'lambda' is reserved (a Python keyword)
  4 | param lambda
    |       ^^^^^^
  hint: rename it, e.g. lambda1 or my_lambda""",
        id="reserved_keyword",
    ),
    pytest.param(
        HEAD + "param chunk_size\n" + UPDATE + OUTPUT,
        SpecNameError,
        """\
<string>:4:7: error: 'chunk_size' is reserved (a keyword argument of the compiled forms)
  4 | param chunk_size
    |       ^^^^^^^^^^
  hint: rename it, e.g. chunk_size1 or my_chunk_size""",
        id="reserved_form_option",
    ),
    pytest.param(
        HEAD + "param exp\n" + UPDATE + OUTPUT,
        SpecNameError,
        """\
<string>:4:7: error: 'exp' is reserved (a built-in function of the language)
  4 | param exp
    |       ^^^
  hint: rename it, e.g. exp1 or my_exp""",
        id="reserved_function",
    ),
    pytest.param(
        HEAD + "H_t = sigmoidd(beta_t) H_{t-1} + v_t k_t^T\n" + OUTPUT,
        SpecNameError,
        """\
<string>:4:7: error: unknown function sigmoidd
  4 | H_t = sigmoidd(beta_t) H_{t-1} + v_t k_t^T
    |       ^^^^^^^^
  expected: a built-in (exp, log, sigmoid, logsigmoid, softplus, silu, elu, relu, tanh, sqrt, abs, max, min, sum, l2norm, diag, floor, cos, sin, softmax, onehot_argmax, stop_gradient, rotate, rotate_interleaved, rotate_halves) or a let function
  hint: did you mean sigmoid?""",
        id="unknown_function",
    ),
    pytest.param(
        HEAD + "H_t = exp(beta_t, beta_t) H_{t-1} + v_t k_t^T\n" + OUTPUT,
        SpecShapeError,
        """\
<string>:4:7: error: exp takes 1 argument, got 2
  4 | H_t = exp(beta_t, beta_t) H_{t-1} + v_t k_t^T
    |       ^^^^^^^^^^^^^^^^^^^
  expected: exp(x)""",
        id="wrong_arity",
    ),
    pytest.param(
        HEAD + UPDATE + "y_t = H_t q_t + k_t\n",
        SpecShapeError,
        """\
<string>:5:7: error: cannot add H_t q_t [V] and k_t [K]
  5 | y_t = H_t q_t + k_t
    |       ^^^^^^^^^^^^^
  expected: operands of the same shape, or one that broadcasts (a scalar, row or column)""",
        id="add_of_different_shapes",
    ),
    pytest.param(
        HEAD + "H_t = H_{t-1} diag(H_{t-1}) + v_t k_t^T\n" + OUTPUT,
        SpecShapeError,
        """\
<string>:4:15: error: diag needs a vector, got [V, K]
  4 | H_t = H_{t-1} diag(H_{t-1}) + v_t k_t^T
    |               ^^^^^^^^^^^^^
  expected: diag(g_t) with g[K]""",
        id="diag_of_a_matrix",
    ),
    pytest.param(
        HEAD + UPDATE + "y_t = (H_t . q_t) v_t\n",
        SpecShapeError,
        """\
<string>:5:8: error: a dot product needs two vectors, got [V, K] . [K]
  5 | y_t = (H_t . q_t) v_t
    |        ^^^^^^^^^
  hint: for a matrix product, write them side by side: H_t q_t""",
        id="dot_of_a_matrix",
    ),
    pytest.param(
        HEAD + "H_t = H_{t-1} + k_t v_t^T\n" + OUTPUT,
        SpecShapeError,
        """\
<string>:4:7: error: cannot add H_{t-1} [V, K] and k_t v_t^T [K, V]
  4 | H_t = H_{t-1} + k_t v_t^T
    |       ^^^^^^^^^^^^^^^^^^^
  expected: operands of the same shape, or one that broadcasts (a scalar, row or column)
  hint: k_t v_t^T is [K, V], the transpose of [V, K]; did you mean H_{t-1} + (k_t v_t^T)^T?""",
        id="transposed_update",
    ),
    pytest.param(
        HEAD + "H_t = H_{t-1} + + v_t k_t^T\n" + OUTPUT,
        SpecSyntaxError,
        """\
<string>:4:17: error: unexpected '+'
  4 | H_t = H_{t-1} + + v_t k_t^T
    |                 ^
  expected: one of '(', '-', a function call, a name, a number""",
        id="unexpected_token",
    ),
    pytest.param(
        HEAD + "H_t = H_{t-1} +\n" + OUTPUT,
        SpecSyntaxError,
        """\
<string>:4:16: error: unexpected end of line
  4 | H_t = H_{t-1} +
    |                ^
  expected: one of '(', '-', a function call, a name, a number
  hint: a line break ends a statement; to go on, end the line with \\""",
        id="unexpected_end_of_line",
    ),
    pytest.param(
        HEAD + UPDATE + "y_t = (H_t q_t",
        SpecSyntaxError,
        """\
<string>:5:15: error: unexpected end of file
  5 | y_t = (H_t q_t
    |               ^
  expected: ')'""",
        id="unexpected_end_of_file",
    ),
    pytest.param(
        HEAD + "H_t = H_{t-1} + v_t k_t^T $\n" + OUTPUT,
        SpecSyntaxError,
        """\
<string>:4:27: error: unexpected character '$'
  4 | H_t = H_{t-1} + v_t k_t^T $
    |                           ^
  expected: one of '(', '*', '+', '-', '.', '/', '@', '^', ^T, a function call, a name, a number, end of file, end of line""",
        id="bad_character",
    ),
    pytest.param(
        HEAD + UPDATE + "y_t = H_t q_t\nz_t = \u0430_t\n",
        SpecSyntaxError,
        """\
<string>:6:7: error: unexpected character 'а' (U+0430 CYRILLIC SMALL LETTER A)
  6 | z_t = а_t
    |       ^
  expected: ASCII names; the only non-ASCII symbols are ⊙ · ᵀ −
  hint: type a instead""",
        id="confusable_unicode",
    ),
    pytest.param(
        HEAD + "H_t = H_{t-1} \u2013 v_t k_t^T\n" + OUTPUT,
        SpecSyntaxError,
        """\
<string>:4:15: error: unexpected character '–' (U+2013 EN DASH)
  4 | H_t = H_{t-1} – v_t k_t^T
    |               ^
  expected: ASCII names; the only non-ASCII symbols are ⊙ · ᵀ −
  hint: type - instead""",
        id="en_dash",
    ),
    pytest.param(
        "",
        SpecSyntaxError,
        """\
<string>:1:1: error: empty spec
  expected: a header line: mixer NAME
  hint: a spec starts with `mixer my_mixer "what it is"`""",
        id="empty_spec",
    ),
    pytest.param(
        "# a spec\n# with nothing in it\n",
        SpecSyntaxError,
        """\
<string>:1:1: error: empty spec
  1 | # a spec
    | ^
  expected: a header line: mixer NAME
  hint: a spec starts with `mixer my_mixer "what it is"`""",
        id="only_comments",
    ),
    pytest.param(
        "in q[K]\n",
        SpecSyntaxError,
        """\
<string>:1:1: error: unexpected 'in'
  1 | in q[K]
    | ^^
  expected: one of 'mixer', end of line
  hint: a spec starts with its header line: mixer NAME "description\"""",
        id="no_header",
    ),
    pytest.param(
        "mixer m\nin q[K], k[K], v[V]\nparam g\nstate H[V, K]\nH_t = g_t H_{t-1} + v_t k_t^T\n"
        + OUTPUT,
        SpecNameError,
        """\
<string>:5:7: error: g is a per-head parameter and has no time index
  5 | H_t = g_t H_{t-1} + v_t k_t^T
    |       ^^^
  hint: write g""",
        id="time_index_on_a_parameter",
    ),
    pytest.param(
        HEAD + "H_t = H_{t-1} + v k_t^T\n" + OUTPUT,
        SpecNameError,
        """\
<string>:4:17: error: v is per token and needs a time index
  4 | H_t = H_{t-1} + v k_t^T
    |                 ^
  hint: did you mean v_t?""",
        id="input_without_time_index",
    ),
    pytest.param(
        HEAD + "H_{t-1} = H_{t-1} + v_t k_t^T\n" + OUTPUT,
        SpecSyntaxError,
        """\
<string>:4:1: error: the left-hand side must be at time t, not H_{t-1}
  4 | H_{t-1} = H_{t-1} + v_t k_t^T
    | ^^^^^^^
  expected: H_t = ...
  hint: an update defines the new value from the old: H_t = ... H_{t-1} ...""",
        id="previous_state_on_the_left",
    ),
    pytest.param(
        HEAD + UPDATE + "y_t = H_t q_t" + " + q_t" * 200 + "\n",
        SpecSyntaxError,
        """\
<string>:5:7: error: expression nested too deeply (more than 200 levels)
  5 | y_t = H_t q_t + q_t + q_t + q_t + q_t + q_t + q_t + q_t + q_t + q_t + q_t + q_t + q_t + q_t + q_t + ...
    |       ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  hint: parenthesise a long sum or product: (a + b) + (c + d) nests less than a + b + c + d""",
        id="nested_too_deeply",
    ),
    pytest.param(
        HEAD + "let f(x) = f(x) + 1\n" + UPDATE + OUTPUT,
        SpecNameError,
        """\
<string>:4:12: error: f calls itself; let functions cannot be recursive
  4 | let f(x) = f(x) + 1
    |            ^""",
        id="let_calls_itself",
    ),
    pytest.param(
        HEAD + UPDATE + "y_t = y_t + H_t q_t\n",
        SpecAnalysisError,
        """\
<string>:5:7: error: y_t on the right-hand side of its own definition
  5 | y_t = y_t + H_t q_t
    |       ^^^
  hint: a per-token value cannot depend on itself; carry it in a state""",
        id="value_reads_itself",
    ),
    pytest.param(
        HEAD + "H_t = H_{t-1} + v_t k_{t-2}^T\n" + OUTPUT,
        NotYetImplemented,
        """\
<string>:4:21: error: NYI: k at t-2: an input is read at t or t-1
  4 | H_t = H_{t-1} + v_t k_{t-2}^T
    |                     ^^^^^^^
  hint: to use an older token, keep it in a state""",
        id="input_two_tokens_back",
    ),
    pytest.param(
        HEAD + "a_t = 2 k_{t-1}\nH_t = H_{t-1} + v_t a_{t-1}^T\n" + OUTPUT,
        NotYetImplemented,
        """\
<string>:5:21: error: NYI: a_{t-1}: a_t reads k_{t-1} (line 4), which one token earlier is k at \
t-2: no form carries two tokens back
  5 | H_t = H_{t-1} + v_t a_{t-1}^T
    |                     ^^^^^^^
  hint: keep a in a state""",
        id="value_at_t_minus_1_reading_t_minus_1",
    ),
    pytest.param(
        HEAD + "a_t = 2 k_t\nH_t = H_{t-1} + v_t a_{t-2}^T\n" + OUTPUT,
        NotYetImplemented,
        """\
<string>:5:21: error: NYI: a at t-2: a per-token value is read at t or t-1
  5 | H_t = H_{t-1} + v_t a_{t-2}^T
    |                     ^^^^^^^
  hint: to use an older token, keep it in a state""",
        id="value_at_t_minus_2",
    ),
    pytest.param(
        HEAD + "o_t = H_{t-1} q_t\nH_t = H_{t-1} + o_{t-1} k_t^T\n" + OUTPUT,
        NotYetImplemented,
        """\
<string>:5:17: error: NYI: o_{t-1}: o_t reads H_{t-1} (line 4), which one token earlier is H at \
t-2: no form carries two tokens back
  5 | H_t = H_{t-1} + o_{t-1} k_t^T
    |                 ^^^^^^^
  hint: keep o in a state""",
        id="readout_of_the_previous_state_at_t_minus_1",
    ),
    pytest.param(
        HEAD + UPDATE + "y_t = H_t\x1b q_t\n",
        SpecSyntaxError,
        """\
<string>:5:10: error: control character U+001B in the spec
  5 | y_t = H_t? q_t
    |          ^
  hint: is this the right file? specs are plain text""",
        id="control_character",
    ),
    pytest.param(
        HEAD + UPDATE + "y_t =\tH_t\tqq_t\n",
        SpecNameError,
        """\
<string>:5:11: error: undefined name qq
  5 | y_t =\tH_t\tqq_t
    |      \t   \t^^^^
  expected: a declared input or state, or a per-token value defined by an equation
  hint: did you mean q_t?""",
        id="tab_before_the_error",
    ),
    pytest.param(
        "mixer m\x0c\nin q[K], k[K], v[V]\x0c\nstate H[V, K]\n" + UPDATE + "y_t = H_t qq_t\n",
        SpecNameError,
        """\
<string>:5:11: error: undefined name qq
  5 | y_t = H_t qq_t
    |           ^^^^
  expected: a declared input or state, or a per-token value defined by an equation
  hint: did you mean q_t?""",
        id="form_feed_keeps_lines",
    ),
    pytest.param(
        HEAD + UPDATE + "y_t = H_t q_t in\n",
        SpecNameError,
        """\
<string>:5:15: error: undefined name in
  5 | y_t = H_t q_t in
    |               ^^
  expected: a declared input, parameter or state, or a let argument
  hint: `in` is a keyword that starts a line""",
        id="keyword_as_a_name",
    ),
    pytest.param(
        "mixer m\nin q[K]\nparam g = q_t\ny_t = g q_t\n",
        SpecNameError,
        """\
<string>:3:11: error: a parameter default cannot use the per-token q
  3 | param g = q_t
    |           ^^^
  hint: defaults may use numbers and the head index h; per-token values go in `in`""",
        id="parameter_default_reads_a_token",
    ),
    pytest.param(
        HEAD + "let f(x) = x k_t\n" + UPDATE + "y_t = f(H_t q_t)\n",
        SpecNameError,
        """\
<string>:4:14: error: let f cannot read k_t: a let sees only its arguments and parameters
  4 | let f(x) = x k_t
    |              ^^^
  hint: pass k_t to f as an argument""",
        id="let_reads_a_token",
    ),
    pytest.param(
        "mixer m\nin q[1.5]\ny_t = q_t\n",
        SpecShapeError,
        """\
<string>:2:4: error: size 1.5 of q is not a whole number
  2 | in q[1.5]
    |    ^^^^^^
  hint: a size is a name, like K, or a whole number, like 64""",
        id="size_not_a_whole_number",
    ),
    pytest.param(
        HEAD + "H_t = H_{t-1} + v_t k_{t-1000000}^T\n" + OUTPUT,
        SpecSyntaxError,
        """\
<string>:4:22: error: time offset too large
  4 | H_t = H_{t-1} + v_t k_{t-1000000}^T
    |                      ^^^^^^^^^^^^
  hint: a mixer reads tokens at t, states at t-1""",
        id="time_offset_too_large",
    ),
]


@pytest.mark.parametrize(("spec", "kind", "message"), CASES)
def test_message(spec: str, kind: type, message: str) -> None:
    err = error_of(Source(spec))
    assert type(err) is kind
    assert str(err) == message


def test_messages_are_distinct() -> None:
    firsts = [p.values[2].split("\n")[0].split(" error: ")[1] for p in CASES]
    assert len(CASES) >= 20
    assert len(set(firsts)) >= 20


def test_not_utf8(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bad.mix").write_bytes(b"mixer m\nin q, \xff\xfe[K]\n")
    monkeypatch.chdir(tmp_path)
    assert (
        str(error_of(Path("bad.mix")))
        == """\
bad.mix:2:7: error: spec is not UTF-8 text (byte 0xff at offset 14)
  2 | in q, \ufffd\ufffd[K]
    |       ^
  hint: is this the right file? specs are plain text files, usually *.mix"""
    )


def test_too_long(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Located at the first character past the limit (the file is read no further)."""
    (tmp_path / "big.mix").write_text(HEAD + "# padding\n" * 10_000, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert (
        str(error_of(Path("big.mix")))
        == """\
big.mix:6399:3: error: spec is longer than 64,000 bytes
  6399 | # p
       |   ^
  hint: is this the right file? a spec is a few lines of text"""
    )


def test_a_long_line_is_shown_around_the_error() -> None:
    spec = (
        HEAD
        + UPDATE
        + "y_t = H_t q_t"
        + " + H_t q_t" * 20
        + " + H_t qq_t"
        + " + H_t q_t" * 20
        + "\n"
    )
    assert (
        str(error_of(Source(spec)))
        == """\
<string>:5:221: error: undefined name qq
  5 | ...q_t + H_t q_t + H_t q_t + H_t q_t + H_t q_t + H_t qq_t + H_t q_t + H_t q_t + H_t q_t + H_t q_t + H_t...
    |                                                      ^^^^
  expected: a declared input or state, or a per-token value defined by an equation
  hint: did you mean q_t?"""
    )


def test_cli_prints_the_same_message(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from mixc.cli import main

    (tmp_path / "m.mix").write_text(HEAD + UPDATE + "y_t = H_t qq_t\n", encoding="utf-8")
    assert main(["check", str(tmp_path / "m.mix")]) == 1
    err = capsys.readouterr().err
    assert err == str(error_of(tmp_path / "m.mix")) + "\n"
    assert err.startswith(f"{tmp_path / 'm.mix'}:5:11: error: undefined name qq\n")
