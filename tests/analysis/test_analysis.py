"""The analysis: transition classes, rules, writes, readouts, log-gates and plans.

- A table: every shipped spec and variants written here (other spellings of the same mixers,
  each class, sequential-only, non-causal), each row with what the analysis must find.
- Random algebraic rewrites of the shipped specs' updates, built on the IR, leave the facts alone.
- Errors and warnings only the analysis can see, with a caret.
- The cost model, against counts worked out by hand.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, note, reject, settings
from hypothesis import strategies as st

from mixc import load_spec
from mixc.algebra.formula import Formula
from mixc.analysis.cost import costs
from mixc.analysis.plan import Plan, analyze
from mixc.errors import Source, SpecAnalysisError, SpecError
from mixc.frontend.ir import Binary, Call, Expr, Neg, Timed, Transpose, walk
from mixc.frontend.limits import SpecSizeError
from mixc.frontend.shapes import IDENTITY, SCALAR, Typer
from mixc.frontend.spec import Spec
from mixc.frontend.verify import verify
from mixc.transitions import CLASSES

SPECS = Path(__file__).parents[2] / "specs"


# ----------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class S:
    """What one state must get: class, rule name, write, log-gates and (delta rule) erase."""

    label: str
    rule: str
    write: str
    gates: tuple[str, ...] = ()
    erase: str | None = None


@dataclass(frozen=True)
class Row:
    spec: str  # a file in specs/ (name.mix) or spec text
    states: dict[str, S]
    output: str  # "form: expr"
    algorithm: str  # a piece of Facts.algorithm ("recurrent only" when not chunkable)
    chunkable: bool = True
    groups: tuple[tuple[str, ...], ...] | None = None
    warnings: tuple[str, ...] = ()  # a piece of each warning's message, in order
    reason: str | None = None  # a piece of Facts.reason


def text(
    body: str, inputs: str = "q[K], k[K], v[V]", extra: str = "", out: str = "y_t = H_t q_t"
) -> str:
    return f"mixer variant\nin {inputs}\n{extra}state H[V, K]\n{body}\n{out}\n"


SCALAR_DECAY = "chunked scalar decay"
DIAGONAL = "chunked diagonal gate"
DELTA = "chunked delta rule"
ELEMENTWISE = "chunked elementwise scan"
DPLR = "chunked diagonal plus low rank"
VALUE_SIDE = "value-side (transposed) diagonal plus low rank"
SEQUENTIAL = "recurrent only"

#: (1 - sigmoid(a_t)) times the delta rule's transition, however the product is written out.
COMPOUND_GATED_DELTA = {
    "H": S(
        "scalar decay times identity minus rank-1",
        "gated_delta",
        "beta_t v_t k_t^T",
        ("scalar: 1 - sigmoid(a_t) -> logsigmoid(-a_t) proven",),
        erase="beta_t, k_t",
    )
}

ROWS: dict[str, Row] = {
    # ---- the shipped specs
    "deltanet": Row(
        "deltanet.mix",
        {"H": S("identity minus rank-1", "delta", "beta_t v_t k_t^T", erase="beta_t, k_t")},
        "linear: _r0",
        DELTA,
    ),
    "deltanet_negeig": Row(
        "deltanet_negeig.mix",
        {"H": S("identity minus rank-1", "delta", "2 beta_t v_t k_t^T", erase="2 beta_t, k_t")},
        "linear: _r0",
        DELTA,
    ),
    "deltaproduct": Row(
        "deltaproduct.mix",
        {
            "H": S(
                "identity minus rank-1",
                "delta",
                "2 b1_t v1_t l2norm(k1_t)^T + 2 b2_t v2_t l2norm(k2_t)^T",
            )
        },
        "linear: _r0",
        DELTA,
    ),
    "gated_deltanet": Row(
        "gated_deltanet.mix",
        {
            "H": S(
                "scalar decay times identity minus rank-1",
                "gated_delta",
                "beta_t v_t k_t^T",
                ("scalar: exp(g_t) -> g_t unproven",),
                erase="beta_t, k_t",
            )
        },
        "linear: _r0",
        DELTA,
        warnings=("cannot prove the decay exp(g_t) of H",),
    ),
    "gated_general": Row(
        "gated_general.mix",
        {
            "H": S(
                "elementwise gate",
                "full_elementwise_gate",
                "v_t k_t^T",
                ("full: G_t -> log(G_t) unproven",),
            )
        },
        "linear: _r0",
        ELEMENTWISE,
        warnings=("cannot prove the decay G_t of H",),
    ),
    "mamba1": Row(
        "mamba1.mix",
        {
            "H": S(
                "elementwise gate",
                "full_elementwise_gate",
                "dt_t * x_t B_t^T",
                ("full: exp(dt_t * A) -> dt_t * A unproven",),
            )
        },
        "linear + skip: _r0 + x_t * D",
        ELEMENTWISE,
        warnings=("cannot prove the decay exp(dt_t * A) of H",),
    ),
    "hgrn": Row(
        "hgrn.mix",
        {
            "c": S(
                "elementwise gate",
                "column_gate",
                "(1 - sigmoid(f_t)) * i_t 1^T",
                ("value: sigmoid(f_t) -> logsigmoid(f_t) proven",),
            )
        },
        "linear: o_t * _r0",
        ELEMENTWISE,
    ),
    "ema": Row(
        "ema.mix",
        {
            "m": S(
                "scalar constant",
                "scalar_constant",
                "1 - a x_t 1^T",
                ("scalar: a -> log(a) proven",),
            )
        },
        "linear: _r0",
        SCALAR_DECAY,
    ),
    "gated_retention": Row(
        "gated_retention.mix",
        {
            "H": S(
                "scalar data-dependent",
                "scalar_data",
                "v_t k_t^T",
                ("scalar: sigmoid(a_t) -> logsigmoid(a_t) proven",),
            )
        },
        "linear: _r0",
        SCALAR_DECAY,
    ),
    "gla": Row(
        "gla.mix",
        {
            "H": S(
                "diagonal key-side",
                "diagonal_key",
                "v_t k_t^T",
                ("key: diag(exp(g_t)) -> g_t unproven",),
            )
        },
        "linear: _r0",
        DIAGONAL,
        warnings=("cannot prove the decay diag(exp(g_t))",),
    ),
    "mlstm": Row(
        "mlstm.mix",
        {
            "H": S(
                "scalar data-dependent",
                "scalar_data",
                "exp(i_t) v_t k_t^T",
                ("scalar: sigmoid(f_t) -> logsigmoid(f_t) proven",),
            ),
            "n": S(
                "scalar data-dependent",
                "scalar_data",
                "exp(i_t) k_t",
                ("scalar: sigmoid(f_t) -> logsigmoid(f_t) proven",),
            ),
        },
        "ratio: _r0 / max(abs(_r1), 1)",
        SCALAR_DECAY,
        groups=(("H", "n"),),
    ),
    "rwkv6": Row(
        "rwkv6.mix",
        {
            "H": S(
                "diagonal key-side",
                "diagonal_key",
                "v_t k_t^T",
                ("key: diag(exp(w_t)) -> w_t unproven",),
            )
        },
        "linear + skip: _r0 + (k_t * u . r_t) v_t",
        DIAGONAL,
        warnings=("cannot prove the decay diag(exp(w_t))",),
    ),
    "linear_attention": Row(
        "linear_attention.mix",
        {"H": S("identity", "identity", "v_t k_t^T")},
        "linear: _r0",
        SCALAR_DECAY,
    ),
    "linear_attention_normalized": Row(
        "linear_attention_normalized.mix",
        {
            "H": S("identity", "identity", "v_t (elu(k_t) + 1)^T"),
            "z": S("identity", "identity", "elu(k_t) + 1"),
        },
        "ratio: _r0 / _r1",
        SCALAR_DECAY,
        groups=(("H", "z"),),
    ),
    "mamba2": Row(
        "mamba2.mix",
        {
            "H": S(
                "scalar data-dependent",
                "scalar_data",
                "dt_t x_t B_t^T",
                ("scalar: exp(dt_t A) -> dt_t A unproven",),
            )
        },
        "linear + skip: _r0 + D x_t",
        SCALAR_DECAY,
        warnings=("cannot prove the decay exp(dt_t A)",),
    ),
    # non-causal: a backward state (G_{t+1} in its own update) is classified as a forward one
    "hydra": Row(
        "hydra.mix",
        {
            "H": S(
                "scalar data-dependent",
                "scalar_data",
                "dt_t x_t B_t^T",
                ("scalar: exp(dt_t A) -> dt_t A unproven",),
            ),
            "G": S(
                "scalar data-dependent",
                "scalar_data",
                "dtb_t x_t Bb_t^T",
                ("scalar: exp(dtb_t A) -> dtb_t A unproven",),
            ),
        },
        "linear + skip: _r0 + _r1 + D x_t",
        SCALAR_DECAY,
        groups=(("H",), ("G",)),
        warnings=("cannot prove the decay exp(dt_t A)", "cannot prove the decay exp(dtb_t A)"),
    ),
    "bidirectional_gla": Row(
        "bidirectional_gla.mix",
        {
            "H": S(
                "diagonal key-side",
                "diagonal_key",
                "v_t k_t^T",
                ("key: diag(exp(g_t)) -> g_t unproven",),
            ),
            "G": S(
                "diagonal key-side",
                "diagonal_key",
                "v_t k_t^T",
                ("key: diag(exp(gb_t)) -> gb_t unproven",),
            ),
        },
        "linear: _r0 + _r1",
        DIAGONAL,
        groups=(("H",), ("G",)),
        warnings=(
            "cannot prove the decay diag(exp(g_t))",
            "cannot prove the decay diag(exp(gb_t))",
        ),
    ),
    "mamba3_trapezoid": Row(
        "mamba3_trapezoid.mix",
        {
            "H": S(
                "scalar data-dependent",
                "scalar_data",
                "dt_t sigmoid(l_t) x_t B_t^T"
                " + dt_t exp(dt_t A) - dt_t exp(dt_t A) sigmoid(l_t) x_{t-1} B_{t-1}^T",
                ("scalar: exp(dt_t A) -> dt_t A unproven",),
            )
        },
        "linear + skip: _r0 + D x_t",
        SCALAR_DECAY,
        warnings=("cannot prove the decay exp(dt_t A)",),
    ),
    "mamba3": Row(
        "mamba3.mix",
        {
            "Th": S("identity", "identity", "3.141592653589793 dt_t tanh(w_t) 1^T", ()),
            "H": S(
                "scalar data-dependent",
                "scalar_data",
                "dt_t sigmoid(l_t) x_t (rotate_interleaved(B_bias + B_t, _r1))^T"
                " + dt_t exp(-A_t dt_t) - dt_t exp(-A_t dt_t) sigmoid(l_t) x_{t-1}"
                " (rotate_interleaved(B_bias + B_{t-1}, _r0))^T",
                ("scalar: exp(-dt_t A_t) -> -A_t dt_t unproven",),
            ),
        },
        "function of readouts: (_r2 + D x_t) * silu(z_t)",
        SCALAR_DECAY,
        groups=(("Th",), ("H",)),
        warnings=("cannot prove the decay exp(-dt_t A_t)",),
    ),
    "mamba3_mimo": Row(
        "mamba3_mimo.mix",
        {
            "Th": S("identity", "identity", "3.141592653589793 dt_t tanh(w_t) 1^T", ()),
            "H": S(
                "scalar data-dependent",
                "scalar_data",
                "dt_t sigmoid(l_t) x_t * mimo_x1 (rotate_halves(B1_bias + B1_t, _r1))^T"
                " + dt_t sigmoid(l_t) x_t * mimo_x2 (rotate_halves(B2_bias + B2_t, _r1))^T"
                " + dt_t exp(-A_t dt_t) - dt_t exp(-A_t dt_t) sigmoid(l_t) x_{t-1} * mimo_x1"
                " (rotate_halves(B1_bias + B1_{t-1}, _r0))^T"
                " + dt_t exp(-A_t dt_t) - dt_t exp(-A_t dt_t) sigmoid(l_t) x_{t-1} * mimo_x2"
                " (rotate_halves(B2_bias + B2_{t-1}, _r0))^T",
                ("scalar: exp(-dt_t A_t) -> -A_t dt_t unproven",),
            ),
        },
        "function of readouts: mimo_o1 * (_r2 + D (x_t * mimo_x1)) * silu(z_t * mimo_z1)"
        " + mimo_o2 * (_r3 + D (x_t * mimo_x2)) * silu(z_t * mimo_z2)",
        SCALAR_DECAY,
        groups=(("Th",), ("H",)),
        warnings=("cannot prove the decay exp(-dt_t A_t)",),
    ),
    "gla_rank2": Row(
        "gla_rank2.mix",
        {
            "H": S(
                "diagonal key-side",
                "diagonal_key",
                "v1_t k1_t^T + v2_t k2_t^T",
                ("key: diag(exp(g_t)) -> g_t unproven",),
            )
        },
        "linear: _r0",
        DIAGONAL,
        warnings=("cannot prove the decay diag(exp(g_t))",),
    ),
    "retnet": Row(
        "retnet.mix",
        {
            "H": S(
                "scalar constant",
                "scalar_constant",
                "v_t k_t^T",
                ("scalar: gamma -> log(gamma) proven",),
            )
        },
        "linear: _r0",
        SCALAR_DECAY,
    ),
    "linear_attention_rope": Row(
        "linear_attention_rope.mix",
        {"H": S("identity", "identity", "v_t (rotate_interleaved(k_t, pos_t theta))^T")},
        "linear: _r0",
        SCALAR_DECAY,
    ),
    "retnet_xpos": Row(
        "retnet_xpos.mix",
        {
            "H": S(
                "diagonal key-side",
                "diagonal_key",
                "v_t (rotate_interleaved((1 / sqrt(K)) k_t, pos_t theta))^T",
                (
                    "scalar: gamma -> log(gamma) proven",
                    "key: diag(zeta^(1 / 512)) -> log(zeta^0.001953125) unproven",
                ),
            )
        },
        "linear: _r0",
        DIAGONAL,
        warnings=("cannot prove the decay diag(zeta^(1 / 512))",),
    ),
    "transformer_vq": Row(
        "transformer_vq.mix",
        {
            "H": S("identity", "identity", "v_t (onehot_argmax(C k_t - 0.5 (C * C) ones))^T"),
            "n": S("identity", "identity", "onehot_argmax(C k_t - 0.5 (C * C) ones)"),
        },
        "ratio: _r0 / _r1",
        SCALAR_DECAY,
        groups=(("H", "n"),),
    ),
    # ---- the same mixers, spelled differently
    "retnet_scalar_on_the_right": Row(
        text("H_t = H_{t-1} gamma + v_t k_t^T", extra="param gamma = 1 - 2^(-5 - h)\n"),
        {
            "H": S(
                "scalar constant",
                "scalar_constant",
                "v_t k_t^T",
                ("scalar: gamma -> log(gamma) proven",),
            )
        },
        "linear: _r0",
        SCALAR_DECAY,
    ),
    "retnet_hadamard": Row(
        text("H_t = gamma ⊙ H_{t-1} + v_t k_t^T", extra="param gamma = 1 - 2^(-5 - h)\n"),
        {
            "H": S(
                "scalar constant",
                "scalar_constant",
                "v_t k_t^T",
                ("scalar: gamma -> log(gamma) proven",),
            )
        },
        "linear: _r0",
        SCALAR_DECAY,
    ),
    "retnet_literal_decay": Row(
        text("H_t = 0.9 H_{t-1} + v_t k_t^T"),
        {
            "H": S(
                "scalar constant",
                "scalar_constant",
                "v_t k_t^T",
                ("scalar: 0.9 -> log(0.9) proven",),
            )
        },
        "linear: _r0",
        SCALAR_DECAY,
    ),
    "deltanet_expanded": Row(
        text(
            "H_t = H_{t-1} - beta_t H_{t-1} k_t k_t^T + beta_t v_t k_t^T", "q[K], k[K], v[V], beta"
        ),
        {"H": S("identity minus rank-1", "delta", "beta_t v_t k_t^T", erase="beta_t, k_t")},
        "linear: _r0",
        DELTA,
    ),
    "deltanet_error_correction": Row(
        text("H_t = H_{t-1} + beta_t (v_t - H_{t-1} k_t) k_t^T", "q[K], k[K], v[V], beta"),
        {"H": S("identity minus rank-1", "delta", "beta_t v_t k_t^T", erase="beta_t, k_t")},
        "linear: _r0",
        DELTA,
    ),
    "deltanet_l2norm_keys": Row(
        text(
            "H_t = H_{t-1} (I - beta_t l2norm(k_t) l2norm(k_t)^T) + beta_t v_t l2norm(k_t)^T",
            "q[K], k[K], v[V], beta",
            out="y_t = H_t l2norm(q_t)",
        ),
        {
            "H": S(
                "identity minus rank-1",
                "delta",
                "beta_t v_t l2norm(k_t)^T",
                erase="beta_t, l2norm(k_t)",
            )
        },
        "linear: _r0",
        DELTA,
    ),
    "deltanet_derived_key_and_beta": Row(
        text(
            "kn_t = l2norm(k_t)\nbeta_t = sigmoid(b_t)\nH_t = H_{t-1} (I - beta_t kn_t kn_t^T) + beta_t v_t kn_t^T",
            "q[K], k[K], v[V], b",
        ),
        {
            "H": S(
                "identity minus rank-1",
                "delta",
                "sigmoid(b_t) v_t l2norm(k_t)^T",
                erase="sigmoid(b_t), l2norm(k_t)",
            )
        },
        "linear: _r0",
        DELTA,
    ),
    "gated_retention_hadamard": Row(
        text("H_t = sigmoid(a_t) ⊙ H_{t-1} + v_t k_t^T", "q[K], k[K], v[V], a"),
        {
            "H": S(
                "scalar data-dependent",
                "scalar_data",
                "v_t k_t^T",
                ("scalar: sigmoid(a_t) -> logsigmoid(a_t) proven",),
            )
        },
        "linear: _r0",
        SCALAR_DECAY,
    ),
    "exp_decay_juxtaposed": Row(
        text("H_t = exp(g_t) H_{t-1} + v_t k_t^T", "q[K], k[K], v[V], g"),
        {
            "H": S(
                "scalar data-dependent",
                "scalar_data",
                "v_t k_t^T",
                ("scalar: exp(g_t) -> g_t unproven",),
            )
        },
        "linear: _r0",
        SCALAR_DECAY,
        warnings=("cannot prove the decay exp(g_t) of H",),
    ),
    "exp_decay_hadamard": Row(
        text("H_t = exp(g_t) ⊙ H_{t-1} + v_t k_t^T", "q[K], k[K], v[V], g"),
        {
            "H": S(
                "scalar data-dependent",
                "scalar_data",
                "v_t k_t^T",
                ("scalar: exp(g_t) -> g_t unproven",),
            )
        },
        "linear: _r0",
        SCALAR_DECAY,
        warnings=("cannot prove the decay exp(g_t) of H",),
    ),
    "one_minus_sigmoid": Row(
        text("H_t = (1 - sigmoid(a_t)) H_{t-1} + v_t k_t^T", "q[K], k[K], v[V], a"),
        {
            "H": S(
                "scalar data-dependent",
                "scalar_data",
                "v_t k_t^T",
                ("scalar: 1 - sigmoid(a_t) -> logsigmoid(-a_t) proven",),
            )
        },
        "linear: _r0",
        SCALAR_DECAY,
    ),
    "let_defined_decay": Row(
        text(
            "H_t = decay(a_t) H_{t-1} + v_t k_t^T",
            "q[K], k[K], v[V], a",
            extra="let decay(x) = sigmoid(x)\n",
        ),
        {
            "H": S(
                "scalar data-dependent",
                "scalar_data",
                "v_t k_t^T",
                ("scalar: sigmoid(a_t) -> logsigmoid(a_t) proven",),
            )
        },
        "linear: _r0",
        SCALAR_DECAY,
    ),
    "derived_per_token_decay": Row(
        text("a_t = sigmoid(x_t)\nH_t = a_t H_{t-1} + v_t k_t^T", "q[K], k[K], v[V], x"),
        {
            "H": S(
                "scalar data-dependent",
                "scalar_data",
                "v_t k_t^T",
                ("scalar: sigmoid(x_t) -> logsigmoid(x_t) proven",),
            )
        },
        "linear: _r0",
        SCALAR_DECAY,
    ),
    "write_scaled_by_a_param": Row(
        text("H_t = H_{t-1} + s v_t k_t^T", extra="param s\n"),
        {"H": S("identity", "identity", "s v_t k_t^T")},
        "linear: _r0",
        SCALAR_DECAY,
    ),
    "mamba2_commuted": Row(
        """mixer m
