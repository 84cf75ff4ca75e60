"""How random specs are written: the drawing context every class's random forms use.

`mixc.check.random_specs` draws a whole spec around one transition form; each class module
(`TransitionClass.random_forms`) writes the forms of its own class with these pieces, so a new
class brings its random specs with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Core", "Update", "Writer", "decayed_update"]


def _valid_name(name: str, size: bool) -> bool:
    from mixc.frontend.verify import LAYOUT_SIZES, RESERVED  # the language's words included

    if size and name in LAYOUT_SIZES:
        return False
    return name not in RESERVED


class Writer:
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
        """A new name: one of `pool` or a made-up one (capitalised: a size, when `upper`),
        numbered when taken or not allowed."""
        st = self.st
        letters = "ACDEFGJKLMNOPQRSUVWXYZ" if upper else "abcdefgjklmnopqrsuvwxyz"
        made = st.builds(
            str.__add__,
            st.sampled_from(letters),
            st.text("abcdefgjkmnopqrsuvwxyz0123456789", max_size=3),
        )
        base = self.draw(st.one_of(st.sampled_from(pool), made))
        name, i = base, 1
        while name in self.taken or not _valid_name(name, size=upper):
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
class Core:
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


@dataclass(frozen=True)
class Update:
    """A state update as text, its write scale, and how a normaliser state z[K] sharing the
    transition decays (`z(writer, "z_{t-1}") -> text`; None where z cannot share it)."""

    text: str
    scale: str | None = None
    z: Callable[[Writer, str], str] | None = None


#: A class's way of writing one transition form: (writer, core, every form drawn) -> update.
RandomForm = Callable[[Writer, Core, tuple[str, ...]], Update]


def write_scale(w: Writer) -> str | None:
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


def decayed_update(
    w: Writer, c: Core, decayed: str, z: Callable[[Writer, str], str] | None = None
) -> Update:
    """The update `decayed + scale v k^T`: a decayed state plus a (maybe scaled) write."""
    scale = write_scale(w)
    pre = f"{scale} " if scale else ""
    v, kx, T = c.v, c.kx, w.T
    write = w.pick(
        f"{pre}{v}_t {kx}{T}",
        f"{pre}({v}_t {kx}{T})",
        f"{v}_t ({pre}{kx}){T}" if scale else f"{v}_t @ {kx}{T}",
    )
    return Update(f"{decayed} + {write}", scale, z)
