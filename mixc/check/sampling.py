"""What the fuzzer draws: examples built on the input ranges, and their tensors.

`examples` draws batch 1-3, heads 1-4, T in 1..max_T with a bias towards 1, primes and lengths
that are not multiples of a chunk size, a distinct size for every size symbol (so K != V and a
transposed state cannot pass by accident), 1-3 power-of-two chunk sizes, with or without initial
states, inputs given with 1 head or a divisor of the heads (shared, as Mamba-2 shares B and C),
parameter defaults overridden by explicit tensors (to get their gradients), a torch seed, and a
stress mode for every input whose range matters (`mixc.check.ranges`). `draws` turns an example
into torch expressions (what a reproducer prints) and `make_case` into tensors.

Benchmarks, tests and examples draw from the same ranges at any size with `sample_inputs` and
`sample_states` (with `mixc.check.ranges.decays_near_one` for every decay near 1).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from mixc.analysis.plan import Plan
from mixc.check.ranges import SAMPLERS, InputRanges, Range, input_ranges
from mixc.frontend.ir import CHANNEL
from mixc.frontend.spec import Spec

__all__ = [
    "CHUNK_SIZES",
    "SPECIAL_T",
    "Case",
    "Draw",
    "Example",
    "draws",
    "examples",
    "make_case",
    "sample_inputs",
    "sample_states",
]

CHUNK_SIZES = (4, 16, 1, 2, 8, 32, 64)  # the first is what a shrunk example uses
SPECIAL_T = (1, 2, 3, 5, 7, 13, 17, 31, 37, 61, 64, 65, 97, 100, 127, 128, 129)

# ----------------------------------------------------------------------------- examples


@dataclass(frozen=True)
class Example:
    """One drawn case: sizes, forms to run, stress modes, and the torch seed of every tensor."""

    batch: int
    heads: int
    T: int
    sizes: tuple[tuple[str, int], ...]
    chunk_sizes: tuple[int, ...]
    initial_state: bool
    input_heads: tuple[tuple[str, int], ...]  # heads each input is given with (divides `heads`)
    modes: tuple[tuple[str, str], ...]  # stress mode of each argument that has several
    override_defaults: bool
    seed: int

    def describe(self) -> str:
        sizes = " ".join(f"{k}={v}" for k, v in self.sizes)
        shared = [f"{n}:{h}" for n, h in self.input_heads if h != self.heads]
        modes = [f"{n}={m}" for n, m in self.modes]
        parts = [
            f"batch={self.batch} heads={self.heads} T={self.T} {sizes}".strip(),
            f"chunk_sizes={','.join(map(str, self.chunk_sizes))}",
            f"initial_state={'yes' if self.initial_state else 'no'}",
        ]
        if shared:
            parts.append("input heads " + " ".join(shared))
        if modes:
            parts.append("modes " + " ".join(modes))
        if self.override_defaults:
            parts.append("parameter defaults passed explicitly")
        parts.append(f"seed={self.seed}")
        return ", ".join(parts)


def examples(
    r: InputRanges,
    *,
    max_T: int = 100,
    max_size: int = 12,
    max_batch: int = 3,
    max_heads: int = 4,
    chunked: bool = True,
):
    """A hypothesis strategy of `Example`s for the ranges `r` (see the module doc)."""
    from hypothesis import strategies as st

    ts = [t for t in SPECIAL_T if t <= max_T]

    @st.composite
    def draw(draw_) -> Example:
        batch = draw_(st.integers(1, max_batch))
        heads = draw_(st.integers(1, max_heads))
        T = draw_(st.one_of(st.integers(1, max_T), st.sampled_from(ts)))
        values = _draw_sizes(draw_, r, max_size)
        chunk_sizes = (
            tuple(
                draw_(st.lists(st.sampled_from(CHUNK_SIZES), min_size=1, max_size=3, unique=True))
            )
            if chunked
            else ()
        )
        initial = draw_(st.booleans())
        divisors = [heads] + [d for d in range(1, heads) if heads % d == 0]
        input_heads = [(name, draw_(st.sampled_from(divisors))) for name in r.inputs]
        if input_heads and all(h < heads for _, h in input_heads):  # the inputs fix NH
            input_heads[0] = (input_heads[0][0], heads)
        modes = tuple(
            (x.name, draw_(st.sampled_from(x.modes))) for x in r.ranges if len(x.modes) > 1
        )
        override = bool(r.defaults) and draw_(st.booleans())
        seed = draw_(st.integers(0, 2**31 - 1))
        return Example(
            batch,
            heads,
            T,
            tuple(zip(r.symbols, values, strict=True)),
            chunk_sizes,
            initial,
            tuple(input_heads),
            modes,
            override,
            seed,
        )

    return draw()


def _draw_sizes(draw_, r: InputRanges, max_size: int) -> list[int]:
    """A distinct size for every size symbol, >= 2 for those an l2norm runs over."""
    from hypothesis import strategies as st

    symbols = r.symbols
    n = len(symbols)
    values = draw_(st.lists(st.integers(1, max(max_size, n)), min_size=n, max_size=n, unique=True))
    wide = [i for i, s in enumerate(symbols) if s in r.wide]
    if any(values[i] == 1 for i in wide):  # give the 1 to a symbol that may be 1, or shift all
        narrow = [i for i in range(n) if i not in wide]
        one = values.index(1)
        if narrow:
            values[one], values[narrow[0]] = values[narrow[0]], values[one]
        else:
            values = [x + 1 for x in values]
    return _halve(values, symbols, r.halved)


def _halve(values: list[int], symbols, halved) -> list[int]:
    """`values` with each size d that a rotation turns by p angles (`InputRanges.halved`)
    raised, where 2 p > d, to the smallest free size at least 2 p."""
    at = {s: i for i, s in enumerate(symbols)}
    for _ in range(len(halved) + 1):  # raising one may break a pair before it
        for d, p in halved:
            if 2 * values[at[p]] > values[at[d]]:
                size = 2 * values[at[p]]
                while size in values:
                    size += 1
                values[at[d]] = size
    return values


# ----------------------------------------------------------------------------- one case


def _dims(shape: tuple[str, ...], sizes: dict[str, int]) -> list[int]:
    return [int(s) if s.isdigit() else sizes[s] for s in shape]


def _out_dims(shape: tuple[str, str]) -> list[str]:
    """The output's trailing dims in the module layout: a scalar has none, a row or column one."""
    return [d for d in shape if d != "1"] if "1" in shape else list(shape)


