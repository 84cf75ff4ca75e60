"""The delta rule: `G_t(S) = a_t S (I - beta_t k_t k_t^T)`, with or without the scalar decay a_t
(DeltaNet, Gated DeltaNet), however the decay and beta are written.

Chunked form: the kernel `delta`, the UT transform: per chunk T = (I + tril(diag(beta) K K^T,
-1))^{-1} diag(beta), W = T K, U = T V, with the triangular inverse in at least fp32.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from mixc.algebra.expand import Term, transpose_atom
from mixc.algebra.formula import Formula
from mixc.algebra.intervals import bounds
from mixc.frontend.ir import Call, Expr, Transpose
from mixc.frontend.shapes import SCALAR
from mixc.transitions.base import (
    CHUNK_MEASURED_ON,
    ChunkSize,
    Condition,
    Erase,
    KernelArg,
    Maths,
    Rule,
    Transition,
    TransitionArgs,
    TransitionClass,
    UnitKey,
    scalar_gates,
)
from mixc.transitions.cost import ACC_BYTES, ClassCost, FormCost, GroupDims
from mixc.transitions.scalar_decay import scalar_gate
from mixc.transitions.writing import Core, RandomForm, Update, Writer


def _monomials(t: Term, ctx, atoms: dict[str, Expr]) -> dict[tuple[str, ...], Fraction | float]:
    """t's coefficient times its scalars, expanded into a sum of monomials: {sorted canonical
    keys of the scalar atoms: coefficient}; `(1 - s) b` is {(b,): 1, (b, s): -1}. Each atom
    met is recorded in `atoms` by its key."""
    poly: dict[tuple[str, ...], Fraction | float] = {(): t.coeff}
    for scalar in t.scalars:
        pieces = ctx.expander.expand(scalar)
        if any(p.gates or any(ctx.expander.shape(a) != SCALAR for a in p.chain) for p in pieces):
            pieces = [Term(scalars=(scalar,))]
        grown: dict[tuple[str, ...], Fraction | float] = {}
        for p in pieces:
            keys = []
            for a in p.scalars + p.chain:
                keys.append(ctx.canon.key(a))
                atoms.setdefault(keys[-1], a)
            for known, c in poly.items():
                key = tuple(sorted(known + tuple(keys)))
                grown[key] = grown.get(key, 0) + c * p.coeff
        poly = {k: c for k, c in grown.items() if c != 0}
    return poly


def _quotient(big: dict, small: dict) -> dict | None:
    """A polynomial q with big = q * small (polynomials as from _monomials), or None: termwise
    when small is one monomial, else a single monomial q (enough for a decay that is a sum)."""
    if not small:
        return None

    def divide(atoms: tuple[str, ...], by: tuple[str, ...]) -> tuple[str, ...] | None:
        rest = list(atoms)
        for a in by:
            if a not in rest:
                return None
            rest.remove(a)
        return tuple(rest)

    if len(small) == 1:
        (by, c0), out = next(iter(small.items())), {}
        for atoms, c in big.items():
            rest = divide(atoms, by)
            if rest is None:
                return None
            out[rest] = c / c0
        return out
    first, c0 = next(iter(small.items()))
    for atoms, c in big.items():
        rest = divide(atoms, first)
        if rest is None:
            continue
        if {tuple(sorted(k + rest)): v * c / c0 for k, v in small.items()} == big:
            return {rest: c / c0}
    return None


# ----------------------------------------------------------------------------- random specs


def _delta_key_and_beta(w: Writer, c: Core) -> tuple[str, str]:
    """The key (l2norm, via a `let`, of the features, or a plain
    unit key) and its beta (sigmoid, 2 sigmoid, or a plain input in (0, 1))."""
    key_kind = w.pick("l2norm", "let", "feature", "plain")
    kx = f"{c.k}_t"
    if key_kind == "let":
        kn, arg = w.fresh(("kn", "unit")), w.fresh(("x", "w"))
        w.lets.append(f"let {kn}({arg}) = l2norm({arg})")
        kx = f"{kn}({c.k}_t)"
    elif key_kind == "feature" and c.phi:
        kx = f"l2norm({c.phi}({c.k}_t))"
    elif key_kind != "plain":
        kx = f"l2norm({c.k}_t)"
    b = w.fresh(("beta", "b", "bt"))
    w.inputs.append(b)
    beta = w.pick(f"sigmoid({b}_t)", f"{b}_t", f"2 sigmoid({b}_t)")
    beta, _ = w.as_value(beta, True) if beta != f"{b}_t" else (beta, True)
    return kx, beta


def _delta_spelling(w: Writer, c: Core, decay: str, beta: str, kx: str) -> str:
    """The delta rule written out, undistributed or distributed."""
    prev, v, T, minus = c.prev, c.v, w.T, w.minus
    write = f"{beta} {v}_t {kx}{T}"
    return w.pick(
        f"{decay}{prev} (I {minus} {beta} {kx} {kx}{T}) + {write}",
        f"{decay}{prev} {minus} {decay}{beta} {prev} {kx} {kx}{T} + {write}",
        f"{prev} {decay}(I {minus} {beta} {kx} {kx}{T}) + {beta} ({v}_t {kx}{T})",
    )


def _update_delta(w: Writer, c: Core, forms: tuple[str, ...]) -> Update:
    """S (I - beta k k^T) + beta v k^T."""
    kx, beta = _delta_key_and_beta(w, c)
    return Update(_delta_spelling(w, c, "", beta, kx))


def _update_gated_delta(w: Writer, c: Core, forms: tuple[str, ...]) -> Update:
    """g S (I - beta k k^T) + beta v k^T, with g one of the scalar-decay forms drawn."""
    kx, beta = _delta_key_and_beta(w, c)
    kinds = [
        f for f in ("constant", "sigmoid", "softplus", "mamba", "log input", "number") if f in forms
    ]
    g, g_atomic = scalar_gate(w, w.pick(*(kinds or ["sigmoid"])))
    decay = (g if g_atomic else f"({g})") + " "
    return Update(_delta_spelling(w, c, decay, beta, kx))


DELTA_RULE = Rule("delta", "identity minus rank-1", "S_{t-1} (I - beta_t k_t k_t^T)")
GATED_DELTA = Rule(
    "gated_delta",
    "scalar decay times identity minus rank-1",
    "a_t S_{t-1} (I - beta_t k_t k_t^T)",
)


@dataclass(frozen=True)
class DeltaArgs(TransitionArgs):
    """The erase `I - beta k k^T`: its strength beta and its key k."""

    beta: Expr = field(metadata={"role": "erase"})
    key: Expr = field(metadata={"role": "key"})

    def erase(self) -> Erase:
        return Erase(self.beta, self.key)


def unnormalised_key(key: Expr) -> Expr | None:
    """The key without its transpose, unless it is an l2norm (then None: its norm is 1)."""
    key = key.operand if isinstance(key, Transpose) else key
    return None if isinstance(key, Call) and key.func == "l2norm" else key


class Delta(TransitionClass):
    name = "delta"
    rules = (DELTA_RULE, GATED_DELTA)
    kernel = "delta"
    algorithm = "chunked delta rule (UT transform, fp32 triangular solve)"
    sub_tokens = True  # a zero beta and a zero log-gate are a step that changes nothing

    def match(self, terms, ctx):
        """a S (I - beta k k^T): one term S times a scalar decay a (or none), one term S k k^T
        whose scalar is -a beta, found by dividing the two scalars as polynomials, however the
        decay is written: `(1 - s) S (I - b k k^T)` expands to four terms, gathered by scalar
        into two."""
        if len(terms) != 2 or any(t.gates for t, _ in terms):
            return None
        ex, key = ctx.expander, ctx.canon.key
        for (t0, at0), (t1, at1) in (terms, terms[::-1]):
            l0, r0 = t0.chain[:at0], t0.chain[at0 + 1 :]
            l1, r1 = t1.chain[:at1], t1.chain[at1 + 1 :]
            if l0 or r0 or l1 or len(r1) != 2:
                continue
            k, kt = r1
            if ex.shape(k)[1] != "1" or key(transpose_atom(k, ex.shape(k))) != key(kt):
                continue
            by_key: dict[str, Expr] = {}
            quotient = _quotient(_monomials(t1, ctx, by_key), _monomials(t0, ctx, by_key))
            if not quotient or (set(quotient) == {()} and -quotient[()] <= 0):
                continue  # none, or a constant beta that is not positive
            beta = ctx.canon.terms(
                [
                    Term(coeff=-c, scalars=tuple(by_key[a] for a in atoms))
                    for atoms, c in quotient.items()
                ]
            )
            decay = tuple(scalar_gates(t0, ctx))
            return Transition(GATED_DELTA if decay else DELTA_RULE, self, decay, DeltaArgs(beta, k))
        return None

    def kernel_args(self, tr):
        return (
            KernelArg("beta", tr.args.beta, "scalar"),
            KernelArg("g", tr.log("scalar"), "scalar"),
        )

    def chunk_reason(self, state, tr, write_key):
        if str(tr.args.key) != str(write_key):
            return (
                f"NYI: the delta rule of {state} erases along {tr.args.key} but writes along "
                f"{write_key}; the chunked form needs the same key in both"
            )
        return None

    def maths(self, tr: Transition) -> Maths:
        """The UT transform of a chunk (with the decay mask Γ when there is a decay)."""
        beta = tr.args.beta
        if not tr.gates:
            return Maths(
                (f"β rows = {beta}",),
                (
                    "T = (I + tril(diag(β) K K^T, -1))^{-1} diag(β),  W = T K,  U = T V",
                    "Y = Q S_0 + (Q K^T ⊙ M) (U - W S_0)",
                    "S_C = S_0 + K^T (U - W S_0)",
                ),
                "the chunked form with one chunk of T tokens (S_0 = 0)",
                scales_writes=True,
            )
        return Maths(
            (f"β rows = {beta}", f"g = {tr.log('scalar')}"),
            (
                "T = (I + tril(diag(β) (K K^T ⊙ Γ), -1))^{-1},  U = T diag(β) V,  "
                "W = T diag(β) diag(exp(b)) K",
                "Y = diag(exp(b)) Q S_0 + (Q K^T ⊙ Γ) (U - W S_0),  "
                "Γ_ij = exp(b_i - b_j) (i >= j, else 0),  b = cumsum(g)",
                "S_C = exp(b_C) S_0 + (diag(exp(b_C - b)) K)^T (U - W S_0)",
            ),
            "the chunked form with one chunk of T tokens (S_0 = 0)",
            scales_writes=True,
        )

    def conditions(self, state, tr):
        """Decays in (0, 1], and beta in [0, 2]: the eigenvalue 1 - beta |k|^2 in [-1, 1]."""
        beta = tr.args.beta
        why = f"delta-rule beta {beta} of {state} in [0, 2]"
        return [*self.decay_conditions(state, tr), Condition(beta, 0.0, 2.0, why)]

    def unit_key(self, state, tr):
        key = unnormalised_key(tr.args.key)
        if key is None:
            return None
        return UnitKey(key, f"delta-rule key {tr.args.key} of {state}: norm <= 1 keeps it stable")

    def chunk_size(self, tr):
        return ChunkSize(
            32,
            f"32 ran 1.12-1.17x faster than 64 for DeltaNet and Gated DeltaNet, {CHUNK_MEASURED_ON}",
        )

    def random_forms(self) -> dict[str, RandomForm]:
        return {"delta": _update_delta, "gated delta": _update_gated_delta}

    def decays(self, tr):
        return bool(tr.gates)

    def stability(self, tr, params):
        """Stable when |k| = 1 and beta is in [0, 2] (eigenvalues 1 and 1 - beta)."""
        beta, key = tr.args.beta, tr.args.key
        unit = isinstance(key, Call) and key.func == "l2norm"
        lo, hi = bounds(beta, defaults=params)
        beta_ok = lo >= 0 and hi <= 2
        parts = [
            f"|{key}| = 1 (l2norm)" if unit else f"|{key}| = 1 not proven (write l2norm({key}))",
            f"{beta} in [{lo:g}, {hi:g}]" if beta_ok else f"{beta} in [0, 2] not proven",
        ]
        verdict = "stable" if unit and beta_ok else "stable only if"
        return (
            f"{verdict}: "
            + ", ".join(parts)
            + " (eigenvalues of I - beta k k^T are 1 and 1 - beta |k|^2)"
        )

    def recurrent_flops(self, tr: Transition, d: GroupDims) -> Formula:
        decay = d.kv if tr.gates else 0  # the erase S^T k and its rank-1 update: 4 d_k d_v
        return decay + 4 * d.kv + 2 * d.nq * d.kv

    def cost(self, tr: Transition, d: GroupDims) -> ClassCost:
        gated = bool(tr.gates)
        mask = 2 if gated else 1
        C, T, nq = d.C, d.T, d.nq
        solve = C * C / 3
        flops = (
            4 * C * d.dk
            + 2 * C * d.dv
            + solve
            + mask * C
            + 4 * d.kv
            + nq * (2 * C * (d.dk + d.dv) + 2 * d.kv)
        )
        if gated:
            flops = flops + d.kv / C
        chunked = FormCost(
            flops, d.state_bytes / C + 4 * ACC_BYTES * C + ACC_BYTES * (d.dk + 2 * d.dv)
        )
        no_state = 4 * T * d.dk + 2 * T * d.dv + T * T / 3 + mask * T + nq * 2 * T * (d.dk + d.dv)
        quadratic = FormCost(no_state, 4 * ACC_BYTES * T + ACC_BYTES * (d.dk + 2 * d.dv))
        note = (
            "delta rule: UT transform; the triangular solve is C^3/3 per chunk; "
            "quadratic = one chunk of T"
        )
        return ClassCost(chunked, quadratic, note)


DELTA = Delta()
