"""Value-side transitions: a diagonal plus low rank that acts on the state from the left,
`G_t(S) = (D_t + b_t a_t^T) S` on S [V, K] (the gated Oja rule's `(I - beta_t v_t v_t^T)
diag(exp(g_t)) S`), the transpose of the key-side class `S^T (D_t + a_t b_t^T)`.

The rule transposes the update's terms and asks the key-side class (mixc.transitions.dplr),
whose analysis (the variant, beta, the conditions, the stability) then holds for the transpose
as it is; the log-gates are reported on the value side, where they act. The kernel runs on the
state's transpose, so a write `v k^T` passes v as the kernel's key and k as its value (`transposed`).

Chunked form: the kernel `dplr_value`. With a write b_t w_t^T, the transpose S^T_t =
S^T_{t-1} (D_t + a_t b_t^T) + w_t b_t^T is a key-side diagonal-plus-low-rank recurrence that
chunk_dplr runs, but the output y_t = S_t q_t reads it along its other axis, which chunk_dplr
never forms. What chunk_dplr does form
is the rank-one term's read of the state before each token, u_t = S_{t-1}^T a_t (its output for
the queries a, one token early). With u known, a token whose write's value is the very vector
b the rank-one term acts along changes S by one rank-one write along b,
S_t = D_t S_{t-1} + b_t (u_t + w_t)^T: a value-side diagonal gate, which chunk_diagonal runs
and reads along q. So the kernel is chunk_dplr for u, then chunk_diagonal for y, and needs
the rank-one term to erase along the written vector (`chunk_reason`).
"""

from __future__ import annotations

from dataclasses import replace

from mixc.algebra.expand import Term, transpose_atom
from mixc.algebra.formula import Formula
from mixc.frontend.ir import Expr
from mixc.transitions.base import (
    Maths,
    Rule,
    RuleContext,
    StateTerms,
    Transition,
    TransitionClass,
    sum_of,
)
from mixc.transitions.cost import ACC_BYTES, ClassCost, FormCost, GroupDims
from mixc.transitions.dplr import DPLR
from mixc.transitions.writing import Core, RandomForm, Update, Writer

_RULE = "value_side_diagonal_plus_low_rank"
GATED_ERASE = Rule(
    _RULE,
    "value-side (transposed) diagonal times identity minus rank-1",
    "(I - beta_t v_t v_t^T) D_t S_{t-1}, the transpose of S^T_{t-1} D_t (I - beta_t v_t v_t^T)",
)
ERASE = Rule(
    _RULE,
    "value-side (transposed) diagonal minus rank-1",
    "(D_t - beta_t v_t v_t^T) S_{t-1}, the transpose of S^T_{t-1} (D_t - beta_t v_t v_t^T)",
)
GENERAL = Rule(
    _RULE,
    "value-side (transposed) diagonal plus low rank",
    "(D_t + b_t a_t^T) S_{t-1}, the transpose of S^T_{t-1} (D_t + a_t b_t^T)",
)
#: Each rule of this class and the key-side class's rule it transposes.
_KEY_SIDE = dict(zip((GATED_ERASE, ERASE, GENERAL), DPLR.rules, strict=True))


def _transposed(t: Term, ctx: RuleContext) -> Term:
    """A term of S's update as a term of S^T's: its chain reversed, each factor transposed."""
    ex = ctx.expander
    return replace(t, chain=tuple(transpose_atom(a, ex.shape(a)) for a in reversed(t.chain)))


def _resided(tr: Transition, old: str, new: str) -> tuple:
    return tuple(replace(g, side=new) if g.side == old else g for g in tr.gates)


def key_side(tr: Transition) -> Transition:
    """The key-side transition of the transpose that `tr` is (its rule, its gates on the key
    side), for the key-side class to analyse."""
    return replace(
        tr, rule=_KEY_SIDE[tr.rule], transition_class=DPLR, gates=_resided(tr, "value", "key")
    )


def _oja(w: Writer, c: Core, forms: tuple[str, ...]) -> Update:
    """(I - beta u u^T) diag(exp(g)) S + beta u k^T with u the unit value (the gated Oja rule),
    factored or distributed."""
    g, b = w.fresh(("g", "gv", "f")), w.fresh(("beta", "b", "eta"))
    w.inputs += [f"{g}[{c.V}]", b]
    u, T, minus = f"l2norm({c.v}_t)", w.T, w.minus
    d = w.pick(f"diag(exp({g}_t))", f"diag(sigmoid({g}_t))")
    beta = w.pick(f"sigmoid({b}_t)", f"2 sigmoid({b}_t)")
    write = f"{beta} {u} {c.kx}{T}"
    return Update(
        w.pick(
            f"(I {minus} {beta} {u} {u}{T}) {d} {c.prev} + {write}",
            f"{d} {c.prev} {minus} {beta} {u} ({u}{T} {d} {c.prev}) + {write}",
        )
    )