in x[P], dt, B[N], C[N]
param A, D
state H[P, N]
H_t = H_{t-1} exp(A dt_t) + (dt_t x_t) B_t^T
y_t = D x_t + H_t C_t
""",
        {
            "H": S(
                "scalar data-dependent",
                "scalar_data",
                "dt_t x_t B_t^T",
                ("scalar: exp(A dt_t) -> dt_t A unproven",),
            )
        },
        "linear + skip: _r0 + D x_t",
        SCALAR_DECAY,
        warnings=("cannot prove the decay exp(A dt_t)",),
    ),
    "mamba2_a_log": Row(
        """mixer m
in x[P], dtr, B[N], C[N]
param A_log, D
state H[P, N]
dt_t = softplus(dtr_t)
H_t = exp(-dt_t exp(A_log)) H_{t-1} + dt_t x_t B_t^T
y_t = H_t C_t + D x_t
""",
        {
            "H": S(
                "scalar data-dependent",
                "scalar_data",
                "softplus(dtr_t) x_t B_t^T",
                ("scalar: exp(-softplus(dtr_t) exp(A_log)) -> -softplus(dtr_t) exp(A_log) proven",),
            )
        },
        "linear + skip: _r0 + D x_t",
        SCALAR_DECAY,
    ),
    "gated_deltanet_distributed": Row(
        text(
            "H_t = exp(g_t) H_{t-1} - exp(g_t) beta_t H_{t-1} k_t k_t^T + beta_t v_t k_t^T",
            "q[K], k[K], v[V], g, beta",
        ),
        {
            "H": S(
                "scalar decay times identity minus rank-1",
                "gated_delta",
                "beta_t v_t k_t^T",
                ("scalar: exp(g_t) -> g_t unproven",),
                erase="beta_t, k_t",
            )
        },
        "linear: _r0",
        DELTA,
        warnings=("cannot prove the decay exp(g_t)",),
    ),
    "gated_deltanet_compound_decay": Row(
        text(
            "H_t = (1 - sigmoid(a_t)) H_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T",
            "q[K], k[K], v[V], a, beta",
        ),
        COMPOUND_GATED_DELTA,
        "linear: _r0",
        DELTA,
    ),
    "gated_deltanet_compound_decay_written_out": Row(
        text(
            "H_t = H_{t-1} (I - beta_t k_t k_t^T) - sigmoid(a_t) H_{t-1} (I - beta_t k_t k_t^T)"
            " + beta_t v_t k_t^T",
            "q[K], k[K], v[V], a, beta",
        ),
        COMPOUND_GATED_DELTA,
        "linear: _r0",
        DELTA,
    ),
    "deltanet_compound_beta": Row(
        text(
            "H_t = H_{t-1} (I - (1 - sigmoid(b_t)) k_t k_t^T) + v_t k_t^T",
            "q[K], k[K], v[V], b",
        ),
        {"H": S("identity minus rank-1", "delta", "v_t k_t^T", erase="1 - sigmoid(b_t), k_t")},
        "linear: _r0",
        DELTA,
    ),
    "decay_missing_on_the_rank_one_term": Row(
        text(
            "H_t = (1 - sigmoid(a_t)) H_{t-1} - beta_t H_{t-1} k_t k_t^T + beta_t v_t k_t^T",
            "q[K], k[K], v[V], a, beta",
        ),
        {
            "H": S(
                "diagonal minus rank-1",
                "diagonal_plus_low_rank",
                "beta_t v_t k_t^T",
                ("scalar: 1 - sigmoid(a_t) -> logsigmoid(-a_t) proven",),
                erase="beta_t, k_t",
            )
        },
        "linear: _r0",
        DPLR,
    ),
    # ---- diagonal plus low rank
    "kda": Row(
        "kda.mix",
        {
            "H": S(
                "diagonal times identity minus rank-1",
                "diagonal_plus_low_rank",
                "beta_t v_t k_t^T",
                ("key: diag(exp(g_t)) -> g_t unproven",),
                erase="beta_t, k_t",
            )
        },
        "linear: _r0",
        DPLR,
        warnings=("cannot prove the decay diag(exp(g_t))",),
    ),
    # pipelines of states: each its own class, the passes in dependency order (issue 30)
    "gsa": Row(
        "gsa.mix",
        {
            "Ks": S(
                "diagonal value-side",
                "diagonal_value",
                "sigmoid(-a_t) l2norm(k_t)^T",
                ("value: diag(sigmoid(a_t)) -> logsigmoid(a_t) proven",),
            ),
            "Vs": S(
                "diagonal key-side",
                "diagonal_key",
                "v_t sigmoid(-a_t)^T",
                ("key: diag(sigmoid(a_t)) -> logsigmoid(a_t) proven",),
            ),
        },
        "function of readouts: 1 / sum(exp(_r0)) * _r1",
        DIAGONAL,
        groups=(("Ks",), ("Vs",)),
    ),
    "precond_gdn": Row(
        "precond_gdn.mix",
        {
            "A": S(
                "scalar data-dependent",
                "scalar_data",
                "sigmoid(b_t) l2norm(k_t) * l2norm(k_t) 1^T",
                ("scalar: sigmoid(a_t) -> logsigmoid(a_t) proven",),
            ),
            "H": S(
                "diagonal plus low rank",
                "diagonal_plus_low_rank",
                "beta_t v_t (l2norm(k_t) * exp(-log(x) ((log(abs(_r0) + 1e-06) - center) / "
                "(abs(log(abs(_r0) + 1e-06) - center) + 1))))^T",
                ("scalar: exp(g_t) -> g_t unproven",),
            ),
        },
        "linear: _r1",
        DPLR,
        groups=(("A",), ("H",)),
        warnings=("cannot prove the decay exp(g_t) of H",),
    ),
    "stacked": Row(
        "stacked.mix",
        {
            "H1": S(
                "scalar data-dependent",
                "scalar_data",
                "v_t k_t^T",
                ("scalar: exp(g_t) -> g_t unproven",),
            ),
            "H2": S("identity", "identity", "_r0 u_t^T"),
        },
        "linear: _r1",
        SCALAR_DECAY,
        groups=(("H1",), ("H2",)),
        warnings=("cannot prove the decay exp(g_t) of H1",),
    ),
    "kda_distributed": Row(
        text(
            "H_t = H_{t-1} diag(sigmoid(g_t)) - beta_t H_{t-1} diag(sigmoid(g_t)) k_t k_t^T"
            " + beta_t v_t k_t^T",
            "q[K], k[K], v[V], g[K], beta",
        ),
        {
            "H": S(
                "diagonal times identity minus rank-1",
                "diagonal_plus_low_rank",
                "beta_t v_t k_t^T",
                ("key: diag(sigmoid(g_t)) -> logsigmoid(g_t) proven",),
                erase="beta_t, k_t",
            )
        },
        "linear: _r0",
        DPLR,
    ),
    "kda_times_a_scalar_decay": Row(
        text(
            "H_t = sigmoid(a_t) H_{t-1} diag(sigmoid(g_t)) (I - beta_t k_t k_t^T) + beta_t v_t k_t^T",
            "q[K], k[K], v[V], g[K], a, beta",
        ),
        {
            "H": S(
                "diagonal minus rank-1",
                "diagonal_plus_low_rank",
                "beta_t v_t k_t^T",
                (
                    "scalar: sigmoid(a_t) -> logsigmoid(a_t) proven",
                    "key: diag(sigmoid(g_t)) -> logsigmoid(g_t) proven",
                ),
                erase="beta_t sigmoid(a_t), k_t",
            )
        },
        "linear: _r0",
        DPLR,
    ),
    "rwkv7": Row(
        "rwkv7.mix",
        {
            "H": S(
                "diagonal plus low rank",
                "diagonal_plus_low_rank",
                "v_t k_t^T",
                ("key: diag(exp(-exp(-0.5) sigmoid(d_t))) -> -exp(-0.5) sigmoid(d_t) proven",),
            )
        },
        "linear: _r0",
        DPLR,
    ),
    "comba": Row(
        "comba.mix",
        {
            "H": S(
                "diagonal plus low rank",
                "diagonal_plus_low_rank",
                "beta_t v_t k_t^T",
                ("scalar: exp(g_t) -> g_t unproven",),
            )
        },
        "linear: _r0",
        DPLR,
        warnings=("cannot prove the decay exp(g_t) of H is in (0, 1]",),
    ),
    "gdn2": Row(
        "gdn2.mix",
        {
            "H": S(
                "diagonal plus low rank",
                "diagonal_plus_low_rank",
                "v_t * w_t k_t^T",
                ("key: diag(exp(g_t)) -> g_t unproven",),
            )
        },
        "linear: _r0",
        DPLR,
        warnings=("cannot prove the decay diag(exp(g_t)) of H is in (0, 1]",),
    ),
    "gated_oja": Row(
        "gated_oja.mix",
        {
            "H": S(
                "value-side (transposed) diagonal times identity minus rank-1",
                "value_side_diagonal_plus_low_rank",
                "beta_t l2norm(v_t) k_t^T",
                ("value: diag(exp(gv_t)) -> gv_t unproven",),
                erase="beta_t, l2norm(v_t)",
            )
        },
        "linear: _r0",
        VALUE_SIDE,
        warnings=("cannot prove the decay diag(exp(gv_t)) of H is in (0, 1]",),
    ),
    # value-side transitions, the transposes of key-side diagonal plus low rank (issue 30)
    "oja_without_a_decay": Row(
        text(
            "H_t = H_{t-1} - beta_t v_t (v_t^T H_{t-1}) + beta_t v_t k_t^T",
            "q[K], k[K], v[V], beta",
        ),
        {
            "H": S(
                "value-side (transposed) diagonal times identity minus rank-1",
                "value_side_diagonal_plus_low_rank",
                "beta_t v_t k_t^T",
                erase="beta_t, v_t",
            )
        },
        "linear: _r0",
        VALUE_SIDE,
    ),
    "value_side_diagonal_minus_rank_one": Row(
        text(
            "H_t = (diag(sigmoid(w_t)) - beta_t v_t v_t^T) H_{t-1} + beta_t v_t k_t^T",
            "q[K], k[K], v[V], w[V], beta",
        ),
        {
            "H": S(
                "value-side (transposed) diagonal minus rank-1",
                "value_side_diagonal_plus_low_rank",
                "beta_t v_t k_t^T",
                ("value: diag(sigmoid(w_t)) -> logsigmoid(w_t) proven",),
                erase="beta_t, v_t",
            )
        },
        "linear: _r0",
        VALUE_SIDE,
    ),
    "value_side_any_rank_one_term": Row(
        text(
            "H_t = (diag(exp(w_t)) + b_t a_t^T) H_{t-1} + b_t k_t^T",
            "q[K], k[K], w[V], a[V], b[V]",
        ),
        {
            "H": S(
                "value-side (transposed) diagonal plus low rank",
                "value_side_diagonal_plus_low_rank",
                "b_t k_t^T",
                ("value: diag(exp(w_t)) -> w_t unproven",),
            )
        },
        "linear: _r0",
        VALUE_SIDE,
        warnings=("cannot prove the decay diag(exp(w_t))",),
    ),
    "oja_writing_along_another_vector": Row(
        text(
            "H_t = (I - beta_t u_t u_t^T) H_{t-1} + beta_t v_t k_t^T",
            "q[K], k[K], v[V], u[V], beta",
        ),
        {
            "H": S(
                "value-side (transposed) diagonal times identity minus rank-1",
                "value_side_diagonal_plus_low_rank",
                "beta_t v_t k_t^T",
                erase="beta_t, u_t",
            )
        },
        "linear: _r0",
        SEQUENTIAL,
        chunkable=False,
        reason="acts along u_t but the write's value is v_t",
    ),
    "rwkv7_any_rank_one_term": Row(
        text(
            "H_t = H_{t-1} (diag(exp(w_t)) + a_t b_t^T) + v_t k_t^T",
            "q[K], k[K], v[V], w[K], a[K], b[K]",
        ),
        {
            "H": S(
                "diagonal plus low rank",
                "diagonal_plus_low_rank",
                "v_t k_t^T",
                ("key: diag(exp(w_t)) -> w_t unproven",),
            )
        },
        "linear: _r0",
        DPLR,
        warnings=("cannot prove the decay diag(exp(w_t))",),
    ),
    "decay_and_erase_as_a_sum": Row(
        text(
            "H_t = (1 - sigmoid(a_t)) H_{t-1} - sigmoid(c_t) (H_{t-1} k_t - v_t) k_t^T",
            "q[K], k[K], v[V], a, c",
        ),
        {
            "H": S(
                "diagonal minus rank-1",
                "diagonal_plus_low_rank",
                "sigmoid(c_t) v_t k_t^T",
                ("scalar: 1 - sigmoid(a_t) -> logsigmoid(-a_t) proven",),
                erase="sigmoid(c_t), k_t",
            )
        },
        "linear: _r0",
        DPLR,
    ),
    "delta_rule_writing_along_another_key": Row(
        text(
            "H_t = H_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t u_t^T",
            "q[K], k[K], u[K], v[V], beta",
        ),
        {
            "H": S(
                "diagonal times identity minus rank-1",
                "diagonal_plus_low_rank",
                "beta_t v_t u_t^T",
                erase="beta_t, k_t",
            )
        },
        "linear: _r0",
        DPLR,
    ),
    "rank_two_is_dense": Row(
        text(
            "H_t = H_{t-1} (I - beta_t k_t k_t^T - c_t u_t u_t^T) + v_t k_t^T",
            "q[K], k[K], u[K], v[V], beta, c",
        ),
        {"H": S("general dense", "general_dense", "v_t k_t^T")},
        "linear: _r0",
        SEQUENTIAL,
        chunkable=False,
        reason="in no class with a chunked form",
    ),
    "gated_deltanet_decay_on_the_right": Row(
        text(
            "H_t = H_{t-1} (I - beta_t k_t k_t^T) sigmoid(a_t) + beta_t v_t k_t^T",
            "q[K], k[K], v[V], a, beta",
        ),
        {
            "H": S(
                "scalar decay times identity minus rank-1",
                "gated_delta",
                "beta_t v_t k_t^T",
                ("scalar: sigmoid(a_t) -> logsigmoid(a_t) proven",),
                erase="beta_t, k_t",
            )
        },
        "linear: _r0",
        DELTA,
    ),
    # ---- diagonal and outer-product gates
    "key_gate_as_a_row": Row(
        text("H_t = exp(g_t)^T ⊙ H_{t-1} + v_t k_t^T", "q[K], k[K], v[V], g[K]"),
        {
            "H": S(
                "diagonal key-side",
                "diagonal_key",
                "v_t k_t^T",
                ("key: exp(g_t)^T -> g_t unproven",),
            )
        },
        "linear: _r0",
        DIAGONAL,
        warnings=("cannot prove the decay exp(g_t)^T",),
    ),
    "key_gate_as_a_row_on_the_right": Row(
        text("H_t = H_{t-1} ⊙ exp(-softplus(g_t))^T + v_t k_t^T", "q[K], k[K], v[V], g[K]"),
        {
            "H": S(
                "diagonal key-side",
                "diagonal_key",
                "v_t k_t^T",
                ("key: exp(-softplus(g_t))^T -> -softplus(g_t) proven",),
            )
        },
        "linear: _r0",
        DIAGONAL,
    ),
    "value_side_diag": Row(
        text("H_t = diag(sigmoid(a_t)) H_{t-1} + v_t k_t^T", "q[K], k[K], v[V], a[V]"),
        {
            "H": S(
                "diagonal value-side",
                "diagonal_value",
                "v_t k_t^T",
                ("value: diag(sigmoid(a_t)) -> logsigmoid(a_t) proven",),
            )
        },
        "linear: _r0",
        DIAGONAL,
    ),
    "value_side_column": Row(
        text("H_t = sigmoid(a_t) ⊙ H_{t-1} + v_t k_t^T", "q[K], k[K], v[V], a[V]"),
        {
            "H": S(
                "diagonal value-side",
                "diagonal_value",
                "v_t k_t^T",
                ("value: sigmoid(a_t) -> logsigmoid(a_t) proven",),
            )
        },
        "linear: _r0",
        DIAGONAL,
    ),
    "outer_product_gate": Row(
        text("H_t = (exp(a_t) exp(b_t)^T) ⊙ H_{t-1} + v_t k_t^T", "q[K], k[K], v[V], a[V], b[K]"),
        {
            "H": S(
                "elementwise gate",
                "outer_product_gate",
                "v_t k_t^T",
                ("value: exp(a_t) -> a_t unproven", "key: exp(b_t^T) -> b_t unproven"),
            )
        },
        "linear: _r0",
        DIAGONAL,
        warnings=("decay exp(a_t)", "decay exp(b_t^T)"),
    ),
    "diag_on_both_sides": Row(
        text(
            "H_t = diag(sigmoid(a_t)) H_{t-1} diag(sigmoid(b_t)) + v_t k_t^T",
            "q[K], k[K], v[V], a[V], b[K]",
        ),
        {
            "H": S(
                "elementwise gate",
                "outer_product_gate",
                "v_t k_t^T",
                (
                    "value: diag(sigmoid(a_t)) -> logsigmoid(a_t) proven",
                    "key: diag(sigmoid(b_t)) -> logsigmoid(b_t) proven",
                ),
            )
        },
        "linear: _r0",
        DIAGONAL,
    ),
    # ---- normalisers, skips, vector states, readout scales
    "normalised_gated_retention": Row(
        """mixer m