def _default_values(r: InputRanges, heads: int, sizes: dict[str, int]) -> dict[str, list]:
    """Parameter defaults as explicit values [NH, *shape], evaluated as the oracle does."""
    from mixc.oracle.interpret import _Evaluator

    ev = _Evaluator(r.mixer, {}, torch.device("cpu"), sizes)
    h = torch.arange(heads, dtype=torch.float64).reshape(1, heads, 1, 1)
    out = {}
    for prm in r.mixer.params:
        if prm.default is None:
            continue
        dims = _dims(prm.shape, sizes)
        channel = torch.arange(dims[0] if dims else 1, dtype=torch.float64).reshape(1, 1, -1, 1)
        value = ev.eval(prm.default, {"h": h, CHANNEL: channel})
        value = value.expand(1, heads, *([*dims, 1, 1][:2] if len(dims) < 2 else dims))
        out[prm.name] = value.reshape(heads, *dims).tolist()
    return out


@dataclass(frozen=True)
class Draw:
    """One tensor of a case: its name, role and the torch expression that makes it."""

    name: str
    kind: str  # "input" | "param" | "default" | "state" | "cotangent"
    code: str


def draws(r: InputRanges, ex: Example) -> list[Draw]:
    """Every tensor of the case, in generation order, as torch expressions over `gen` (seeded
    with `ex.seed`) and B, T, NH. Shared by the fuzzer and its reproducers. The spec's sizes
    are written as their numbers: a size may be named like anything the script binds (`torch`,
    `gen`, `spec`)."""
    sizes = dict(ex.sizes)
    modes = dict(ex.modes)
    heads = dict(ex.input_heads)
    out: list[Draw] = []

    def numbers(shape: list[str]) -> list[str]:
        return [str(sizes[d]) if d in sizes else d for d in shape]

    def code(x: Range, shape: list[str]) -> str:
        template = SAMPLERS[x.domain][modes.get(x.name, x.modes[0])]
        shape = numbers(shape)
        return template.format(shape=", ".join(shape), rows=", ".join([*shape[:-1], "1"]))

    for d in r.mixer.inputs:
        nh = "NH" if heads.get(d.name, ex.heads) == ex.heads else str(heads[d.name])
        out.append(Draw(d.name, "input", code(r.range(d.name), ["B", "T", nh, *d.shape])))
    for prm in r.mixer.params:
        if prm.default is None:
            out.append(Draw(prm.name, "param", code(r.range(prm.name), ["NH", *prm.shape])))
    if ex.override_defaults:
        for name, value in _default_values(r, ex.heads, sizes).items():
            out.append(Draw(name, "default", f"torch.tensor({value!r}, dtype=torch.float64)"))
    if ex.initial_state:
        for s in r.mixer.carried:
            out.append(Draw(s.name, "state", code(r.range(s.name), ["B", "NH", *s.shape])))
    out.append(_cotangent(r.output, numbers(["B", "T", "NH", *_out_dims(r.spec.shapes[r.output])])))
    out += [_cotangent(s.name, numbers(["B", "NH", *s.shape])) for s in r.mixer.carried]
    return out


