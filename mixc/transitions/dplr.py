"""Diagonal plus low rank: `G_t(S) = S (D_t + a_t b_t^T)`, D_t = diag(exp(g_t)) per key channel
(optionally times a scalar decay, or none), and one rank-1 term however it is written: KDA's
`S diag(exp(g)) (I - beta k k^T)`, RWKV-7's `S (diag(w) + a b^T)`, a decay and an erase written
as a sum (`(1 - a) S - theta S k k^T`), the delta rule erasing along one key and writing along
another, with a beta up to 2. The scalar-decay, diagonal and delta classes are the faster
special cases and come first in the rule order.

Chunked form: the kernel `dplr`, the generalised UT transform: per chunk the state's reads
u_r = a_r^T S_{r-1} solve one unit lower-triangular system (in at least fp32), and its four
score matrices carry a decay per channel, built over aligned blocks whose factors are measured
from a boundary (as the diagonal gate's).
"""

from __future__ import annotations

import math

from mixc.algebra.canon import signed
from mixc.algebra.expand import Term, transpose_atom
from mixc.algebra.formula import Formula
from mixc.algebra.intervals import bounds
from mixc.frontend.ir import Binary, Call, Expr, Number, Transpose
from mixc.transitions.base import (
    ChunkSize,
    Condition,
    KernelArg,
    Maths,
    RuleContext,
    StateTerms,
    Transition,
    TransitionClass,
    sum_of,
)
from mixc.transitions.cost import ACC_BYTES, ClassCost, FormCost, GroupDims
from mixc.transitions.diagonal import gates_of
from mixc.transitions.writing import Core, RandomForm, Update, Writer

#: The variants, by how the rank-1 term relates to the diagonal (see Dplr.conditions).
GATED_ERASE = "diagonal times identity minus rank-1"  # S D (I - beta k k^T)
ERASE = "diagonal minus rank-1"  # S (D - beta k k^T)
GENERAL = "diagonal plus low rank"  # S (D + a b^T)


def _is_diag(e: Expr) -> bool:
    return isinstance(e, Call) and e.func == "diag"


def _column(e: Expr, ctx: RuleContext) -> Expr:
    return transpose_atom(e, ctx.expander.shape(e)) if ctx.expander.shape(e)[0] == "1" else e


def _rank_one(t: Term, at: int, ctx: RuleContext):
    """A term `scale S_{t-1} diag(x)... c r^T diag(y)...` as (scale term, the diag arguments on
    a's side, a's core c, b = y ⊙ ... ⊙ r), or None for another shape."""
    right = t.chain[at + 1 :]
    ex = ctx.expander
    cols = [i for i, f in enumerate(right) if ex.shape(f)[1] == "1" and ex.shape(f)[0] != "1"]
    if t.chain[:at] or t.gates or len(cols) != 1 or cols[0] + 1 >= len(right):
        return None
    i = cols[0]
    row, before, after = right[i + 1], right[:i], right[i + 2 :]
    if ex.shape(row)[0] != "1" or not all(_is_diag(f) for f in before + after):
        return None
    b = _column(row, ctx)
    for f in after:
        b = Binary("*", _column(f.args[0], ctx), b)
    return Term(coeff=t.coeff, scalars=t.scalars), [f.args[0] for f in before], right[i], b


def _vector(scale: Term, diags: list[Expr], core: Expr, ctx: RuleContext) -> Expr:
    """scale (x_1 ⊙ ... ⊙ core) as one expression."""
    out = core
    for x in reversed(diags):
        out = Binary("*", _column(x, ctx), out)
    if scale.coeff == 1 and not scale.scalars:
        return out
    factors = [*([] if scale.coeff == 1 else [signed(scale.coeff)]), *scale.scalars, out]
    product = factors[0]
    for f in factors[1:]:
        product = Binary("*", product, f)
    return product


# ----------------------------------------------------------------------------- random specs


def _unit_key(w: Writer, c: Core) -> str:
    return w.pick(f"l2norm({c.k}_t)", f"{c.k}_t")


def _channel_decay(w: Writer, c: Core) -> str:
    g = w.fresh(("g", "w", "f"))
    w.inputs.append(f"{g}[{c.K}]")
    return w.pick(
        f"diag(exp({g}_t))", f"diag(sigmoid({g}_t))", f"diag(exp(-0.6065 sigmoid({g}_t)))"
    )


def _beta(w: Writer) -> str:
    b = w.fresh(("beta", "b", "eta"))
    w.inputs.append(b)
    return w.pick(f"sigmoid({b}_t)", f"2 sigmoid({b}_t)")


def _write(w: Writer, c: Core, scale: str, key: str) -> str:
    return f"{scale}{c.v}_t {key}{w.T}"