in q[K], k[K], v[V], a
state H[V, K], z[K]
H_t = sigmoid(a_t) H_{t-1} + v_t k_t^T
z_t = sigmoid(a_t) z_{t-1} + k_t
y_t = H_t q_t / (z_t . q_t + 1e-6)
""",
        {
            "H": S(
                "scalar data-dependent",
                "scalar_data",
                "v_t k_t^T",
                ("scalar: sigmoid(a_t) -> logsigmoid(a_t) proven",),
            ),
            "z": S(
                "scalar data-dependent",
                "scalar_data",
                "k_t",
                ("scalar: sigmoid(a_t) -> logsigmoid(a_t) proven",),
            ),
        },
        "ratio: _r0 / (_r1 + 1e-06)",
        SCALAR_DECAY,
        groups=(("H", "z"),),
    ),
    # a forward and a backward state with the same transition and key: two passes, since the
    # backward one runs on the time-reversed sequence
    "forward_and_backward": Row(
        "mixer m\nin q[K], k[K], v[V], a\nstate H[V, K], G[V, K]\n"
        "H_t = sigmoid(a_t) H_{t-1} + v_t k_t^T\nG_t = sigmoid(a_t) G_{t+1} + v_t k_t^T\n"
        "y_t = H_t q_t + G_t q_t\n",
        {
            name: S(
                "scalar data-dependent",
                "scalar_data",
                "v_t k_t^T",
                ("scalar: sigmoid(a_t) -> logsigmoid(a_t) proven",),
            )
            for name in ("H", "G")
        },
        "linear: _r0 + _r1",
        SCALAR_DECAY,
        groups=(("H",), ("G",)),
    ),
    "vector_state": Row(
        "mixer m\nin q[K], k[K], a\nstate z[K]\nz_t = sigmoid(a_t) z_{t-1} + k_t\ny_t = z_t . q_t\n",
        {
            "z": S(
                "scalar data-dependent",
                "scalar_data",
                "k_t",
                ("scalar: sigmoid(a_t) -> logsigmoid(a_t) proven",),
            )
        },
        "linear: _r0",
        SCALAR_DECAY,
    ),
    "per_channel_skip": Row(
        text("H_t = H_{t-1} + v_t k_t^T", extra="param D[V]\n", out="y_t = H_t q_t + D ⊙ v_t"),
        {"H": S("identity", "identity", "v_t k_t^T")},
        "linear + skip: _r0 + v_t * D",
        SCALAR_DECAY,
    ),
    "scaled_readout": Row(
        text("H_t = H_{t-1} + v_t k_t^T", out="y_t = 0.5 H_t q_t"),
        {"H": S("identity", "identity", "v_t k_t^T")},
        "linear: 0.5 * _r0",
        SCALAR_DECAY,
    ),
    # ---- no chunked form
    "sequential_tanh": Row(
        text("H_t = tanh(H_{t-1}) + v_t k_t^T"),
        {"H": S("not affine", "not_affine", "")},
        "linear: _r0",
        SEQUENTIAL,
        chunkable=False,
        reason="tanh(...) of a state is not linear in it (tanh(H_{t-1}) at line 4, column 7)",
    ),
    "sequential_square": Row(
        text("H_t = H_{t-1} ⊙ H_{t-1} + v_t k_t^T"),
        {"H": S("not affine", "not_affine", "")},
        "linear: _r0",
        SEQUENTIAL,
        chunkable=False,
        reason="quadratic in the state (H_{t-1} * H_{t-1} at line 4, column 7)",
    ),
    "vector_erase_strength_written_with_star": Row(
        text(
            "H_t = H_{t-1} - (b_t * (H_{t-1} k_t)) k_t^T + (b_t * v_t) k_t^T",
            "q[K], k[K], v[V], b[V]",
        ),
        {"H": S("general dense", "general_dense", "b_t * v_t k_t^T")},
        "linear: _r0",
        SEQUENTIAL,
        chunkable=False,
        reason="multiplies H_{t-1} on both sides: diag(b_t) on the value side",
    ),
    "vector_erase_strength_written_with_diag": Row(
        text(
            "H_t = H_{t-1} - diag(b_t) (H_{t-1} k_t) k_t^T + diag(b_t) v_t k_t^T",
            "q[K], k[K], v[V], b[V]",
        ),
        {"H": S("general dense", "general_dense", "diag(b_t) v_t k_t^T")},
        "linear: _r0",
        SEQUENTIAL,
        chunkable=False,
        reason="multiplies H_{t-1} on both sides: diag(b_t) on the value side",
    ),
    "value_side_householder": Row(
        text(
            "H_t = (I - beta_t v_t v_t^T) diag(exp(gv_t)) H_{t-1} + beta_t v_t k_t^T",
            "q[K], k[K], v[V], gv[V], beta",
        ),
        {
            "H": S(
                "value-side (transposed) diagonal times identity minus rank-1",
                "value_side_diagonal_plus_low_rank",
                "beta_t v_t k_t^T",
                ("value: diag(exp(gv_t)) -> gv_t unproven",),
                erase="beta_t, v_t",
            )
        },
        "linear: _r0",
        VALUE_SIDE,
        warnings=("cannot prove the decay diag(exp(gv_t))",),
    ),
    "vector_write_scale_with_star": Row(
        text("H_t = H_{t-1} + (beta_t * v_t) k_t^T", "q[K], k[K], v[V], beta[V]"),
        {"H": S("identity", "identity", "beta_t * v_t k_t^T")},
        "linear: _r0",
        SCALAR_DECAY,
    ),
    "general_dense": Row(
        text("H_t = M_t H_{t-1} + v_t k_t^T", "q[K], k[K], v[V], M[V, V]"),
        {"H": S("general dense", "general_dense", "v_t k_t^T")},
        "linear: _r0",
        SEQUENTIAL,
        chunkable=False,
        reason="acts on the value side (from the left) with M_t:",
    ),
    "coupled_states": Row(
        """mixer m
