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
from dataclasses import dataclass, field

from mixc.algebra.canon import signed
from mixc.algebra.expand import Term, transpose_atom
from mixc.algebra.formula import Formula
from mixc.algebra.intervals import bounds
from mixc.frontend.ir import Binary, Call, Expr, Number
from mixc.transitions.base import (
    ChunkSize,
    Condition,
    Erase,
    KernelArg,
    Maths,
    Rule,
    RuleContext,
    StateTerms,
    Transition,
    TransitionArgs,
    TransitionClass,
    UnitKey,
    sum_of,
)
from mixc.transitions.cost import ACC_BYTES, ClassCost, FormCost, GroupDims
from mixc.transitions.delta import unnormalised_key
from mixc.transitions.diagonal import gates_of
from mixc.transitions.gates import LogGate
from mixc.transitions.writing import Core, RandomForm, Update, Writer

#: The rule, one for every variant, which it tells apart by how the rank-1 term relates to the
#: diagonal (see `_variant` and Dplr.conditions).
_RULE = "diagonal_plus_low_rank"
GATED_ERASE = Rule(
    _RULE, "diagonal times identity minus rank-1", "S_{t-1} D_t (I - beta_t k_t k_t^T)"
)
ERASE = Rule(_RULE, "diagonal minus rank-1", "S_{t-1} (D_t - beta_t k_t k_t^T)")
GENERAL = Rule(_RULE, "diagonal plus low rank", "S_{t-1} (D_t + a_t b_t^T)")


@dataclass(frozen=True)
class DplrArgs(TransitionArgs):
    """The rank-1 term a b^T of S (D + a b^T): b, the key it writes along, and a, the direction
    along which it reads the state; for an erase along b (a = -beta D b or a = -beta b) its
    strength beta, else None."""

    beta: Expr | None = field(metadata={"role": "erase"})
    key: Expr = field(metadata={"role": "key"})
    read: Expr = field(metadata={"role": "rank-1 read"})

    def erase(self) -> Erase | None:
        return None if self.beta is None else Erase(self.beta, self.key)


@dataclass(frozen=True)
class _RankOne:
    """A term `scale S_{t-1} diag(x)... core r^T diag(y)...`: its scale, the diag arguments x on
    a's side, a's core and b = y ⊙ ... ⊙ r."""

    scale: Term
    diags: list[Expr]
    core: Expr
    b: Expr


def _is_diag(e: Expr) -> bool:
    return isinstance(e, Call) and e.func == "diag"


def _column(e: Expr, ctx: RuleContext) -> Expr:
    return transpose_atom(e, ctx.expander.shape(e)) if ctx.expander.shape(e)[0] == "1" else e


def _rank_one(t: Term, at: int, ctx: RuleContext) -> _RankOne | None:
    """A term `scale S_{t-1} diag(x)... c r^T diag(y)...` as a _RankOne, or None for another
    shape."""
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
    return _RankOne(
        Term(coeff=t.coeff, scalars=t.scalars), [f.args[0] for f in before], right[i], b
    )


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


def _diagonal_gates(diagonal: StateTerms, ctx: RuleContext) -> tuple[LogGate, ...] | None:
    """The log-gates of the term `S_{t-1} D` (scalar decays and key-side diag(..) factors), or
    None when D is no such diagonal (a full gate, a value-side gate, another shape)."""
    found = gates_of(diagonal, ctx)
    if found is None or found[1] is not None:
        return None
    gates = tuple(found[0])
    return None if any(g.side == "value" for g in gates) else gates


def _variant(
    low: list[_RankOne], gates: tuple[LogGate, ...], ctx: RuleContext
) -> tuple[Rule, Expr | None]:
    """The rule of the rank-1 terms (all along one b), classed by the algebra, and the erase
    strength beta when they are an erase: a = -beta D b (`S D (I - beta b b^T)`), a = -beta b
    (`S (D - beta b b^T)`), or any other a (beta None)."""
    key, b = ctx.canon.key, low[0].b
    diag_sets = {tuple(sorted(key(_column(x, ctx)) for x in r.diags)) for r in low}
    if {key(r.core) for r in low} != {key(b)} or len(diag_sets) != 1:
        return GENERAL, None
    beta = ctx.canon.terms([Term(coeff=-r.scale.coeff, scalars=r.scale.scalars) for r in low])
    own = tuple(
        sorted(
            key(_column(g.decay.args[0] if _is_diag(g.decay) else g.decay, ctx))
            for g in gates
            if g.side == "key"
        )
    )
    if diag_sets == {own} and not any(g.side == "scalar" for g in gates):
        return GATED_ERASE, beta
    if diag_sets in ({()}, {own}):
        return ERASE, beta
    return GENERAL, None


