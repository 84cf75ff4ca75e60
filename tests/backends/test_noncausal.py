"""Non-causal mixers: states updated from the next token (`G_t = a_t G_{t+1} + ...`).

Hydra against its paper's matrix form (a quasiseparable T x T matrix, built here without mixc;
the oracle against loops written out by hand is in tests/oracle/test_interpret.py), the forms a
non-causal module lacks (step, summary) refusing with the reason, the reverse of causality
(a backward state at t does not depend on the tokens before t, bit for bit, in every form),
and packed sequences reversed each within its own bounds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mixc
from mixc.check import sample_inputs, sample_states
from mixc.check.fuzz import load_module
from mixc.oracle.interpret import interpret
from tests.backends.test_varlen import check_packed
from tests.mixers import SIZES, positional, rel, run_mixc, spec_inputs

ROOT = Path(__file__).parents[2]
HYDRA = ROOT / "specs" / "hydra.mix"
BIGLA = ROOT / "specs" / "bidirectional_gla.mix"


def _quasiseparable(x, dt, B, C, dtb, Bb, Cb, A, D):
    """Hydra's mixing matrix M [b, h, T, T] in float64, entry by entry from the paper's
    definition, and y = M x: below the diagonal C_i . B_j dt_j times the decays strictly
    between j and i (the shifted forward SSM), on it D, above it Cb_i . Bb_j dtb_j times the
    backward decays strictly between i and j (the flipped, shifted backward SSM)."""
    b_, T, h_ = dt.shape
    a, ab = torch.exp(dt * A), torch.exp(dtb * A)  # [b, T, h]
    M = torch.zeros(b_, h_, T, T, dtype=torch.float64)
    for b in range(b_):
        for h in range(h_):
            for i in range(T):
                for j in range(T):
                    if i > j:
                        decay = torch.prod(a[b, j + 1 : i, h])
                        M[b, h, i, j] = (C[b, i, h] @ B[b, j, h]) * dt[b, j, h] * decay
                    elif i == j:
                        M[b, h, i, j] = D[h]
                    else:
                        decay = torch.prod(ab[b, i + 1 : j, h])
                        M[b, h, i, j] = (Cb[b, i, h] @ Bb[b, j, h]) * dtb[b, j, h] * decay
    return torch.einsum("bhij,bjhp->bihp", M, x)


def test_hydra_equals_its_quasiseparable_matrix():
    spec, module = mixc.load_spec(HYDRA), mixc.load(HYDRA)
    inputs, params = spec_inputs(spec, B=2, T=11, NH=2, generator=torch.Generator().manual_seed(0))
    want = _quasiseparable(*inputs.values(), *params.values())
    args = positional(spec, inputs, params)
    got = {
        "oracle": interpret(spec, inputs, params)[0]["y"],
        "recurrent": module.recurrent(*args)[0],
        "parallel": module.parallel(*args)[0],
        **{f"chunk{cs}": module.chunk(*args, chunk_size=cs)[0] for cs in (1, 4, 16)},
    }
    for form, y in got.items():
        assert rel(y, want) < 1e-12, form
    # and in float32, within float32's rounding
    y32 = module.chunk(*(a.float() for a in args), chunk_size=4)[0]
    assert rel(y32.double(), want) < 1e-5


@pytest.mark.parametrize("path", [HYDRA, BIGLA], ids=["hydra", "bidirectional_gla"])
def test_step_and_summary_say_the_mixer_is_non_causal(path):
    spec, module = mixc.load_spec(path), mixc.load(path)
    assert "step" not in module.FORMS and "summary" not in module.FORMS
    assert module.FORMS[-1] == "recurrent"
    inputs, params = spec_inputs(spec, B=1, T=3, NH=1)
    args = positional(spec, inputs, params)
    one = [a[:, 0] if i < len(spec.mixer.inputs) else a for i, a in enumerate(args)]
    line = spec.mixer.update("G").span.line
    with pytest.raises(mixc.MixcError) as err:
        module.step(*one)
    message = str(err.value)
    assert "no step form: the mixer is non-causal" in message
    assert f"G runs backward in time: its update (line {line}) reads G_{{t+1}}" in message
    assert str(path) in message
    with pytest.raises(mixc.MixcError, match="from later ranks to earlier ones"):
        module.summary(*args)


def test_explain_lists_the_forms_of_a_non_causal_mixer():
    result = run_mixc("explain", "specs/hydra.mix")
    assert result.returncode == 0, result.stderr
    assert "  forms: chunk, parallel, recurrent\n" in result.stdout
    assert "    no step: the mixer is non-causal (G runs backward in time" in result.stdout
    assert "runs backward in time: G starts after the last token" in result.stdout


#: Mixers whose output reads backward states only (and the token itself): each output at t
#: depends on the tokens from t on, as a causal one's on the tokens up to t.
BACKWARD_ONLY = {
    "backward_gla": """\