in q[K], k[K], v[V]
state H[V, K], G[V, K]
H_t = H_{t-1} + v_t k_t^T
G_t = G_{t-1} + H_t
y_t = G_t q_t
""",
        {
            "H": S("identity", "identity", "v_t k_t^T"),
            "G": S("general dense", "coupled_states", ""),
        },
        "linear: _r0",
        SEQUENTIAL,
        chunkable=False,
        reason="reads another state (H_t at line 5, column 17)",
    ),
    "no_recurrence": Row(
        text("H_t = v_t k_t^T"),
        {"H": S("general dense", "no_recurrence", "v_t k_t^T")},
        "linear: _r0",
        SEQUENTIAL,
        chunkable=False,
        reason="does not depend on H_{t-1}",
    ),
    # several rank-1 writes a token: the transition on the first, the others as sub-tokens
    # that only write (or joined, where the class has a joined kernel)
    "rank_2_write": Row(
        text("H_t = H_{t-1} + v_t k_t^T + u_t w_t^T", "q[K], k[K], v[V], u[V], w[K]"),
        {"H": S("identity", "identity", "u_t w_t^T + v_t k_t^T")},  # the writes by their text
        "linear: _r0",
        SCALAR_DECAY,
    ),
    "rank_2_write_diagonal": Row(
        text(
            "H_t = H_{t-1} diag(a_t) + v_t k_t^T + u_t w_t^T", "q[K], k[K], v[V], u[V], w[K], a[K]"
        ),
        {
            "H": S(
                "diagonal key-side",
                "diagonal_key",
                "u_t w_t^T + v_t k_t^T",
                ("key: diag(a_t) -> log(a_t) unproven",),
            )
        },
        "linear: _r0",
        DIAGONAL,
        warnings=("cannot prove the decay diag(a_t)",),
    ),
    "rank_2_write_delta": Row(  # the write along the erase key goes with the erase, first
        text(
            "H_t = H_{t-1} (I - b_t k_t k_t^T) + u_t w_t^T + b_t v_t k_t^T",
            "q[K], k[K], v[V], u[V], w[K], b",
        ),
        {"H": S("identity minus rank-1", "delta", "b_t v_t k_t^T + u_t w_t^T", (), "b_t, k_t")},
        "linear: _r0",
        DELTA,
    ),
    # writes that share a value or a key are one rank-1 write of the sum of the other factors
    "writes_sharing_a_key": Row(
        text("H_t = H_{t-1} + (v_t - g_t * v_t) k_t^T", "q[K], k[K], v[V], g[V]"),
        {"H": S("identity", "identity", "-(g_t * v_t) + v_t k_t^T")},  # the value is the sum
        "linear: _r0",
        SCALAR_DECAY,
    ),
    "writes_sharing_a_value": Row(
        text("H_t = H_{t-1} + v_t k_t^T + 2 v_t w_t^T", "q[K], k[K], v[V], w[K]"),
        {"H": S("identity", "identity", "v_t (k_t + 2 w_t)^T")},
        "linear: _r0",
        SCALAR_DECAY,
    ),
    "full_matrix_write": Row(
        text("H_t = H_{t-1} + M_t", "q[K], M[V, K]"),
        {"H": S("identity", "identity", "")},
        "linear: _r0",
        SEQUENTIAL,
        chunkable=False,
        reason="not an outer product",
    ),
    "negative_decay": Row(
        text("H_t = -0.5 H_{t-1} + v_t k_t^T"),
        {
            "H": S(
                "scalar constant",
                "scalar_constant",
                "v_t k_t^T",
                ("scalar: -0.5 -> log(-0.5) unproven",),
            )
        },
        "linear: _r0",
        SEQUENTIAL,
        chunkable=False,
        reason="is not positive",
        warnings=("the constant -0.5 is not in (0, 1]",),
    ),
    # ---- analysis-only warnings
    "decay_can_exceed_one": Row(
        text("H_t = exp(x_t) H_{t-1} + v_t k_t^T", "q[K], k[K], v[V], x"),
        {
            "H": S(
                "scalar data-dependent",
                "scalar_data",
                "v_t k_t^T",
                ("scalar: exp(x_t) -> x_t unproven",),
            )
        },
        "linear: _r0",
        SCALAR_DECAY,
        warnings=("cannot prove the decay exp(x_t) of H is in (0, 1]",),
    ),
    "state_never_read": Row(
        """mixer m