class Dplr(TransitionClass):
    name = "dplr"
    rules = (GATED_ERASE, ERASE, GENERAL)
    kernel = "dplr"
    sub_tokens = True  # zero log-gates and a zero rank-1 term are a step that changes nothing
    algorithm = (
        "chunked diagonal plus low rank (generalised UT transform, fp32 triangular solve, "
        "per-channel decays from block boundaries)"
    )

    def match(self, terms: StateTerms, ctx: RuleContext):
        """One term `S_{t-1} D` (D: diag(..) factors and scalar decays, or nothing) and one or
        more rank-1 terms `scale S_{t-1} diag(..) a b^T diag(..)` sharing b: the transition
        S (D + a b^T) however it is written, its variant by how a relates to b (`_variant`)."""
        if ctx.shape[1] == "1" or len(terms) < 2:
            return None
        low, diagonal = [], []
        for t, at in terms:
            found = _rank_one(t, at, ctx)
            if found:
                low.append(found)
            else:
                diagonal.append((t, at))
        if len(diagonal) != 1 or not low:
            return None
        gates = _diagonal_gates(diagonal, ctx)
        key, b = ctx.canon.key, low[0].b
        if gates is None or any(key(r.b) != key(b) for r in low):
            return None  # no such diagonal, or a rank of 2 or more
        a = None
        for r in low:
            a = sum_of(a, _vector(r.scale, r.diags, r.core, ctx))
        rule, beta = _variant(low, gates, ctx)
        return Transition(rule, self, gates, DplrArgs(beta, b, a))

    def kernel_args(self, tr):
        """a, b and the log-gate, and the gate's lower bound where the interval arithmetic
        proves one (RWKV-7's -exp(-0.5) sigmoid(d) >= -0.61): with it the kernel builds a
        chunk's scores as one matmul when the chunk cannot decay below 2^-30."""
        gate = sum_of(tr.log("key"), tr.log("scalar"))
        least = _least_gate(gate)
        return (
            KernelArg("a", tr.args.read, "vector"),
            KernelArg("b", tr.args.key, "vector"),
            KernelArg("gk", gate, "vector"),
            KernelArg("gk_min", Number(repr(least)) if math.isfinite(least) else None, "bound"),
        )

    def maths(self, tr: Transition) -> Maths:
        """The generalised UT transform of a chunk (S = H^T: S_t = (D_t + b_t a_t^T) S_{t-1})."""
        gate = sum_of(tr.log("key"), tr.log("scalar"))
        legend = [f"a rows = {tr.args.read}", f"b rows = {tr.args.key}"]
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
        beta = tr.args.beta
        if beta is not None:
            hi = 2.0 if tr.rule == GATED_ERASE else 1.0
            out.append(Condition(beta, 0.0, hi, f"erase strength {beta} of {state} in [0, {hi:g}]"))
        return out

    def unit_key(self, state, tr):
        """The erase key (drawn with norm <= 1 unless it is an l2norm); for another rank-1 term,
        the inputs of a and b."""
        beta, key, read = tr.args.beta, tr.args.key, tr.args.read
        if beta is None:
            why = (
                f"rank-1 term a b^T of {state} (a = {read}, b = {key}): norms <= 1 keep it bounded"
            )
            return UnitKey(Binary("*", read, key), why, (read, key))
        plain = unnormalised_key(key)
        why = f"erase key {key} of {state}: norm <= 1 keeps it stable"
        return None if plain is None else UnitKey(plain, why)

    def stability(self, tr, params):
        beta, key = tr.args.beta, tr.args.key
        if beta is None:
            return (
                f"not proven: D_t + a_t b_t^T with a = {tr.args.read}, b = {key} has no proven "
                "norm bound (RWKV-7 keeps it near contractive with a = -kk, b = kk ⊙ alpha, "
                "|kk| = 1, alpha in (0, 1): then I + a b^T has eigenvalues 1 and "
                "1 - Σ alpha kk^2 in [0, 1])"
            )
        unit = isinstance(key, Call) and key.func == "l2norm"
        hi = 2.0 if tr.rule == GATED_ERASE else 1.0
        lo_b, hi_b = bounds(beta, defaults=params)
        beta_ok = lo_b >= 0 and hi_b <= hi
        parts = [
            f"|{key}| = 1 (l2norm)" if unit else f"|{key}| = 1 not proven (write l2norm({key}))",
            f"{beta} in [{lo_b:g}, {hi_b:g}]" if beta_ok else f"{beta} in [0, {hi:g}] not proven",
        ]
        why = (
            "|D| <= 1 and I - beta k k^T has eigenvalues 1 and 1 - beta |k|^2"
            if tr.rule == GATED_ERASE
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
