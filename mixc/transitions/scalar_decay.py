"""Scalar decay: `G_t(S) = a_t S` with a_t a per-token scalar, a per-head constant (RetNet's
gamma) or nothing at all (the identity of linear attention).

Chunked form: the kernel `scalar_decay`, with decay masks exp(b_i - b_j) built as running
products of per-token decays inside each chunk; the same masks give a quadratic `parallel` form.
"""

from __future__ import annotations

from collections.abc import Callable

from mixc.algebra.formula import Formula
from mixc.frontend.ir import Timed, walk
from mixc.transitions.base import (
    CHUNK_MEASURED_ON,
    ChunkSize,
    KernelArg,
    Maths,
    Rule,
    Transition,
    TransitionClass,
    plain,
    scalar_gates,
)
from mixc.transitions.cost import ACC_BYTES, ClassCost, FormCost, GroupDims
from mixc.transitions.writing import Core, RandomForm, Update, Writer, decayed_update

# ----------------------------------------------------------------------------- random specs


def _gate_constant(w: Writer) -> tuple[str, bool]:
    """a per-head parameter with a default in (0, 1)."""
    g = w.fresh(("gamma", "lam", "decay"))
    default = w.pick(
        "1 - 2^(-5 - h)", "1 - 2^(-3 - h)", "0.9", "exp(-0.1 (h + 1))", "sigmoid(3 - h)"
    )
    w.params.append(f"{g} = {default}")
    return g, True


def _gate_number(w: Writer) -> tuple[str, bool]:
    """a number in (0, 1)."""
    return w.pick("0.9", "0.5", "0.99"), True


def _gate_param(w: Writer) -> tuple[str, bool]:
    """exp(-exp(lam)) or exp(-softplus(lam)) of a parameter."""
    g = w.fresh(("lam", "w0", "A_log"))
    w.params.append(g)
    return w.pick(f"exp(-exp({g}))", f"exp({w.minus}softplus({g}))"), True


def _gate_param_sigmoid(w: Writer) -> tuple[str, bool]:
    """sigmoid(lam) of a parameter."""
    g = w.fresh(("lam", "w0", "A_log"))
    w.params.append(g)
    return f"sigmoid({g})", True


def _gate_param_raw(w: Writer) -> tuple[str, bool]:
    """a parameter used as the decay itself."""
    g = w.fresh(("gamma", "rho"))
    w.params.append(g)
    return g, True


def _gate_sigmoid(w: Writer) -> tuple[str, bool]:
    """sigmoid(a_t) or 1 - sigmoid(a_t)."""
    a = w.fresh(("a", "f", "alpha"))
    w.inputs.append(a)
    return w.pick((f"sigmoid({a}_t)", True), (f"1 - sigmoid({a}_t)", False))


def _gate_softplus(w: Writer) -> tuple[str, bool]:
    """exp(-softplus(g_t))."""
    g = w.fresh(("g", "gt", "z0"))
    w.inputs.append(g)
    return f"exp({w.minus}softplus({g}_t))", True


def _gate_mamba(w: Writer) -> tuple[str, bool]:
    """Mamba-2's exp(-softplus(dt_t) exp(A_log))."""
    dt = w.fresh(("dt", "delta", "s"))
    w.inputs.append(dt)
    w.dt_scale = f"softplus({dt}_t)"
    A = w.fresh(("A_log", "alog"))
    w.params.append(A)
    return f"exp(-softplus({dt}_t) exp({A}))", True


def _gate_mamba_raw(w: Writer) -> tuple[str, bool]:
    """exp(dt_t A) with dt > 0 and A < 0 as inputs."""
    dt = w.fresh(("dt", "delta", "s"))
    w.inputs.append(dt)
    w.dt_scale = f"{dt}_t"
    A = w.fresh(("A", "Aneg"))
    w.params.append(A)
    return f"exp({dt}_t {A})", True


def _gate_log_input(w: Writer) -> tuple[str, bool]:
    """exp(g_t) of a log-gate input."""
    g = w.fresh(("g", "lg"))
    w.inputs.append(g)
    return f"exp({g}_t)", True


#: Each scalar-decay form of random specs (constants, numbers, parameters, per-token inputs)
#: and how it is written: (text, atomic), a decay in (0, 1] for the derived input ranges.
SCALAR_GATES: dict[str, Callable[[Writer], tuple[str, bool]]] = {
    "constant": _gate_constant,
    "number": _gate_number,
    "param": _gate_param,
    "param sigmoid": _gate_param_sigmoid,
    "param raw": _gate_param_raw,
    "sigmoid": _gate_sigmoid,
    "softplus": _gate_softplus,
    "mamba": _gate_mamba,
    "mamba raw": _gate_mamba_raw,
    "log input": _gate_log_input,
}


def scalar_gate(w: Writer, kind: str) -> tuple[str, bool]:
    """(text, atomic) of a scalar decay of the given form, maybe named as a value."""
    return w.as_value(*SCALAR_GATES[kind](w))


def _no_decay(w: Writer, c: Core, forms: tuple[str, ...]) -> Update:
    """The identity: the state (and a normaliser) carries over unchanged."""
    return decayed_update(w, c, c.prev, z=lambda w, zprev: zprev)