in q[K], k[K], v[V]
state H[V, K], U[V, K]
H_t = H_{t-1} + v_t k_t^T
U_t = U_{t-1} + v_t k_t^T
y_t = H_t q_t
""",
        {"H": S("identity", "identity", "v_t k_t^T"), "U": S("identity", "identity", "v_t k_t^T")},
        "linear: _r0",
        SCALAR_DECAY,
        warnings=("state U is never read by an output",),
    ),
}

SHIPPED = sorted(p.name for p in SPECS.glob("*.mix"))
VARIANT_ROWS = [k for k, r in ROWS.items() if not r.spec.endswith(".mix")]


def load(spec: str) -> Spec:
    """A shipped spec by file name, or spec text."""
    return load_spec(SPECS / spec) if spec.endswith(".mix") else load_spec(text=spec)


def write_text(s) -> str:
    parts = []
    for w in s.writes:
        key = str(w.key)
        body = key if w.value is None else f"{w.value} {f'({key})' if ' ' in key else key}^T"
        parts.append(f"{w.scale} {body}" if w.scale is not None else body)
    return " + ".join(parts)


def gate_text(g) -> str:
    return f"{g.side}: {g.decay} -> {g.log} {'proven' if g.proven else 'unproven'}"


def test_table_covers_every_shipped_spec_and_enough_variants():
    assert sorted(r.spec for r in ROWS.values() if r.spec.endswith(".mix")) == SHIPPED
    assert len(VARIANT_ROWS) >= 24
    # every transition class and every rule of the table shows up in some row
    seen_labels = {st.label for r in ROWS.values() for st in r.states.values()}
    assert seen_labels == {rule.label for c in CLASSES for rule in c.rules}
    seen_rules = {st.rule for r in ROWS.values() for st in r.states.values()}
    assert seen_rules == {rule.name for c in CLASSES for rule in c.rules}


@pytest.mark.parametrize("name", list(ROWS))
def test_row(name):
    row = ROWS[name]
    facts = analyze(load(row.spec))
    got = {
        s.name: S(
            s.transition.label,
            s.transition.rule.name,
            write_text(s),
            tuple(gate_text(g) for g in s.transition.gates),
            None if (erase := s.transition.args.erase()) is None else f"{erase.beta}, {erase.key}",
        )
        for s in facts.states
    }
    assert got == row.states
    (out,) = facts.outputs
    assert f"{out.form}: {out.expr}" == row.output
    assert facts.chunkable is row.chunkable
    assert row.algorithm in facts.algorithm
    if row.groups is not None:
        assert tuple(g.states for g in facts.groups) == row.groups
    if row.reason is not None:
        assert row.reason in facts.reason
    else:
        assert facts.reason is None
    assert len(facts.warnings) == len(row.warnings), [w.message for w in facts.warnings]
    for w, piece in zip(facts.warnings, row.warnings, strict=True):
        assert piece in w.message
        assert "^" in str(w)  # located, with a caret under the problem


def test_transition_and_write_pieces_the_backend_reads():
    facts = analyze(load("mamba2.mix"))
    h = facts.state("H")
    assert str(h.transition.log("scalar")) == "dt_t A"
    assert h.transition.log("key") is None
    assert (h.vector, h.shape, h.rank) == (False, ("P", "N"), 1)
    assert [str(r.query) for r in facts.outputs[0].readouts] == ["C_t"]
    assert str(facts.outputs[0].skip) == "D x_t"
    gdn = analyze(load("gated_deltanet.mix")).state("H")
    assert (str(gdn.transition.args.beta), str(gdn.transition.args.key)) == ("beta_t", "k_t")
    assert "stable only if" in gdn.stability
    safe = analyze(load(ROWS["deltanet_derived_key_and_beta"].spec)).state("H")
    assert safe.stability.startswith("stable:")


@pytest.mark.parametrize(
    ("row", "least"),
    [("rwkv7", "-0.6065306597126334"), ("kda", None), ("kda_times_a_scalar_decay", None)],
)
def test_dplr_kernel_gets_the_gates_proven_lower_bound(row, least):
    """The kernel is passed the least log-gate the interval arithmetic proves: RWKV-7's
    -exp(-0.5) sigmoid(d_t) >= -exp(-0.5); none for KDA's g_t or a logsigmoid, unbounded."""
    (group,) = analyze(load(ROWS[row].spec)).groups
    bound = {a.name: a for a in group.args}["gk_min"]
    assert bound.layout == "bound"
    assert (None if bound.expr is None else bound.expr.text) == least