def _kda(w: Writer, c: Core, forms: tuple[str, ...]) -> Update:
    """S diag(exp(g)) (I - beta k k^T) + beta v k^T, factored or distributed."""
    d, kx, beta = _channel_decay(w, c), _unit_key(w, c), _beta(w)
    T, minus = w.T, w.minus
    return Update(
        w.pick(
            f"{c.prev} {d} (I {minus} {beta} {kx} {kx}{T}) + " + _write(w, c, f"{beta} ", kx),
            f"{c.prev} {d} {minus} {beta} {c.prev} {d} {kx} {kx}{T} + "
            + _write(w, c, f"{beta} ", kx),
        )
    )


def _rwkv7(w: Writer, c: Core, forms: tuple[str, ...]) -> Update:
    """S (diag(w) - kk (alpha ⊙ kk)^T) + v k^T with kk = l2norm(kappa), alpha in (0, 1)."""
    d = _channel_decay(w, c)
    kappa, alpha = w.fresh(("kappa", "r", "m")), w.fresh(("alpha", "p", "e"))
    w.inputs += [f"{kappa}[{c.K}]", f"{alpha}[{c.K}]"]
    kk, T = f"l2norm({kappa}_t)", w.T
    return Update(
        f"{c.prev} ({d} {w.minus} {kk} (sigmoid({alpha}_t) {w.had} {kk}){T}) + "
        + _write(w, c, "", c.kx)
    )


def _decayed_erase(w: Writer, c: Core, forms: tuple[str, ...]) -> Update:
    """(1 - a) S - theta (S k - v) k^T: a scalar decay and an erase written as a sum."""
    a, theta = w.fresh(("a", "lam", "wd")), w.fresh(("theta", "lr", "eta"))
    w.inputs += [a, theta]
    kx = _unit_key(w, c)
    return Update(
        f"(1 {w.minus} sigmoid({a}_t)) {c.prev} {w.minus} sigmoid({theta}_t) "
        f"({c.prev} {kx} {w.minus} {c.v}_t) {kx}{w.T}"
    )


def _two_keys(w: Writer, c: Core, forms: tuple[str, ...]) -> Update:
    """S (I - beta k k^T) + beta v u^T: erasing along one key, writing along another."""
    u = w.fresh(("u", "kw", "wk"))
    w.inputs.append(f"{u}[{c.K}]")
    kx, beta, T = _unit_key(w, c), _beta(w), w.T
    return Update(f"{c.prev} (I {w.minus} {beta} {kx} {kx}{T}) + {beta} {c.v}_t {u}_t{T}")


#: log 2^-30: the least total decay of a chunk, per channel, for which the kernel splits
#: exp(c_r - c_j) into exp(c_r) exp(-c_j) (both factors then within [2^-30, 2^30])
_LEAST_CHUNK_LOG_DECAY = -30 * math.log(2)


def _least_gate(gate: Expr | None) -> float:
    """The least value the interval arithmetic proves for the log-gate (0 without one)."""
    return 0.0 if gate is None else bounds(gate)[0]


def _split_note(gate: Expr | None) -> str:
    """How the chunk form measures the decays of its scores, for `explain`."""
    blocks = "aligned blocks, factors measured from their boundary"
    least = _least_gate(gate)
    if least == 0.0:
        return "no decay: the scores are one matmul a chunk"
    if not _LEAST_CHUNK_LOG_DECAY <= least:  # unbounded, or too strong at a chunk of 1
        return f"exp(c_r - c_j) is never split into exp(c_r) exp(-c_j): {blocks}"
    largest = 1 << int(math.log2(_LEAST_CHUNK_LOG_DECAY / least))
    return (
        f"g >= {least:.4g} (proven): at chunk sizes up to {largest}, exp(c_r - c_j) = "
        f"exp(c_r) exp(-c_j) with both factors in [2^-30, 2^30], one matmul a chunk; at larger "
        f"ones {blocks}"
    )


