"""The emitter computes a repeated subexpression once, into a named local, and negates a product
by one factor. Both leave every value as the expression written out would compute it (the
shipped specs' forms are checked against the float64 oracle elsewhere); here: that the code
reads as intended, and that a local never takes a name the module already uses."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import mixc
from mixc.backends.pytorch.pyexpr import PyExpr
from mixc.frontend.builtins import BUILTINS
from mixc.frontend.ir import Call, Name
from tests.backends.test_name_clashes import (
    test_specs_named_like_the_generated_code_agree_with_the_oracle as agrees_with_the_oracle,
)

ROOT = Path(__file__).parents[2]
SHIPPED = sorted(ROOT.glob("specs/*.mix"))


def _functions(text: str) -> dict[str, str]:
    """The source of each function of the mixer's section of a generated module, by name."""
    start = text.index("# ---- this mixer")
    tree = ast.parse(text)
    return {
        node.name: ast.get_source_segment(text, node)
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and text.index(f"def {node.name}(") > start
    }


@pytest.mark.parametrize(
    ("spec", "function", "once", "local"),
    [
        ("rwkv7", "chunk", "_l2norm(kappa)", "_kk_kappa"),  # named after the let function kk
        ("rwkv7", "summary", "_l2norm(kappa)", "_kk_kappa"),
        ("rwkv7", "_recurrence", "_l2norm(kappa_t)", "_kk_kappa"),
        ("gated_deltanet", "_recurrence", "_torch.exp(g_t)", "_exp_g"),
        ("linear_attention_normalized", "_recurrence", "_F.elu(k_t) + 1", "_phi_k"),
        ("deltanet_negeig", "chunk", "2 * beta", "_scaled_beta"),
        ("mlstm", "_recurrence", "_torch.exp(i_t)", "_exp_i"),
    ],
)
def test_a_repeated_subexpression_is_computed_once_into_a_named_local(spec, function, once, local):
    text = mixc.compile_source(ROOT / "specs" / f"{spec}.mix")
    body = _functions(text)[function]
    assert body.count(once) == 1, body
    assert f"{local} = {once}\n" in body, body


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_no_product_is_negated_whole(path):
    """-(a * b) is emitted as -a * b: the same value (negation is exact), one small negation."""
    text = mixc.compile_source(path)
    for name, source in _functions(text).items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
                operand = node.operand
                whole = isinstance(operand, ast.BinOp) and isinstance(
                    operand.op, ast.Mult | ast.Div
                )
                assert not whole, f"{name}: {ast.unparse(node)}"


def test_kda_negates_its_scalar_factor():
    text = mixc.compile_source(ROOT / "specs" / "kda.mix")
    assert "_seq_vector(-beta * (_torch.exp(g) * k), _sizes, cu_seqlens)" in text


#: Per-token values named like the module's helper `_fail` and its kernel output `_o`, each
#: repeated: their locals must take other names, and every form still agrees with the oracle.
CLASHING = """mixer clash
in    q[K], k[K], v[V], a, b
state H[V, K]
fail_t = tanh(a_t)
o_t = sigmoid(b_t)
H_t = H_{t-1} + fail_t o_t v_t k_t^T
y_t = H_t q_t + fail_t o_t v_t
"""


def test_a_shared_local_takes_no_name_the_module_uses():
    text = mixc.compile_source(mixc.Source(CLASHING))
    functions = _functions(text)
    assert "_fail(" in text  # the helper the local must not shadow
    for name in ("chunk", "_recurrence"):
        body = functions[name]
        assert "_fail =" not in body and "_o = _torch.sigmoid" not in body, body
        assert body.count("_torch.tanh(") == 1, body
    agrees_with_the_oracle(CLASHING)


def test_a_two_argument_builtin_without_a_rule_is_refused(monkeypatch):
    """Only max and min have a rule for two arguments (a clamp of a constant); another built-in
    of two arguments is refused, not emitted as one of them."""
    monkeypatch.setitem(BUILTINS, "hypot", dataclasses.replace(BUILTINS["max"], name="hypot"))
    emit = PyExpr(typer=None, names=lambda e: e.name)
    with pytest.raises(NotImplementedError, match="hypot"):
        emit(Call("hypot", (Name("x"), Name("y"))))


#: The key and the query turned by one turn (by angles of the token), and the readout turned by it again: a rotation
#: that reads the state beside rotations that read the inputs only.
ROTATED_READOUT = """mixer rotated_readout "a readout turned by the turn of its query and key"
in    q[K], k[K], v[K], a[K]
state H[K, K]
H_t = H_{t-1} + v_t rotate_interleaved(k_t, a_t)^T
y_t = rotate_interleaved(H_t rotate_interleaved(q_t, a_t), a_t)
"""


def test_the_rotations_of_one_turn_are_one_call():
    """mamba3_mimo turns B1, B2 (and C1, C2) by two turns (the previous token's angles and
    the current's): one _rotated_all call for each turn (one operator call under torch.compile,
    the turn computed once), no rotation alone."""
    functions = _functions(mixc.compile_source(ROOT / "specs" / "mamba3_mimo.mix"))
    for name in ("chunk", "parallel", "_recurrence"):
        body = functions[name]
        assert body.count("_rotated_all(") == 2 and "_rotated(" not in body, body
        assert body.count("(C2_bias, C2") + body.count("(C2_t, C2_bias)") == 1, body


def test_a_rotation_that_reads_a_state_is_not_moved_before_it():
    """A rotation whose vector reads a state is computed where it is used, not with the earlier
    rotations of its turn (which read inputs only, bound before): there it would read the state
    before the kernel or the step computes it. Every form agrees with the float64 oracle."""
    functions = _functions(mixc.compile_source(text=ROTATED_READOUT))
    for name in ("parallel", "_recurrence"):
        body = functions[name]
        assert body.count("_rotated_all(") == 1 and body.count("_rotated(") == 1, body
    agrees_with_the_oracle(ROTATED_READOUT)