def test_dependency_graph_labels_lags_and_kinds():
    facts = analyze(load("linear_attention_normalized.mix"))
    g = facts.graph
    assert g.nodes["q"]["kind"] == "input" and g.nodes["H"]["kind"] == "state"
    assert g.nodes["y"]["kind"] == "output"
    assert g.edges["H", "H"]["lag"] == 1 and g.edges["H", "y"]["lag"] == 0
    assert facts.order.index("H") < facts.order.index("y")
    derived = analyze(load(ROWS["derived_per_token_decay"].spec))
    assert derived.graph.nodes["a"]["kind"] == "value"
    assert derived.order.index("a") < derived.order.index("H")


# ----------------------------------------------------------------------------- errors only analysis sees

NON_CAUSAL = {
    "cycle_through_values": (
        text("a_t = b_t + 1\nb_t = a_t\nH_t = H_{t-1} + v_t k_t^T", out="y_t = H_t q_t + a_t"),
        "depends on itself at the same time step",
    ),
    "cycle_through_a_state": (
        text("a_t = H_t q_t . q_t\nH_t = sigmoid(a_t) H_{t-1} + v_t k_t^T"),
        "depends on itself at the same time step",
    ),
    "a_later_token": (text("H_t = H_{t-1} + v_t k_{t+1}^T"), "refers to a later token"),
}


@pytest.mark.parametrize("name", list(NON_CAUSAL))
def test_non_causal_specs_get_a_located_error(name):
    spec, message = NON_CAUSAL[name]
    with pytest.raises(SpecAnalysisError) as info:
        analyze(load(spec))
    text_ = str(info.value)
    assert message in text_
    assert re.search(r"<string>:\d+:\d+: error:", text_)
    assert re.search(r"\n +\| +\^+", text_)  # a caret line under the spec line