class Dplr(TransitionClass):
    name = "dplr"
    variants = (GATED_ERASE, ERASE, GENERAL)
    rules = ("diagonal_plus_low_rank",)
    kernel = "dplr"
    algorithm = (
        "chunked diagonal plus low rank (generalised UT transform, fp32 triangular solve, "
        "per-channel decays from block boundaries)"
    )

    def match(self, terms: StateTerms, ctx: RuleContext):
        """One term `S_{t-1} D` (D: diag(..) factors and scalar decays, or nothing) and one or
        more rank-1 terms `scale S_{t-1} diag(..) a b^T diag(..)` sharing b: the transition
        S (D + a b^T) however it is written. The rank-1 term is classed by the algebra: a =
        -beta D b (`S D (I - beta b b^T)`), a = -beta b, or any other a."""
        if ctx.shape[1] == "1" or len(terms) < 2:
            return None
        low, diagonal = [], []
        for t, at in terms:
            found = _rank_one(t, at, ctx)
            (low if found else diagonal).append(found or (t, at))
        if len(diagonal) != 1 or not low:
            return None
        gates_found = gates_of(diagonal, ctx)
        if gates_found is None or gates_found[1] is not None:
            return None
        gates = tuple(gates_found[0])
        if any(g.side == "value" for g in gates):
            return None
        key = ctx.canon.key
        b = low[0][3]
        if any(key(x[3]) != key(b) for x in low):
            return None  # rank 2 or more
        a = None
        for scale, diags, core, _ in low:
            a = sum_of(a, _vector(scale, diags, core, ctx))
        cores = {key(core) for _, _, core, _ in low}
        diag_sets = {tuple(sorted(key(_column(x, ctx)) for x in diags)) for _, diags, _, _ in low}
        if cores != {key(b)} or len(diag_sets) != 1:
            return Transition(
                GENERAL, "diagonal_plus_low_rank: S_{t-1} (D_t + a_t b_t^T)", gates, key=b, read=a
            )
        beta = ctx.canon.terms(
            [Term(coeff=-scale.coeff, scalars=scale.scalars) for scale, _, _, _ in low]
        )
        own = tuple(
            sorted(
                key(_column(g.decay.args[0] if _is_diag(g.decay) else g.decay, ctx))
                for g in gates
                if g.side == "key"
            )
        )
        if diag_sets == {own} and not any(g.side == "scalar" for g in gates):
            return Transition(
                GATED_ERASE,
                "diagonal_plus_low_rank: S_{t-1} D_t (I - beta_t k_t k_t^T)",
                gates,
                beta=beta,
                key=b,
                read=a,
            )
        if diag_sets in ({()}, {own}):
            return Transition(
                ERASE,
                "diagonal_plus_low_rank: S_{t-1} (D_t - beta_t k_t k_t^T)",
                gates,
                beta=beta,
                key=b,
                read=a,
            )
        return Transition(
            GENERAL, "diagonal_plus_low_rank: S_{t-1} (D_t + a_t b_t^T)", gates, key=b, read=a
        )

    def kernel_args(self, tr):
        """a, b and the log-gate, and the gate's lower bound where the interval arithmetic
        proves one (RWKV-7's -exp(-0.5) sigmoid(d) >= -0.61): with it the kernel builds a
        chunk's scores as one matmul when the chunk cannot decay below 2^-30."""
        gate = sum_of(tr.log("key"), tr.log("scalar"))
        least = _least_gate(gate)
        return (
            KernelArg("a", tr.read, "vector"),
            KernelArg("b", tr.key, "vector"),
            KernelArg("gk", gate, "vector"),
            KernelArg("gk_min", Number(repr(least)) if math.isfinite(least) else None, "bound"),
        )

    def maths(self, tr: Transition) -> Maths:
        """The generalised UT transform of a chunk (S = H^T: S_t = (D_t + b_t a_t^T) S_{t-1})."""
        gate = sum_of(tr.log("key"), tr.log("scalar"))
        legend = [f"a rows = {tr.read}", f"b rows = {tr.key}"]
        legend.append(f"g = {gate} (one log-gate per key channel)" if gate else "g = 0 (no decay)")
        return Maths(
            tuple(legend),
            (
                "c = cumsum(g) per channel; [X Y]_rj = Σ_c x_rc exp(c_rc - c_jc) y_jc (j <= r), "
                "[X Y]'_rj = Σ_c x_rc exp(c_{r-1,c} - c_jc) y_jc (j < r)",
                "T = (I - [A B]')^{-1},  W = T (A ⊙ exp(c_{r-1})),  U' = T [A K]' V",
                "Y = (Q ⊙ exp(c) + [Q B] W) S_0 + [Q K] V + [Q B] U'",
                "S_C = (diag(exp(c_C)) + (B ⊙ exp(c_C - c))^T W) S_0 + (K ⊙ exp(c_C - c))^T V "
                "+ (B ⊙ exp(c_C - c))^T U'",
                _split_note(gate),
            ),
        )

    def conditions(self, state, tr):
        """Decays in (0, 1], and for an erase along the key b a beta that keeps D + a b^T
        contractive with |b| = 1: [0, 2] for D (I - beta b b^T), [0, 1] for D - beta b b^T."""
        out = self.decay_conditions(state, tr)
        if tr.beta is not None:
            hi = 2.0 if tr.label == GATED_ERASE else 1.0
            out.append(
                Condition(tr.beta, 0.0, hi, f"erase strength {tr.beta} of {state} in [0, {hi:g}]")
            )
        return out

    def unit_key(self, tr):
        """The erase key (drawn with norm <= 1 unless it is an l2norm); for another rank-1 term,
        the inputs of a and b."""
        if tr.beta is not None:
            key = tr.key.operand if isinstance(tr.key, Transpose) else tr.key
            return None if isinstance(key, Call) and key.func == "l2norm" else key
        return Binary("*", tr.read, tr.key)

    def roles(self, tr):
        """The base roles (decays, erase scale, the key b the rank-1 term writes along), and a,
        the direction along which it reads the state."""
        return [*super().roles(tr), ("rank-1 read", tr.read)]

    def stability(self, tr, params):
        if tr.beta is None:
            return (
                f"not proven: D_t + a_t b_t^T with a = {tr.read}, b = {tr.key} has no proven "
                "norm bound (RWKV-7 keeps it near contractive with a = -kk, b = kk ⊙ alpha, "
                "|kk| = 1, alpha in (0, 1): then I + a b^T has eigenvalues 1 and "
                "1 - Σ alpha kk^2 in [0, 1])"
            )
        unit = isinstance(tr.key, Call) and tr.key.func == "l2norm"
        hi = 2.0 if tr.label == GATED_ERASE else 1.0
        lo_b, hi_b = bounds(tr.beta, defaults=params)
        beta_ok = lo_b >= 0 and hi_b <= hi
        parts = [
            f"|{tr.key}| = 1 (l2norm)"
            if unit
            else f"|{tr.key}| = 1 not proven (write l2norm({tr.key}))",
            f"{tr.beta} in [{lo_b:g}, {hi_b:g}]"
            if beta_ok
            else f"{tr.beta} in [0, {hi:g}] not proven",
        ]
        why = (
            "|D| <= 1 and I - beta k k^T has eigenvalues 1 and 1 - beta |k|^2"
            if tr.label == GATED_ERASE
            else "D - beta k k^T is symmetric with eigenvalues in [-beta, 1], and "
            "D (a I - beta k k^T) for a scalar decay a has norm at most 1"
        )
        verdict = "contractive" if unit and beta_ok else "contractive only if"
        return f"{verdict}: " + ", ".join(parts) + f" ({why})"

    def chunk_size(self, tr):
        return ChunkSize(
            32,
            "32 ran 1.03-1.06x faster than 16 and 64 for the KDA chunk forward and 1.14-1.26x for "
            "forward+backward, timed in alternation on a shared CPU (1 thread, fp32, B=1, NH=4, "
            "d=64, T=4096); benchmarks/dplr.py records the three sizes (its 2-thread run, "
            "oversubscribed, did not order them consistently)",
        )

    def random_forms(self) -> dict[str, RandomForm]:
        return {
            "kda": _kda,
            "rwkv7": _rwkv7,
            "decayed erase": _decayed_erase,
            "two keys": _two_keys,
        }

    def recurrent_flops(self, tr: Transition, d: GroupDims) -> Formula:
        decay = d.kv if tr.gates else 0  # the read a^T S and its rank-1 update: 4 d_k d_v
        return decay + 4 * d.kv + 2 * d.r * d.kv + 2 * d.nq * d.kv

    def cost(self, tr: Transition, d: GroupDims) -> ClassCost:
        C, T, nq, dk, dv = d.C, d.T, d.nq, d.dk, d.dv
        # the four score matrices once per pair (aligned blocks), the solve, W and U'; the
        # chunk's action on the state, P = diag + B~^T W and F = K~^T V + B~^T U'; from chunk
        # to chunk S = P S + F (a d_k x d_k product per chunk) and then U = W S + U'; per query
        # the outputs Q~ S + [qk qb] [V; U]
        scores = 4 * C * dk + C * C / 3 + C * dk + 2 * C * dv
        chunk_map = 6 * d.kv + 2 * dk * dk + 2 * dk * d.kv / C
        queries = nq * (4 * C * dv + 2 * d.kv)
        chunked = FormCost(
            scores + chunk_map + queries,
            d.state_bytes / C + 4 * ACC_BYTES * C + ACC_BYTES * (4 * dk + 2 * dv),
        )
        whole = 4 * T * dk + T * T / 3 + T * dk + 2 * T * dv + nq * (T * dk + 2 * T * dv)
        quadratic = FormCost(whole, 4 * ACC_BYTES * T + ACC_BYTES * (4 * dk + 2 * dv))
        note = (
            "diagonal plus low rank: four decayed C x C score matrices (aligned blocks), a "
            "C^3/3 triangular solve per chunk, the state passed by one d_k x d_k product per "
            "chunk; quadratic = one chunk of T"
        )
        return ClassCost(chunked, quadratic, note)


DPLR = Dplr()