def _cotangent(name: str, shape: list[str]) -> Draw:
    """The cotangent of an output or a final state, drawn as a plain input is."""
    return Draw(name, "cotangent", SAMPLERS["plain"]["normal"].format(shape=", ".join(shape)))


def _namespace(ex: Example) -> dict:
    gen = torch.Generator().manual_seed(ex.seed)
    return {
        "torch": torch,
        "F": torch.nn.functional,
        "gen": gen,
        "B": ex.batch,
        "T": ex.T,
        "NH": ex.heads,
    }


@dataclass
class Case:
    """The float64 tensors of one example, by role."""

    inputs: dict[str, Tensor]
    params: dict[str, Tensor]  # without a default
    defaults: dict[str, Tensor]  # explicit values of parameters with a default
    states: dict[str, Tensor]
    cot_y: Tensor
    cot_states: dict[str, Tensor]


def make_case(r: InputRanges, ex: Example) -> Case:
    """The tensors of example `ex`, made by evaluating its `draws`."""
    ns = _namespace(ex)
    case = Case({}, {}, {}, {}, torch.empty(0), {})
    for d in draws(r, ex):
        x = eval(d.code, ns)  # our own sampler templates (SAMPLERS): the reproducer prints them
        if d.kind == "input":
            case.inputs[d.name] = x
        elif d.kind == "param":
            case.params[d.name] = x
        elif d.kind == "default":
            case.defaults[d.name] = x
        elif d.kind == "state":
            case.states[d.name] = x
        elif d.name == r.output and d.kind == "cotangent" and case.cot_y.numel() == 0:
            case.cot_y = x
        else:
            case.cot_states[d.name] = x
    return case


# ----------------------------------------------------------------------------- any size


def _sample(
    r: InputRanges,
    kinds: tuple[str, ...],
    sizes: Mapping[str, int],
    T: int,
    batch: int,
    heads: int,
    seed: int,
    modes: Mapping[str, str],
    input_heads: Mapping[str, int],
) -> list[Tensor]:
    """The float64 draws of the given kinds, in order, for an example of these sizes."""
    ex = Example(
        batch,
        heads,
        T,
        tuple((s, sizes[s]) for s in r.symbols),
        (),
        "state" in kinds,
        tuple(input_heads.items()),
        tuple(modes.items()),
        False,
        seed,
    )
    ns = _namespace(ex)
    # our own sampler templates (SAMPLERS), evaluated as make_case does
    return [eval(d.code, ns) for d in draws(r, ex) if d.kind in kinds]


def sample_inputs(
    spec: Spec | str | os.PathLike,
    sizes: Mapping[str, int],
    T: int,
    *,
    batch: int = 1,
    heads: int = 1,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
    modes: Mapping[str, str] | None = None,
    input_heads: Mapping[str, int] | None = None,
    plan: Plan | None = None,
) -> list[Tensor]:
    """Random arguments for the compiled module of `spec`, in its argument order and layout:
    every input [batch, T, heads, *shape] (or `input_heads[name]` heads, shared across groups),
    then every parameter without a default [heads, *shape]. Drawn from the fuzzer's input ranges
    (each range's plain mode, or `modes[name]`, e.g. `decays_near_one`) with a generator seeded
    by `seed`, at the sizes of `sizes` (every size symbol), in `dtype` on `device`."""
    r = input_ranges(spec, plan)
    tensors = _sample(
        r, ("input", "param"), sizes, T, batch, heads, seed, modes or {}, input_heads or {}
    )
    return [x.to(dtype=dtype, device=device) for x in tensors]


def sample_states(
    spec: Spec | str | os.PathLike,
    sizes: Mapping[str, int],
    *,
    batch: int = 1,
    heads: int = 1,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
    plan: Plan | None = None,
) -> list[Tensor]:
    """Random initial states [batch, heads, *shape] for the compiled module of `spec`, in its
    state order, drawn as the fuzzer draws them (a denominator's state positive)."""
    r = input_ranges(spec, plan)
    tensors = _sample(r, ("state",), sizes, 1, batch, heads, seed, {}, {})
    return [x.to(dtype=dtype, device=device) for x in tensors]