def test_the_plan_keeps_the_order_the_verifier_computed():
    """The analysis reads the verified spec's order rather than computing one of its own: given
    another order that is as good (a_t and b_t read neither), the plan follows it."""
    spec = load(
        text("a_t = x_t\nb_t = 2 x_t\nH_t = a_t b_t H_{t-1} + v_t k_t^T", "q[K], k[K], v[V], x")
    )
    assert analyze(spec).order == ("a", "b", "H", "y")
    swapped = (spec.order[1], spec.order[0], *spec.order[2:])
    assert analyze(replace(spec, order=swapped)).order == ("b", "a", "H", "y")


def test_a_vector_state_read_both_entrywise_and_by_a_dot_is_refused():
    spec = load(
        "mixer both\nin i[V], f[V], o[V]\nstate c[V]\nc_t = sigmoid(f_t) * c_{t-1} + i_t\n"
        "y_t = c_t / (c_t . o_t)\n"
    )
    with pytest.raises(
        SpecError, match="NYI: the vector state c is read both entry by entry"
    ) as info:
        analyze(spec)
    assert "^" in str(info.value)


# ----------------------------------------------------------------------------- rewrites keep facts


def facts_summary(facts: Plan) -> tuple:
    states = tuple(
        (
            s.name,
            s.transition.label,
            s.transition.rule.name,
            tuple((g.side, str(g.log), g.proven) for g in s.transition.gates),
            s.transition.args.signature(),
            write_text(s),
            s.transition.chunkable,
        )
        for s in facts.states
    )
    outputs = tuple(
        (o.name, o.form, str(o.expr), tuple((r.state, str(r.query)) for r in o.readouts))
        for o in facts.outputs
    )
    return states, outputs, tuple(g.states for g in facts.groups), facts.algorithm


class Rewriter:
    """Algebraic identities applied to one node of an expression; each returns an equal node."""

    def __init__(self, spec: Spec, states: set[str]) -> None:
        self.typer = Typer(spec.mixer, dict(spec.symbols))
        self.states = states
        # node -> whether a state occurs in it, by identity: the pool of every site is asked
        # about at every site, and hashing a deep node walks all of it
        self._stateful: dict[int, tuple[Expr, bool]] = {}

    def shape(self, e: Expr):
        return self.typer.shape_of(e)

    def stateful(self, e: Expr) -> bool:
        known = self._stateful.get(id(e))
        if known is None or known[0] is not e:
            found = any(isinstance(n, Timed) and n.name in self.states for n in walk(e))
            known = self._stateful[id(e)] = (e, found)
        return known[1]

    def scalar(self, e: Expr) -> bool:
        return self.shape(e) == SCALAR

    def options(self, e: Expr, linear: bool, pool: list[Expr]) -> list[tuple[str, Expr]]:
        out: list[tuple[str, Expr]] = []
        if (
            isinstance(e, Binary)
            and e.op in ("@", "*")
            and (self.scalar(e.left) or self.scalar(e.right))
        ):
            out.append(("commute a scalar", Binary(e.op, e.right, e.left)))
            out.append(
                ("⊙ <-> juxtaposition", Binary("*" if e.op == "@" else "@", e.left, e.right))
            )
        if (
            isinstance(e, Binary)
            and e.op == "@"
            and isinstance(e.left, Binary)
            and e.left.op == "@"
        ):
            out.append(
                ("reassociate", Binary("@", e.left.left, Binary("@", e.left.right, e.right)))
            )
        if (
            isinstance(e, Binary)
            and e.op == "@"
            and isinstance(e.right, Binary)
            and e.right.op == "@"
        ):
            out.append(
                ("reassociate", Binary("@", Binary("@", e.left, e.right.left), e.right.right))
            )
        if isinstance(e, Binary) and e.op in ("@", "*"):
            for side in ("left", "right"):
                s = getattr(e, side)
                other = e.right if side == "left" else e.left
                if isinstance(s, Binary) and s.op in ("+", "-") and self.same_size(s.left, s.right):
                    if e.op == "*" and not self.same_size(s.left, other) and not self.scalar(other):
                        continue
                    a, b = (
                        (Binary(e.op, s.left, other), Binary(e.op, s.right, other))
                        if side == "left"
                        else (Binary(e.op, other, s.left), Binary(e.op, other, s.right))
                    )
                    out.append(("distribute", Binary(s.op, a, b)))
        if isinstance(e, Binary) and e.op in ("+", "-"):
            a, b = e.left, e.right
            if isinstance(a, Binary) and isinstance(b, Binary) and a.op == b.op == "@":
                if a.left == b.left and self.same_size(a.right, b.right):
                    out.append(
                        ("factor on the left", Binary("@", a.left, Binary(e.op, a.right, b.right)))
                    )
                if a.right == b.right and self.same_size(a.left, b.left):
                    out.append(
                        ("factor on the right", Binary("@", Binary(e.op, a.left, b.left), a.right))
                    )
        shape = self.shape(e)
        for t in pool:
            if self.shape(t) == shape and (linear or not self.stateful(t)):
                out.append(("add and subtract", Binary("-", Binary("+", e, t), t)))
        return out

    def same_size(self, a: Expr, b: Expr) -> bool:
        sa, sb = self.shape(a), self.shape(b)
        return sa == sb or (IDENTITY in (sa, sb) and (sa if sb == IDENTITY else sb)[0] != "1")

    def sites(self, e: Expr, linear: bool = True, path: tuple = ()) -> list[tuple[tuple, bool]]:
        """Every node's path, and whether it sits where a state term may be added (a linear
        position: only sums that do not broadcast, negations, transposes and products with
        state-free factors above it)."""
        out = [(path, linear)]
        if isinstance(e, Binary):
            # a sum that broadcasts (1 - a_t with a_t a vector) is not linear in a state
            sizes = (self.shape(e.left), self.shape(e.right))
            keep = e.op in ("+", "-") and (sizes[0] == sizes[1] or IDENTITY in sizes)
            for side, child, sibling in (("left", e.left, e.right), ("right", e.right, e.left)):
                child_linear = linear and (
                    keep or (e.op in ("@", "*") and not self.stateful(sibling))
                )
                out += self.sites(child, child_linear, (*path, side))
        elif isinstance(e, Neg | Transpose):
            out += self.sites(e.operand, linear, (*path, "operand"))
        elif isinstance(e, Call):
            for i, a in enumerate(e.args):
                out += self.sites(a, False, (*path, i))
        return out


def get(e: Expr, path: tuple) -> Expr:
    for p in path:
        e = e.args[p] if isinstance(p, int) else getattr(e, p)
    return e


def put(e: Expr, path: tuple, new: Expr) -> Expr:
    if not path:
        return new
    p, rest = path[0], path[1:]
    if isinstance(p, int):
        args = list(e.args)
        args[p] = put(args[p], rest, new)
        return replace(e, args=tuple(args))
    return replace(e, **{p: put(getattr(e, p), rest, new)})


def rewrite(data, spec: Spec) -> tuple[Spec, list[str]]:
    mixer = spec.mixer
    states = {s.name for s in mixer.states}
    rw = Rewriter(spec, states)
    equations = list(mixer.equations)
    targets = [i for i, eq in enumerate(equations) if eq.target in states]
    log = []
    for _ in range(data.draw(st.integers(1, 5), label="steps")):
        i = data.draw(st.sampled_from(targets), label="equation")
        value = equations[i].value
        pool = [get(value, p) for p, _ in rw.sites(value)]
        choices = [
            (p, name, new)
            for p, linear in rw.sites(value)
            for name, new in rw.options(get(value, p), linear, pool)
        ]
        if not choices:
            continue
        # an index: sampled_from(choices) would hash every choice, a whole expression each
        path, name, new = choices[data.draw(st.sampled_from(range(len(choices))), label="rewrite")]
        log.append(f"{name} at {path}")
        equations[i] = replace(equations[i], value=put(value, path, new))
    new_mixer = replace(mixer, equations=tuple(equations))
    try:
        verified = verify(new_mixer)  # every rewrite keeps the spec well-typed
    except SpecSizeError:
        # adding and subtracting whole subexpressions grows an update threefold a rewrite:
        # past the size limit (a spec with per-token values, DeltaProduct's) it is no test
        reject()
    rewritten = Spec(
        new_mixer, Source(str(new_mixer)), verified.shapes, verified.symbols, verified.order
    )
    return rewritten, log


