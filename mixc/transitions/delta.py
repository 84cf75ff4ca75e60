"""The delta rule: `G_t(S) = a_t S (I - beta_t k_t k_t^T)`, with or without the scalar decay a_t
(DeltaNet, Gated DeltaNet), however the decay and beta are written.

Chunked form: the kernel `delta`, the UT transform: per chunk T = (I + tril(diag(beta) K K^T,
-1))^{-1} diag(beta), W = T K, U = T V, with the triangular inverse in at least fp32.
"""

from __future__ import annotations

from fractions import Fraction

from mixc.algebra.expand import Term, transpose_atom
from mixc.algebra.intervals import bounds, with_defaults
from mixc.analysis.cost import ACC_BYTES, ClassCost, FormCost, Formula, GroupDims
from mixc.analysis.facts import Transition
from mixc.frontend.ir import Call, Expr
from mixc.frontend.shapes import SCALAR
from mixc.transitions.base import KernelArg, TransitionClass, scalar_gates


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



class Delta(TransitionClass):
    name = "delta"
    variants = ("identity minus rank-1", "scalar decay times identity minus rank-1")
    rules = ("delta", "gated_delta")
    kernel = "delta"
    algorithm = "chunked delta rule (UT transform, fp32 triangular solve)"

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
            decay = scalar_gates(t0, ctx)
            if decay:
                return Transition(
                    "scalar decay times identity minus rank-1",
                    "gated_delta: a_t S_{t-1} (I - beta_t k_t k_t^T)",
                    tuple(decay),
                    beta=beta,
                    key=k,
                )
            return Transition(
                "identity minus rank-1", "delta: S_{t-1} (I - beta_t k_t k_t^T)", beta=beta, key=k
            )
        return None

    def kernel_args(self, tr):
        return (KernelArg("beta", tr.beta, "scalar"), KernelArg("g", tr.log("scalar"), "scalar"))

    def chunk_reason(self, state):
        tr, write = state.transition, state.writes[0]
        if str(tr.key) != str(write.key):
            return (
                f"NYI: the delta rule of {state.name} erases along {tr.key} but writes along "
                f"{write.key}; the chunked form needs the same key in both"
            )
        return None

    def decays(self, tr):
        return bool(tr.gates)

    def stability(self, tr, state, params):
        """Stable when |k| = 1 and beta is in [0, 2] (eigenvalues 1 and 1 - beta)."""
        unit = isinstance(tr.key, Call) and tr.key.func == "l2norm"
        lo, hi = bounds(with_defaults(tr.beta, params))
        beta_ok = lo >= 0 and hi <= 2
        parts = [
            f"|{tr.key}| = 1 (l2norm)"
            if unit
            else f"|{tr.key}| = 1 not proven (write l2norm({tr.key}))",
            f"{tr.beta} in [{lo:g}, {hi:g}]" if beta_ok else f"{tr.beta} in [0, 2] not proven",
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
        no_state = (
            4 * T * d.dk + 2 * T * d.dv + T * T / 3 + mask * T + nq * 2 * T * (d.dk + d.dv)
        )
        quadratic = FormCost(no_state, 4 * ACC_BYTES * T + ACC_BYTES * (d.dk + 2 * d.dv))
        note = (
            "delta rule: UT transform; the triangular solve is C^3/3 per chunk; "
            "quadratic = one chunk of T"
        )
        return ClassCost(chunked, quadratic, note)


DELTA = Delta()