class ValueSide(TransitionClass):
    name = "value_side"
    rules = (GATED_ERASE, ERASE, GENERAL)
    kernel = "dplr_value"
    transposed = True
    algorithm = (
        "value-side (transposed) diagonal plus low rank: chunk_dplr on the transpose for the "
        "rank-1 term's reads u_t = S_{t-1}^T a_t, then chunk_diagonal (a value-side gate) for "
        "the outputs S_t q_t"
    )

    def match(self, terms: StateTerms, ctx: RuleContext):
        """Terms with factors left of S_{t-1} (and none right of it), whose transposes are the
        key-side diagonal plus low rank."""
        if "1" in ctx.shape or not any(at > 0 for _, at in terms):
            return None
        if any(at + 1 < len(t.chain) for t, at in terms):
            return None
        flipped = [(_transposed(t, ctx), len(t.chain) - 1 - at) for t, at in terms]
        shape = (ctx.shape[1], ctx.shape[0])
        found = DPLR.match(flipped, replace(ctx, shape=shape))
        if found is None:
            return None
        rule = next(r for r, k in _KEY_SIDE.items() if k == found.rule)
        gates = _resided(found, "key", "value")
        return Transition(rule, self, gates, found.args)

    def kernel_args(self, tr):
        """a, the log-gate and its bound; b is the write's key (`chunk_reason`)."""
        return tuple(a for a in DPLR.kernel_args(key_side(tr)) if a.name != "b")

    def chunk_reason(self, state, tr, write_key):
        if str(tr.args.key) != str(write_key):
            return (
                f"NYI: the value-side rank-1 term of {state} acts along {tr.args.key} but the "
                f"write's value is {write_key}; the chunked form needs them equal (it folds the "
                "rank-1 term into the write)"
            )
        return None

    def summary_probe(self, tr):
        """The transition acts on the value axis (the columns of the kernel's state M [K, V]),
        whose rows run along the kernel's v: probed beside its values, as rows."""
        return ("v", "rows")

    def chunk_size(self, tr):
        return DPLR.chunk_size(key_side(tr))

    def conditions(self, state, tr):
        return DPLR.conditions(state, key_side(tr))

    def unit_key(self, state, tr):
        return DPLR.unit_key(state, key_side(tr))

    def stability(self, tr, params):
        return DPLR.stability(key_side(tr), params)

    def roles(self, tr: Transition) -> list[tuple[str, Expr]]:
        """The key-side class's roles, its key (b, along which the rank-1 term acts, on the value
        side here) named for what it is."""
        return [("erase vector" if r == "key" else r, e) for r, e in super().roles(tr)]

    def random_forms(self) -> dict[str, RandomForm]:
        return {"oja": _oja}

    def maths(self, tr: Transition) -> Maths:
        """Two passes on S = H^T (K rows: b, the write's key as the kernel takes it)."""
        gate = sum_of(tr.log("value"), tr.log("scalar"))
        legend = (
            f"a rows = {tr.args.read}",
            f"b rows = K rows = {tr.args.key}",
            f"g = {gate} (one log-gate per channel of b)" if gate else "g = 0 (no decay)",
        )
        return Maths(
            legend,
            (
                "S_t = S_{t-1} (diag(exp(g_t)) + a_t b_t^T) + v_t b_t^T acts on S's value axis; "
                "S^T_t = (diag(exp(g_t)) + b_t a_t^T) S^T_{t-1} + b_t v_t^T is the key-side "
                "diagonal plus low rank",
                "pass 1, chunk_dplr on S^T with the queries a one token early: "
                "u_t = S_{t-1} a_t (the rank-1 term's read), and S_C",
                "pass 2, chunk_diagonal: S_t = S_{t-1} diag(exp(g_t)) + (v_t + u_t) b_t^T "
                "(a value-side gate), Y = its outputs Q S",
                DPLR.maths(key_side(tr)).form[-1],
            ),
        )

    def recurrent_flops(self, tr: Transition, d: GroupDims) -> Formula:
        return DPLR.recurrent_flops(key_side(tr), d)

    def cost(self, tr: Transition, d: GroupDims) -> ClassCost:
        """The key-side kernel's cost with one query (a), plus the value-gated pass."""
        inner = DPLR.cost(key_side(tr), d)
        C = d.C
        second = FormCost(
            2 * C * (d.dk + d.dv) + 4 * d.kv, d.state_bytes / C + ACC_BYTES * (2 * d.dk + d.dv)
        )
        chunked = FormCost(inner.chunked.flops + second.flops, inner.chunked.bytes + second.bytes)
        note = f"two passes: {inner.note}; then a value-gated linear attention pass"
        return ClassCost(chunked, inner.quadratic, note)


VALUE_SIDE = ValueSide()
