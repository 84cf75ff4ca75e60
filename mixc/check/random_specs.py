"""Random valid specs across every supported class, to fuzz the compiler itself.

`random_specs(forms)` is a hypothesis strategy of spec texts. Each spec draws one transition
form (`GATE_FORMS`), written by the form's own function below, and around it the parts every
spec has: random names, a feature map, a write scale, maybe a normaliser state and a skip term,
and equivalent spellings of the same maths.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mixc.errors import MixcError

__all__ = ["GATE_FORMS", "random_specs"]

#: Size names the runtime uses for its own layout dims (see the report of issue 5): not drawn.
_LAYOUT_DIMS = frozenset({"B", "T", "NH"})
_KEYWORDS = frozenset({"mixer", "in", "param", "state", "let"})


def _valid_name(name: str) -> bool:
    from mixc.frontend.verify import RESERVED

    return name not in RESERVED and name not in _KEYWORDS and name not in _LAYOUT_DIMS


class _Writer:
    """One random spec as it is drawn: the choices (through hypothesis' `draw`), the names
    taken, the declarations and equations gathered so far, and the spelling of operators."""

    def __init__(self, draw) -> None:
        from hypothesis import strategies as st

        self.draw, self.st = draw, st
        self.taken: set[str] = set()
        self.inputs: list[str] = []
        self.params: list[str] = []
        self.lets: list[str] = []
        self.values: list[str] = []  # per-token value equations
        self.dt_scale: str | None = None  # the write scale a Mamba-style dt gives, once drawn
        self.T = self.pick("^T", "^T", "ᵀ")
        self.had = self.pick("⊙", "*")
        self.minus = self.pick("-", "-", "−")
        self.dot = self.pick(".", "·")

    def pick(self, *options):
        return self.draw(self.st.sampled_from(options))

    def coin(self) -> bool:
        return self.draw(self.st.booleans())

    def fresh(self, pool: tuple[str, ...], upper: bool = False) -> str:
        """A new name: one of `pool` or a made-up one, numbered when taken or reserved."""
        st = self.st
        letters = "ACDEFGJKLMNOPQRSUVWXYZ" if upper else "abcdefgjklmnopqrsuvwxyz"
        made = st.builds(
            str.__add__,
            st.sampled_from(letters),
            st.text("abcdefgjkmnopqrsuvwxyz0123456789", max_size=3),
        )
        base = self.draw(st.one_of(st.sampled_from(pool), made))
        name, i = base, 1
        while name in self.taken or not _valid_name(name):
            name, i = f"{base}{i}", i + 1
        self.taken.add(name)
        return name

    def as_value(self, text: str, atomic: bool) -> tuple[str, bool]:
        """Maybe name a per-token decay as a value equation `d_t = ...`."""
        if "_t" in text and self.coin():
            d = self.fresh(("d", "dec", "alpha_t0"))
            self.values.append(f"{d}_t = {text}")
            return f"{d}_t", True
        return text, atomic


@dataclass(frozen=True)
class _Core:
    """The names every random spec has: sizes K and V, the state S, the key and value inputs,
    and the key as the write uses it (through the feature map, if any)."""

    K: str
    V: str
    S: str
    k: str
    v: str
    kx: str
    phi: str | None

    @property
    def prev(self) -> str:
        return f"{self.S}_{{t-1}}"


# ----------------------------------------------------------------------------- scalar decays


def _gate_constant(w: _Writer) -> tuple[str, bool]:
    """Class-specific: scalar constant: a per-head parameter with a default in (0, 1)."""
    g = w.fresh(("gamma", "lam", "decay"))
    default = w.pick(
        "1 - 2^(-5 - h)", "1 - 2^(-3 - h)", "0.9", "exp(-0.1 (h + 1))", "sigmoid(3 - h)"
    )
    w.params.append(f"{g} = {default}")
    return g, True


def _gate_number(w: _Writer) -> tuple[str, bool]:
    """Class-specific: scalar constant: a number in (0, 1)."""
    return w.pick("0.9", "0.5", "0.99"), True


def _gate_param(w: _Writer) -> tuple[str, bool]:
    """Class-specific: scalar constant: exp(-exp(lam)) or exp(-softplus(lam)) of a parameter."""
    g = w.fresh(("lam", "w0", "A_log"))
    w.params.append(g)
    return w.pick(f"exp(-exp({g}))", f"exp({w.minus}softplus({g}))"), True


def _gate_param_sigmoid(w: _Writer) -> tuple[str, bool]:
    """Class-specific: scalar constant: sigmoid(lam) of a parameter."""
    g = w.fresh(("lam", "w0", "A_log"))
    w.params.append(g)
    return f"sigmoid({g})", True


def _gate_param_raw(w: _Writer) -> tuple[str, bool]:
    """Class-specific: scalar constant: a parameter used as the decay itself."""
    g = w.fresh(("gamma", "rho"))
    w.params.append(g)
    return g, True


def _gate_sigmoid(w: _Writer) -> tuple[str, bool]:
    """Class-specific: scalar data-dependent: sigmoid(a_t) or 1 - sigmoid(a_t)."""
    a = w.fresh(("a", "f", "alpha"))
    w.inputs.append(a)
    return w.pick((f"sigmoid({a}_t)", True), (f"1 - sigmoid({a}_t)", False))


def _gate_softplus(w: _Writer) -> tuple[str, bool]:
    """Class-specific: scalar data-dependent: exp(-softplus(g_t))."""
    g = w.fresh(("g", "gt", "z0"))
    w.inputs.append(g)
    return f"exp({w.minus}softplus({g}_t))", True


def _gate_mamba(w: _Writer) -> tuple[str, bool]:
    """Class-specific: scalar data-dependent: Mamba-2's exp(-softplus(dt_t) exp(A_log))."""
    dt = w.fresh(("dt", "delta", "s"))
    w.inputs.append(dt)
    w.dt_scale = f"softplus({dt}_t)"
    A = w.fresh(("A_log", "alog"))
    w.params.append(A)
    return f"exp(-softplus({dt}_t) exp({A}))", True


def _gate_mamba_raw(w: _Writer) -> tuple[str, bool]:
    """Class-specific: scalar data-dependent: exp(dt_t A) with dt > 0 and A < 0 as inputs."""
    dt = w.fresh(("dt", "delta", "s"))
    w.inputs.append(dt)
    w.dt_scale = f"{dt}_t"
    A = w.fresh(("A", "Aneg"))
    w.params.append(A)
    return f"exp({dt}_t {A})", True


def _gate_log_input(w: _Writer) -> tuple[str, bool]:
    """Class-specific: scalar data-dependent: exp(g_t) of a log-gate input."""
    g = w.fresh(("g", "lg"))
    w.inputs.append(g)
    return f"exp({g}_t)", True


#: Each scalar-decay form (a constant, a number, parameters, per-token inputs) and how it is
#: written: (text, atomic), a decay in (0, 1] for the derived input ranges.
_SCALAR_GATES: dict[str, Callable[[_Writer], tuple[str, bool]]] = {
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
_SCALAR_FORMS = tuple(_SCALAR_GATES)
#: The transition forms `random_specs` draws, one per class and parametrisation.
GATE_FORMS = ("none", *_SCALAR_FORMS, "diag key", "diag value", "outer", "delta", "gated delta")


def _scalar_gate(w: _Writer, kind: str) -> tuple[str, bool]:
    """(text, atomic) of a scalar decay of the given form, maybe named as a value."""
    return w.as_value(*_SCALAR_GATES[kind](w))


# ----------------------------------------------------------------------------- decayed states


def _vector_gate(w: _Writer, size: str) -> str:
    """Class-specific: diagonal and outer-product gates: a vector input of decays in (0, 1)."""
    a = w.fresh(("a", "g", "f", "r"))
    kind = w.pick("sigmoid", "softplus", "log")
    w.inputs.append(f"{a}[{size}]")
    return {
        "sigmoid": f"sigmoid({a}_t)",
        "softplus": f"exp(-softplus({a}_t))",
        "log": f"exp({a}_t)",
    }[kind]


def _decayed_none(w: _Writer, c: _Core, g: str | None) -> tuple[str, str | None]:
    """Class-specific: identity: the state carries over unchanged."""
    return c.prev, None


def _decayed_scalar(w: _Writer, c: _Core, g: str | None) -> tuple[str, str | None]:
    """Class-specific: scalar decay (constant or data-dependent): g S, S g or g ⊙ S."""
    return w.pick(f"{g} {c.prev}", f"{c.prev} {g}", f"{g} {w.had} {c.prev}"), None


def _decayed_diag_key(w: _Writer, c: _Core, g: str | None) -> tuple[str, str | None]:
    """Class-specific: diagonal key-side: S diag(g), g^T ⊙ S or S ⊙ g^T."""
    gk = _vector_gate(w, c.K)
    T, had = w.T, w.had
    return w.pick(f"{c.prev} diag({gk})", f"{gk}{T} {had} {c.prev}", f"{c.prev} {had} {gk}{T}"), gk


def _decayed_diag_value(w: _Writer, c: _Core, g: str | None) -> tuple[str, str | None]:
    """Class-specific: diagonal value-side: diag(g) S or g ⊙ S."""
    gv = _vector_gate(w, c.V)
    return w.pick(f"diag({gv}) {c.prev}", f"{gv} {w.had} {c.prev}"), None


def _decayed_outer(w: _Writer, c: _Core, g: str | None) -> tuple[str, str | None]:
    """Class-specific: elementwise gate, an outer product of gates: (g_v g_k^T) ⊙ S."""
    gv, gk = _vector_gate(w, c.V), _vector_gate(w, c.K)
    return f"({gv} {gk}{w.T}) {w.had} {c.prev}", gk


#: How each form without a delta rule decays the state: (decayed state, key-side gate or None),
#: given the scalar decay `g` (for the scalar forms).
_DECAYED: dict[str, Callable[[_Writer, _Core, str | None], tuple[str, str | None]]] = {
    "none": _decayed_none,
    **dict.fromkeys(_SCALAR_FORMS, _decayed_scalar),
    "diag key": _decayed_diag_key,
    "diag value": _decayed_diag_value,
    "outer": _decayed_outer,
}


def _z_decayed_none(w: _Writer, zprev: str, g: str | None, gk: str | None) -> str:
    """Class-specific: identity: the normaliser carries over unchanged."""
    return zprev


def _z_decayed_scalar(w: _Writer, zprev: str, g: str | None, gk: str | None) -> str:
    """Class-specific: scalar decay: the normaliser decays by the state's g."""
    return w.pick(f"{g} {zprev}", f"{g} {w.had} {zprev}")


def _z_decayed_diag_key(w: _Writer, zprev: str, g: str | None, gk: str | None) -> str:
    """Class-specific: diagonal key-side: the normaliser decays by the state's key gate."""
    return w.pick(f"diag({gk}) {zprev}", f"{gk} {w.had} {zprev}")


#: The forms a normaliser state z can share the decay of (a vector z runs over the key side).
_Z_DECAYED: dict[str, Callable[[_Writer, str, str | None, str | None], str]] = {
    "none": _z_decayed_none,
    **dict.fromkeys(_SCALAR_FORMS, _z_decayed_scalar),
    "diag key": _z_decayed_diag_key,
}


# ----------------------------------------------------------------------------- updates


@dataclass(frozen=True)
class _Update:
    """A state update as text, with what a normaliser sharing it needs: the write scale, the
    scalar decay and the key-side gate (None where the form has none)."""

    text: str
    scale: str | None = None
    g: str | None = None
    gk: str | None = None


def _write_scale(w: _Writer) -> str | None:
    """A scalar scale of the write: Mamba's dt, an input, a parameter, a number, or none."""
    if w.dt_scale is not None and w.coin():
        return w.dt_scale
    kind = w.pick(None, "input", "param", "default", "number")
    if kind == "input":
        s = w.fresh(("s", "beta", "w"))
        w.inputs.append(s)
        return f"{s}_t"
    if kind in ("param", "default"):
        s = w.fresh(("w", "scale", "eta"))
        w.params.append(s if kind == "param" else f"{s} = {w.pick('0.5', '1 + h', '2^(-h)')}")
        return s
    if kind == "number":
        return w.pick("0.5", "2", "0.125")
    return None


def _gated_update(w: _Writer, c: _Core, form: str, forms: tuple[str, ...]) -> _Update:
    """The update of a form without a delta rule: a decayed state plus a scaled write."""
    g = None
    if form in _SCALAR_GATES:
        text, atomic = _scalar_gate(w, form)
        g = text if atomic else f"({text})"
    decayed, gk = _DECAYED[form](w, c, g)
    scale = _write_scale(w)
    pre = f"{scale} " if scale else ""
    v, kx, T = c.v, c.kx, w.T
    write = w.pick(
        f"{pre}{v}_t {kx}{T}",
        f"{pre}({v}_t {kx}{T})",
        f"{v}_t ({pre}{kx}){T}" if scale else f"{v}_t @ {kx}{T}",
    )
    return _Update(f"{decayed} + {write}", scale, g, gk)


def _delta_key_and_beta(w: _Writer, c: _Core) -> tuple[str, str]:
    """Class-specific: the delta rule's key (l2norm, via a `let`, of the features, or a plain
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


def _delta_spelling(w: _Writer, c: _Core, decay: str, beta: str, kx: str) -> str:
    """Class-specific: the delta rule written out, undistributed or distributed."""
    prev, v, T, minus = c.prev, c.v, w.T, w.minus
    write = f"{beta} {v}_t {kx}{T}"
    return w.pick(
        f"{decay}{prev} (I {minus} {beta} {kx} {kx}{T}) + {write}",
        f"{decay}{prev} {minus} {decay}{beta} {prev} {kx} {kx}{T} + {write}",
        f"{prev} {decay}(I {minus} {beta} {kx} {kx}{T}) + {beta} ({v}_t {kx}{T})",
    )


def _update_delta(w: _Writer, c: _Core, form: str, forms: tuple[str, ...]) -> _Update:
    """Class-specific: identity minus rank-1: S (I - beta k k^T) + beta v k^T."""
    kx, beta = _delta_key_and_beta(w, c)
    return _Update(_delta_spelling(w, c, "", beta, kx))


def _update_gated_delta(w: _Writer, c: _Core, form: str, forms: tuple[str, ...]) -> _Update:
    """Class-specific: scalar decay times identity minus rank-1: g S (I - beta k k^T) + beta v k^T,
    with g one of the scalar-decay forms drawn."""
    kx, beta = _delta_key_and_beta(w, c)
    kinds = [
        f for f in ("constant", "sigmoid", "softplus", "mamba", "log input", "number") if f in forms
    ]
    g, g_atomic = _scalar_gate(w, w.pick(*(kinds or ["sigmoid"])))
    decay = (g if g_atomic else f"({g})") + " "
    return _Update(_delta_spelling(w, c, decay, beta, kx))


#: How each transition form writes its update.
_UPDATES: dict[str, Callable[[_Writer, _Core, str, tuple[str, ...]], _Update]] = {
    **dict.fromkeys(_DECAYED, _gated_update),
    "delta": _update_delta,
    "gated delta": _update_gated_delta,
}


# ----------------------------------------------------------------------------- the spec


def random_specs(forms: tuple[str, ...] = GATE_FORMS):
    """A hypothesis strategy of random valid spec texts across every supported class.

    Draws a transition form (`GATE_FORMS`: none, a constant per-head parameter with a default, a
    number, a parameter without default (exp(-exp(lam)), exp(-softplus(lam)), sigmoid(lam), or
    raw in (0, 1)),
    sigmoid(a_t), exp(-softplus(g_t)), exp(-softplus(dt_t) exp(A_log)), exp(dt_t A), exp(g_t),
    diagonal key-side, value-side, outer-product, delta with l2norm(k) or a plain unit key, gated
    delta), a write scale (scalar input, parameter, number), a feature map (elu + 1, relu, silu,
    via `let`), a normaliser state z read as a ratio (with elu + 1 only, so the denominator is
    positive), a skip term D v_t, random names for sizes, inputs, parameters and states, and
    equivalent spellings (G H vs H G vs G ⊙ H, ^T vs ᵀ, distributed delta, per-token values).
    Every spec is stable for the input ranges `mixc.check.sampling.input_ranges` derives (decays
    in (0, 1], beta in [0, 2], keys of norm <= 1), which the tests check by fuzzing each one.
    """
    from hypothesis import strategies as st

    unknown = set(forms) - set(GATE_FORMS)
    if unknown or not forms:
        raise MixcError(
            f"forms: expected some of {', '.join(GATE_FORMS)}, "
            f"got {', '.join(sorted(unknown)) or 'none'}"
        )
    return st.composite(_draw_spec)(tuple(forms))


def _feature_map(w: _Writer) -> tuple[str | None, str | None]:
    """(kind, name) of a feature map defined by a `let` (elu + 1, relu, silu), or none."""
    fmap = w.pick(None, "elu", "elu", "relu", "silu")
    if not fmap:
        return None, None
    phi, arg = w.fresh(("phi", "fm", "feat")), w.fresh(("x", "u", "y0"))
    body = {"elu": f"elu({arg}) + 1", "relu": f"relu({arg})", "silu": f"silu({arg})"}[fmap]
    w.lets.append(f"let {phi}({arg}) = {body}")
    return fmap, phi


def _normaliser(
    w: _Writer, c: _Core, form: str, fmap: str | None, u: _Update
) -> tuple[str, str] | None:
    """Maybe a normaliser state z read as a ratio, as (name, update): elu + 1 features and a
    positive write scale keep its denominator positive."""
    positive = u.scale is None or u.scale[0].isdigit() or u.scale.startswith("softplus")
    if not (form in _Z_DECAYED and fmap == "elu" and positive and w.coin()):
        return None
    z = w.fresh(("z", "n", "norm"))
    zdecayed = _Z_DECAYED[form](w, f"{z}_{{t-1}}", u.g, u.gk)
    zpre = f"{u.scale} " if u.scale else ""
    return z, f"{zdecayed} + {zpre}{c.kx}"


def _readout(w: _Writer, c: _Core, qx: str, z: str | None) -> str:
    """The output: S_t q (over z_t . q with a normaliser), maybe plus a skip term D v_t."""
    read = w.pick(f"{c.S}_t {qx}", f"{c.S}_t @ {qx}")
    if z:
        read = f"{read} / ({w.pick(f'{z}_t {w.dot} {qx}', f'{qx} {w.dot} {z}_t')})"
    skip = w.pick(None, "scalar", "default", "vector") if not z else None
    if skip:
        D = w.fresh(("D", "skip", "Dh"), upper=True)
        if skip == "scalar":
            w.params.append(D)
            read += " + " + w.pick(f"{D} {c.v}_t", f"{D} {w.had} {c.v}_t")
        elif skip == "default":
            w.params.append(f"{D} = {w.pick('1', '0.5')}")
            read += f" + {D} {c.v}_t"
        else:
            w.params.append(f"{D}[{c.V}]")
            read += f" + {D} {w.had} {c.v}_t"
    return read


def _draw_spec(draw, forms: tuple[str, ...]) -> str:
    w = _Writer(draw)
    mixer = w.fresh(("mix", "mixer1", "variant", "my_mixer", "m"))
    K, V = w.fresh(("K", "N", "Dk", "E"), upper=True), w.fresh(("V", "P", "Dv", "M"), upper=True)
    S = w.fresh(("H", "S", "W", "C", "Mem"), upper=True)
    q, k, v = w.fresh(("q", "c", "query")), w.fresh(("k", "key", "b")), w.fresh(("v", "x", "val"))
    w.inputs += [f"{q}[{K}]", f"{k}[{K}]", f"{v}[{V}]"]
    form = w.pick(*forms)
    fmap, phi = _feature_map(w)
    qx = f"{phi}({q}_t)" if phi else f"{q}_t"
    delta = form in ("delta", "gated delta")
    kx = f"{phi}({k}_t)" if phi and not delta else f"{k}_t"
    c = _Core(K, V, S, k, v, kx, phi)
    u = _UPDATES[form](w, c, form, forms)
    z = _normaliser(w, c, form, fmap, u)
    read = _readout(w, c, qx, z[0] if z else None)
    y = w.fresh(("y", "o", "out"))

    lines = [f"mixer {mixer}" + w.pick("", ' "a random variant"')]
    split = draw(w.st.integers(1, len(w.inputs)))
    lines.append("in    " + ", ".join(w.inputs[:split]))
    if w.inputs[split:]:
        lines.append("in    " + ", ".join(w.inputs[split:]))
    if w.params:
        lines.append("param " + ", ".join(w.params))
    lines.append(f"state {S}[{V}, {K}]" + (f", {z[0]}[{K}]" if z else ""))
    lines += w.lets
    lines += w.values
    lines.append(f"{S}_t = {u.text}")
    if z:
        lines.append(f"{z[0]}_t = {z[1]}")
    lines.append(f"{y}_t = {read}" + w.pick("", "  # the output"))
    return "\n".join(lines) + "\n"