@pytest.mark.parametrize("examples", [5, pytest.param(50, marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", SHIPPED)
def test_rewrites_of_updates_keep_the_facts(name, examples):
    """Five rewritten spellings of every shipped spec by default (90 in all), fifty a spec
    with -m slow."""
    spec = load(name)
    want = facts_summary(analyze(spec))

    @settings(max_examples=examples, suppress_health_check=[HealthCheck.too_slow])
    @given(data=st.data())
    def spelled_otherwise(data):
        new, log = rewrite(data, spec)
        note(str(new.mixer))
        note("; ".join(log))
        assert facts_summary(analyze(new)) == want

    spelled_otherwise()


def test_like_terms_inside_elementwise_products_meet():
    """Found by the rewrite test with other draws: Mamba-1 with its value written
    (dt + dt) * x - dt * x (Canon moves the numbers and scalars out of an elementwise product,
    so (2 dt) * x and dt * x meet)."""
    spec = load("mamba1.mix")
    text = str(spec.mixer).replace("(dt_t * x_t) B_t^T", "((dt_t + dt_t) * x_t - dt_t * x_t) B_t^T")
    assert text != str(spec.mixer)
    rewritten = load(text)
    assert analyze(rewritten).chunkable  # the writes along one key are joined
    assert facts_summary(analyze(rewritten)) == facts_summary(analyze(spec))


@pytest.mark.parametrize(
    ("name", "written", "rewritten"),
    [
        # a constant written as a sum whose parts are an exact fraction and a decimal
        (
            "retnet_xpos.mix",
            "k_t / sqrt(K)",
            "k_t / (sqrt(K) + 1 / (512 + gamma - gamma) - 1 / 512)",
        ),
        # a scalar inside an elementwise product of vectors, or outside it
        (
            "precond_gdn.mix",
            "sigmoid(b_t) kn(k_t) * kn(k_t)",
            "sigmoid(b_t) (kn(k_t) + (sigmoid(a_t) A_{t-1}) - (sigmoid(a_t) A_{t-1})) * kn(k_t)",
        ),
        # Th_t read before Th_{t-1} (the readouts' numbers are canonical, not as found)
        (
            "mamba3.mix",
            "H_t = a_t H_{t-1} + ",
            "H_t = a_t H_{t-1} + (lam_t dt_t x_t turn(B_t + B_bias, Th_t)^T"
            " - lam_t dt_t x_t turn(B_t + B_bias, Th_t)^T) + ",
        ),
        # a write spelled ahead of the others, then taken away in another spelling (equal
        # once a function's argument is canonical): the writes' order is not the spelling's
        (
            "mamba3_mimo.mix",
            "H_t = a_t H_{t-1} + ",
            "H_t = a_t H_{t-1} + (lam_t dt_t (mimo_x1 * x_t) turn(B1_t + B1_bias, Th_t)^T"
            " - lam_t dt_t (mimo_x1 * x_t) turn(B1_t + B1_bias + B1_bias - B1_bias, Th_t)^T) + ",
        ),
    ],
)
def test_spellings_found_by_the_slow_rewrite_test_keep_the_facts(name, written, rewritten):
    """Found by the rewrite test with -m slow (fifty draws a spec)."""
    text = (SPECS / name).read_text()
    assert written in text
    want = facts_summary(analyze(load(name)))
    assert facts_summary(analyze(load(text.replace(written, rewritten)))) == want


def test_rewriter_reaches_each_kind_of_rewrite():
    # the strategy is not vacuous: on the shipped specs every identity has somewhere to apply
    seen = set()
    for name in SHIPPED:
        spec = load(name)
        rw = Rewriter(spec, {s.name for s in spec.mixer.states})
        for eq in spec.mixer.equations:
            if eq.target not in rw.states:
                continue
            sites = rw.sites(eq.value)
            pool = [get(eq.value, p) for p, _ in sites]
            for p, linear in sites:
                seen |= {n for n, _ in rw.options(get(eq.value, p), linear, pool)}
    assert seen >= {
        "commute a scalar",
        "⊙ <-> juxtaposition",
        "reassociate",
        "distribute",
        "add and subtract",
    }
    # factoring appears once something was distributed
    spec = load("deltanet.mix")
    rw = Rewriter(spec, {"H"})
    value = spec.mixer.update("H").value
    path = next(
        p
        for p, lin in rw.sites(value)
        for n, _ in rw.options(get(value, p), lin, [])
        if n == "distribute"
    )
    new = next(x for n, x in rw.options(get(value, path), True, []) if n == "distribute")
    assert any(n.startswith("factor") for n, _ in rw.options(new, True, []))


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (
            "H_t = exp(dt_t A) H_{t-1} + dt_t x_t B_t^T",
            "H_t = H_{t-1} exp(A dt_t) + x_t (dt_t B_t)^T",
        ),
        (
            "H_t = exp(dt_t A) H_{t-1} + dt_t x_t B_t^T",
            "H_t = exp(dt_t A + x_t . x_t - x_t . x_t) ⊙ H_{t-1} + dt_t ⊙ (x_t B_t^T)",
        ),
        (
            "H_t = exp(dt_t A) H_{t-1} + dt_t x_t B_t^T",
            "H_t = exp(dt_t A) H_{t-1} + exp(A dt_t) H_{t-1} - exp(dt_t A) H_{t-1} + dt_t x_t B_t^T",
        ),
    ],
)
def test_equal_atoms_spelled_differently_are_one_term(a, b):
    base = "mixer m\nin x[P], dt, B[N], C[N]\nparam A\nstate H[P, N]\n{}\ny_t = H_t C_t\n"
    assert facts_summary(analyze(load(base.format(a)))) == facts_summary(
        analyze(load(base.format(b)))
    )


# ----------------------------------------------------------------------------- cost model


def test_formula_arithmetic_and_printing():
    K, V, C = Formula.size("K"), Formula.size("V"), Formula.size("C")
    f = 2 * C * K + 8 * K * V / C + C * C / 3
    assert str(f) == "C^2/3 + 2*C*K + 8*K*V/C"
    assert f.value({"K": 64, "V": 32, "C": 16}) == pytest.approx(
        16**2 / 3 + 2 * 16 * 64 + 8 * 64 * 32 / 16
    )
    assert f.value({"K": 64}) is None
    assert str(Formula.size("64") * K) == "64*K"
    assert str(K + (-1) * K) == "0"


def test_costs_of_linear_attention_by_hand():
    c = costs(analyze(load("linear_attention.mix")))
    (g,) = c.groups
    # S += v k^T (2KV) and y = S q (2KV); the state read and written in fp32 every token
    assert str(g.recurrent.flops) == "4*K*V"
    assert str(g.recurrent.bytes) == "8*K*V"
    # Q K^T (2CK), mask (C), P V (2CV), Q S_0 (2KV), K^T V (2KV)
    assert str(g.chunked.flops) == "2*C*K + 2*C*V + 4*K*V + C"
    assert str(g.quadratic.flops) == "2*K*T + 2*T*V + T"
    # q, k, v in and y out, 2 bytes each
    assert str(c.io) == "4*K + 4*V"
    sizes = {"K": 64, "V": 64, "C": 64, "T": 4096}
    assert c.chunked.flops.value(sizes) == 2 * 64 * 64 * 2 + 4 * 64 * 64 + 64
    assert c.symbols == ("C", "K", "T", "V")


def test_costs_of_the_delta_rule_include_the_solve_and_kkt():
    c = costs(analyze(load("deltanet.mix")))
    text_ = str(c.groups[0].chunked.flops)
    assert "C^2/3" in text_  # the unit-triangular solve, C^3/3 per chunk
    assert "6*C*K" in text_  # K K^T, W = T K and Q K^T
    assert "6*K*V" in text_  # W S_0, K^T V_new, Q S_0
    assert "T^2/3" in str(c.groups[0].quadratic.flops)


def test_costs_of_gla_by_hand():
    c = costs(analyze(load("gla.mix")))
    (g,) = c.groups
    # each of the C (C + 1) / 2 query-key pairs of a chunk once ((C + 1) K per token), the
    # scores times V in one C x C product (2CV), Q S_0 and K^T V (4KV), the chunk decay (KV/C)
    assert str(g.chunked.flops) == "C*K + 2*C*V + 4*K*V + K*V/C + K"
    assert "not counted" in g.note


def test_costs_of_sequential_specs_have_no_chunked_form():
    c = costs(analyze(load(ROWS["sequential_tanh"].spec)))
    assert c.chunked is None and c.quadratic is None
    assert "lower bound" in c.groups[0].note


def test_cost_symbols_avoid_the_specs_own_sizes():
    spec = load(
        "mixer m\nin q[C], k[C], v[V]\nstate H[V, C]\nH_t = H_{t-1} + v_t k_t^T\ny_t = H_t q_t\n"
    )
    c = costs(analyze(spec))
    assert c.chunk == "C_chunk"  # (T cannot be a spec size: the verifier reserves it)
    assert "C_chunk" in c.chunked.flops.symbols


def test_every_spec_error_is_a_mixc_error():
    with pytest.raises(SpecError):
        analyze(load(NON_CAUSAL["a_later_token"][0]))


def test_a_readout_says_which_time_it_reads_and_each_time_is_its_own_query():
    rwkv6 = analyze(load("rwkv6.mix"))
    (r,) = rwkv6.outputs[0].readouts
    assert (r.state, str(r.query), r.offset, str(r.read)) == ("H", "r_t", -1, "H_{t-1}")
    assert [(str(q.expr), q.offset) for q in rwkv6.groups[0].queries] == [("r_t", -1)]
    both = text("H_t = H_{t-1} + v_t k_t^T", out="y_t = H_{t-1} q_t + H_t q_t + H_{t-1} q_t")
    plan = analyze(load(both))
    assert [(str(q.expr), q.offset) for q in plan.groups[0].queries] == [("q_t", -1), ("q_t", 0)]
    assert str(plan.outputs[0].expr) == "2 * _r0 + _r1"
