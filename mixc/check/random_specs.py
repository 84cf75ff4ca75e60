"""Random valid specs across every supported class, to fuzz the compiler itself.

`random_specs(forms)` is a hypothesis strategy of spec texts. Each spec draws one transition
form (`GATE_FORMS`), written by its class (`TransitionClass.random_forms`), and around it the
parts every spec has: random names, a feature map, a write scale, maybe a normaliser state and
a skip term, and equivalent spellings of the same maths.
"""

from __future__ import annotations

from mixc.errors import MixcError
from mixc.transitions import REGISTRY
from mixc.transitions.writing import Core, Update, Writer

__all__ = ["GATE_FORMS", "random_specs"]

#: Every transition form random specs draw, from every class of the registry, in its order.
_FORMS = {name: write for cls in REGISTRY for name, write in cls.random_forms().items()}
GATE_FORMS = tuple(_FORMS)


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
    Every spec is stable for the input ranges `mixc.check.ranges.input_ranges` derives (decays
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


def _feature_map(w: Writer) -> tuple[str | None, str | None]:
    """(kind, name) of a feature map defined by a `let` (elu + 1, relu, silu), or none."""
    fmap = w.pick(None, "elu", "elu", "relu", "silu")
    if not fmap:
        return None, None
    phi, arg = w.fresh(("phi", "fm", "feat")), w.fresh(("x", "u", "y0"))
    body = {"elu": f"elu({arg}) + 1", "relu": f"relu({arg})", "silu": f"silu({arg})"}[fmap]
    w.lets.append(f"let {phi}({arg}) = {body}")
    return fmap, phi


def _normaliser(w: Writer, c: Core, fmap: str | None, u: Update) -> tuple[str, str] | None:
    """Maybe a normaliser state z read as a ratio, as (name, update): elu + 1 features and a
    positive write scale keep its denominator positive."""
    positive = u.scale is None or u.scale[0].isdigit() or u.scale.startswith("softplus")
    if not (u.z is not None and fmap == "elu" and positive and w.coin()):
        return None
    z = w.fresh(("z", "n", "norm"))
    zdecayed = u.z(w, f"{z}_{{t-1}}")
    zpre = f"{u.scale} " if u.scale else ""
    return z, f"{zdecayed} + {zpre}{c.kx}"


def _readout(w: Writer, c: Core, qx: str, z: str | None) -> str:
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
    w = Writer(draw)
    mixer = w.fresh(("mix", "mixer1", "variant", "my_mixer", "m"))
    K, V = w.fresh(("K", "N", "Dk", "E"), upper=True), w.fresh(("V", "P", "Dv", "M"), upper=True)
    S = w.fresh(("H", "S", "W", "C", "Mem"), upper=True)
    q, k, v = w.fresh(("q", "c", "query")), w.fresh(("k", "key", "b")), w.fresh(("v", "x", "val"))
    w.inputs += [f"{q}[{K}]", f"{k}[{K}]", f"{v}[{V}]"]
    form = w.pick(*forms)
    fmap, phi = _feature_map(w)
    qx = f"{phi}({q}_t)" if phi else f"{q}_t"
    kx = f"{phi}({k}_t)" if phi else f"{k}_t"  # the delta rule draws its own key
    c = Core(K, V, S, k, v, kx, phi)
    u = _FORMS[form](w, c, forms)
    z = _normaliser(w, c, fmap, u)
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