mixer backward_gla
in    q[K], k[K], v[V], g[K]
state G[V, K]
G_t = G_{t+1} diag(exp(-exp(g_t))) + v_t k_t^T
y_t = G_t q_t
""",
    "backward_ssd": """\
mixer backward_ssd
in    x[P], dt, B[N], C[N]
param A, D
state G[P, N]
G_t = exp(dt_t A) G_{t+1} + dt_t x_t B_t^T
y_t = G_{t+1} C_t + D x_t
""",
}


def _earlier(x, t, kind, generator):
    """x with every token before t replaced: by other values, or by the number `kind` names."""
    x = x.clone()
    if kind == "random":
        x[:, :t] = 3 * torch.randn(x[:, :t].shape, generator=generator)
    else:
        x[:, :t] = float(kind)
    return x


@pytest.mark.parametrize("name", BACKWARD_ONLY)
def test_backward_states_do_not_depend_on_earlier_tokens(name):
    """Whatever the tokens before t hold (other values, NaN, infinities), the outputs from t on
    are the same bits in every form; a NaN before t reaches the output just before t."""
    source = mixc.Source(BACKWARD_ONLY[name])
    spec, module = mixc.load_spec(source), mixc.load(source)
    T, n_in = 13, len(spec.mixer.inputs)
    args = sample_inputs(spec, SIZES, T, batch=2, heads=2, seed=1)
    (state,) = sample_states(spec, SIZES, batch=2, heads=2, seed=2)
    forms = {
        "recurrent": lambda *a: module.recurrent(*a, initial_state=state)[0],
        "parallel": lambda *a: module.parallel(*a)[0] if hasattr(module, "parallel") else None,
        **{
            f"chunk{cs}": lambda *a, cs=cs: module.chunk(*a, initial_state=state, chunk_size=cs)[0]
            for cs in (4, 16)
        },
    }
    if "parallel" not in module.FORMS:
        del forms["parallel"]
    generator = torch.Generator().manual_seed(3)
    for form, run in forms.items():
        base = run(*args)
        for t in (6, 8):  # inside a chunk of 4, and at its start
            for kind in ("random", "nan", "inf", "-inf", "1e30"):
                changed = [_earlier(a, t, kind, generator) for a in args[:n_in]] + args[n_in:]
                y = run(*changed)
                where = f"{form}: every input = {kind} before token {t}"
                assert torch.equal(y[:, t:], base[:, t:]), where
                if kind == "nan":
                    assert torch.isnan(y[:, t - 1]).any(), where


def test_a_backward_pass_reversed_across_packed_sequences_is_caught(tmp_path, monkeypatch):
    """Reversing the packed row whole (the last sequence's tokens first) mixes the sequences:
    the check of packed sequences of different lengths against each alone sees it. (Reversing
    each zero-padded row whole would not be wrong: the kernels read the padding's zero writes
    and zero log-gates as the identity.) bidirectional_gla's diagonal kernel runs its backward
    state on the reversed sequence (hydra's scalar-decay kernel runs backward itself)."""
    source = mixc.compile_source(BIGLA)
    target = "    if cu_seqlens is None:\n        return x.flip(2)\n"
    assert source.count(target) == 1
    mutant = tmp_path / "bidirectional_gla_mutant.py"
    mutant.write_text(source.replace(target, target + "    return x.flip(0).flip(2)\n"))
    check_packed(BIGLA, "pytorch", "chunk")  # the module as compiled passes
    module = load_module(mutant)
    monkeypatch.setattr(mixc, "load", lambda *args: module)  # check_packed loads the mutant
    with pytest.raises(AssertionError, match="sequence"):
        check_packed(BIGLA, "pytorch", "chunk")


@pytest.mark.parametrize(
    "update, message",
    [
        (
            "H_t = exp(dt_t A) H_{t-1} + dt_t x_t B_t^T + G_{t+1} B_t\n",
            "G_{t+1} can appear in its own update",
        ),
        (
            "H_t = exp(dt_t A) H_{t-1} + dt_t x_{t-1} B_t^T\n",
            "NYI: x_{t-1}: a non-causal mixer (with the backward state G) reads its inputs at t "
            "only",
        ),
    ],
    ids=["backward_state_in_a_forward_update", "token_shift"],
)
def test_non_causal_specs_it_cannot_compile_are_refused_at_the_place(update, message):
    text = HYDRA.read_text().replace("H_t = exp(dt_t A) H_{t-1} + dt_t x_t B_t^T\n", update)
    with pytest.raises(mixc.MixcError, match=r"hydra\.mix") as err:
        mixc.load(mixc.Source(text, "hydra.mix"))
    assert message in str(err.value)
    assert "^" in str(err.value)  # the spec line is shown with a caret