def _scalar_form(kind: str) -> RandomForm:
    """A scalar decay g of the given form: g S, S g or g ⊙ S (and g z for a normaliser)."""

    def write(w: Writer, c: Core, forms: tuple[str, ...]) -> Update:
        text, atomic = scalar_gate(w, kind)
        g = text if atomic else f"({text})"
        decayed = w.pick(f"{g} {c.prev}", f"{c.prev} {g}", f"{g} {w.had} {c.prev}")
        return decayed_update(
            w, c, decayed, z=lambda w, zprev: w.pick(f"{g} {zprev}", f"{g} {w.had} {zprev}")
        )

    return write


IDENTITY = Rule("identity", "identity", "S_{t-1} alone")
CONSTANT = Rule("scalar_constant", "scalar constant", "a per-head constant times S_{t-1}")
DATA = Rule("scalar_data", "scalar data-dependent", "a per-token scalar times S_{t-1}")


class ScalarDecay(TransitionClass):
    name = "scalar_decay"
    rules = (IDENTITY, CONSTANT, DATA)
    kernel = "scalar_decay"
    sub_tokens = True  # a zero log-gate is a step that changes nothing
    joined_kernel = "scalar_decay_rank"  # a token's writes share its decay: rank C write rows
    queries_kernel = "scalar_decay_rank"  # m query rows a token, as its rank write rows
    folds_lag = True  # the previous token's write under this token's decay: mixc.analysis.folds
    parallel = True
    stable_kernel = "scalar_decay_stable"
    algorithm = "chunked scalar decay (log-space decay masks), or the quadratic masked form"
    stable_algorithm = (
        "chunked scalar decay with the write scale carried in log space (each output row scaled "
        "by its largest exponent); no quadratic form"
    )

    def match(self, terms, ctx):
        p = plain(terms)
        if not p or p[1] or p[2] or p[0].gates:
            return None
        t = p[0]
        if not t.scalars and t.coeff == 1:
            return Transition(IDENTITY, self)
        gates = tuple(scalar_gates(t, ctx))
        per_token = any(isinstance(n, Timed) for s in t.scalars for n in walk(s))
        return Transition(DATA if per_token else CONSTANT, self, gates)

    def kernel_args(self, tr):
        return (KernelArg("g", tr.log("scalar"), "scalar"),)

    def maths(self, tr: Transition) -> Maths:
        """The causal mask for the identity; a decay mask L from the cumulative log-gate
        otherwise (a constant's as powers of the decay)."""
        if not tr.gates:
            return Maths(
                (),
                ("Y = (Q K^T ⊙ M) V + Q S_0,  M the causal mask (i >= j)", "S_C = S_0 + K^T V"),
                "Y = (Q K^T ⊙ M) V",
            )
        y = (
            "Y = (Q K^T ⊙ L) V + diag(exp(b)) Q S_0,  "
            "L_ij = exp(b_i - b_j) (i >= j, else 0),  b = cumsum(g)"
        )
        const = [x for x in tr.gates if x.side == "scalar"]
        if tr.rule == CONSTANT and len(const) == 1:
            y += f"  (so L_ij = ({const[0].decay})^(i - j))"
        return Maths(
            (f"g = {tr.log('scalar')}",),
            (y, "S_C = exp(b_C) S_0 + (diag(exp(b_C - b)) K)^T V"),
            "Y = (Q K^T ⊙ L) V,  L_ij = exp(B_i - B_j) (i >= j),  B = cumsum(g) over the sequence",
        )

    def chunk_size(self, tr):
        if not tr.gates:  # linear attention: 4.6 against 4.9 ms; the normalised one 6.7 and 7.1
            return ChunkSize(64, f"64 ran 1.06x faster than 32 with no decay, {CHUNK_MEASURED_ON}")
        return ChunkSize(32, f"32 ran 1.06-1.14x faster than 64 with a decay, {CHUNK_MEASURED_ON}")

    def random_forms(self) -> dict[str, RandomForm]:
        return {"none": _no_decay, **{kind: _scalar_form(kind) for kind in SCALAR_GATES}}

    def decays(self, tr):
        return bool(tr.gates)

    def step_decays(self, tr):
        return bool(tr.gates)

    def cost(self, tr: Transition, d: GroupDims) -> ClassCost:
        gated = bool(tr.gates)
        mask = 2 if gated else 1
        C, T, nq, r = d.C, d.T, d.nq, d.r
        intra = nq * (2 * r * C * (d.dk + d.dv) + mask * r * C)
        chunked = FormCost(
            intra + 2 * nq * d.kv + 2 * r * d.kv + (d.kv / C if gated else Formula()),
            d.state_bytes / C + ACC_BYTES * mask * nq * C,
        )
        quadratic = FormCost(
            nq * (2 * r * T * (d.dk + d.dv) + mask * r * T), ACC_BYTES * mask * nq * T
        )
        note = "scalar decay: masks exp(b_i - b_j) as running products of per-token decays"
        return ClassCost(chunked, quadratic, note)


SCALAR_DECAY = ScalarDecay()
