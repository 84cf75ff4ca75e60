"""How `mixc.nn.MixerLayer` starts: every decay near 1 (`DECAY_INIT`), solved from the spec's own
expression of it on a grid (`start_decays`), and the check that each default reading the head
index is finite at every head of the layer (`check_defaults`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch

from mixc.algebra.expand import inline
from mixc.errors import MixcError
from mixc.frontend.builtins import BUILTINS
from mixc.frontend.constants import Folder
from mixc.frontend.ir import Binary, Call, Expr, Number
from mixc.layer_roles import DECAY_INIT, ERASE_INIT
from mixc.layer_roles import reads as _reads

__all__ = ["check_defaults", "start_biases", "start_decays", "start_erases"]


class _UnsolvableError(Exception):
    """A decay whose log is not an elementwise expression (a dot product, an l2norm)."""


def _evaluate(e: Expr, values: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """An elementwise expression (let functions inlined) on tensors that broadcast, `values`
    giving the inputs, parameters and h it reads: enough for the log of a decay (`dt_t A`,
    `logsigmoid(a_t)`, `log(sigmoid(w_t) sigmoid(f_t))`). Raises _UnsolvableError where it
    reads anything else or is not elementwise."""
    value = Folder(_TENSORS).value(e, values)
    if value is None:
        raise _UnsolvableError(str(e))
    return value


class _Tensors:
    """The constant folder's arithmetic (`mixc.frontend.constants.Folder`) on float64 tensors:
    elementwise built-ins and operations, diag(x) read as its diagonal x. Nothing is refused:
    a value that is not finite stays in the tensor, where the caller looks for it."""

    def number(self, e: Number) -> torch.Tensor:
        return torch.tensor(float(e.text), dtype=torch.float64)

    def call(self, e: Call, args: tuple[torch.Tensor | None, ...]) -> torch.Tensor | None:
        builtin = BUILTINS.get(e.func)
        if builtin is None or any(a is None for a in args):
            return None
        if e.func == "diag":
            return args[0]
        return builtin.tensor(*args) if builtin.elementwise else None

    def binary(
        self, e: Binary, left: torch.Tensor | None, right: torch.Tensor | None
    ) -> torch.Tensor | None:
        if left is None or right is None or e.op not in _ELEMENTWISE:
            return None
        return _ELEMENTWISE[e.op](left, right)


_TENSORS = _Tensors()

_ELEMENTWISE = {
    "+": torch.add,
    "-": torch.sub,
    "*": torch.mul,
    "@": torch.mul,  # a product of scalars and diagonals, entry by entry
    "/": torch.div,
    "^": torch.pow,
}


#: The grid a decay's bias (or parameter) is chosen from: the value whose decay is nearest its
#: target wins.
_GRID = torch.arange(-960, 961, dtype=torch.float64) / 40  # -24 to 24 by 1/40, 0 exactly


def _solve(f: Callable[[torch.Tensor], torch.Tensor], target: torch.Tensor) -> torch.Tensor:
    """For each head h (the first dim of `target`), the grid value b whose f(b)[h] (a [NH, G]
    tensor) is nearest each entry of target[h]: the decay needs no monotone or invertible form."""
    return _nearest(f, target)[0]


def _nearest(f, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`_solve`'s grid values, and the f each of them reaches (target's shape)."""
    got = f(_GRID).nan_to_num(nan=math.inf)  # [NH, G]
    flat = target.reshape(target.shape[0], -1, 1)  # [NH, E, 1]
    best = (got[:, None, :] - flat).abs().argmin(-1)  # [NH, E]
    reached = got.gather(1, best).reshape(target.shape)
    return _GRID[best].reshape(target.shape).to(torch.float32), reached


def check_defaults(spec, heads: int) -> None:
    """Each default that reads the head index h is finite at every head of this layer
    (`check` proves it for the first HEADS_CHECKED heads; a layer may have more)."""
    h = torch.arange(heads, dtype=torch.float64)
    for p in spec.mixer.params:
        if p.default is None or "h" not in _reads(p.default, {"h"}):
            continue
        try:
            value = _evaluate(inline(spec.mixer, p.default), {"h": h})
        except _UnsolvableError:
            continue
        bad = (~torch.isfinite(value.expand_as(h))).nonzero()
        if len(bad):
            raise MixcError(
                f"param {p.name}: its default {p.default} is not finite at head "
                f"h = {bad[0].item()} (of num_v_heads = {heads})"
            )


def start_biases(layer) -> None:
    """Start every decay near 1 (`start_decays`), then every erase strength at ERASE_INIT
    (`start_erases`)."""
    start_decays(layer)
    start_erases(layer)


def start_decays(layer) -> None:
    """Set every decay to start near 1 (`DECAY_INIT`): the bias of the inputs a decay reads
    (one value shared by them), or the parameters of a decay that reads no input, is the
    grid value whose log-decay is nearest -w, w drawn per head and entry. The parameters
    beside an input (A in exp(dt_t A)) keep their start, and each head is solved with their
    mean there. A decay whose log is not elementwise keeps bias 0."""
    heads = layer.num_v_heads
    lo, hi = (math.log(x) for x in DECAY_INIT)
    solved_alone = {p for p in layer.learned if layer.roles.inits[p] == "decay"}
    done: set[str] = set()
    for d in layer.roles.decays:
        solving = [n for n in _reads(d.log, set(layer.bias)) if n not in done]
        solving = solving or [n for n in _reads(d.log, solved_alone) if n not in done]
        if not solving:
            continue
        tensors = [layer.bias[n] if n in layer.bias else layer._stored(n) for n in solving]
        shapes = {tuple(t.shape) for t in tensors}
        shape = shapes.pop() if len(shapes) == 1 else (heads,)
        w = torch.exp(lo + (hi - lo) * torch.rand(shape, dtype=torch.float64)) * d.share
        fixed = _per_head_values(layer, d.log, exclude=set(solving))

        def log_decay(grid: torch.Tensor, d=d, solving=solving, fixed=fixed) -> torch.Tensor:
            row, values = grid.expand(heads, -1), dict(fixed)
            values.update({name: _input_value(layer, name, row) for name in solving})
            return _evaluate(d.log, values).expand(heads, -1)

        try:
            start, reached = _nearest(log_decay, -w)
        except _UnsolvableError:
            continue
        starts = dict.fromkeys(solving, start)
        if len(solving) > 1 and not ((reached / -w - 1).abs() < 1).all():
            starts = _solve_each(layer, d.log, solving, -w, fixed)
        for name, t in zip(solving, tensors):
            s = starts[name]
            t.copy_(s if s.shape == t.shape else s.view(heads, *[1] * (t.dim() - 1)))
        done |= set(solving)


def _input_value(layer, name: str, row: torch.Tensor) -> torch.Tensor:
    """What the mixer reads of input or parameter `name` when its bias (or stored value) is
    `row`: the bias through the input's transforms, a stored parameter through its map."""
    return layer._transformed(name, row) if name in layer.bias else layer.stored[name][1](row)


def _solve_each(layer, log, solving: list[str], target, fixed, rounds: int = 2) -> dict:
    """Each input of a decay solved in turn, the others at their start so far (per head, the
    mean over entries): for a decay made of several factors, where one value shared by all its
    inputs cannot start it near 1 (sigmoid(-x) sigmoid(x) <= 1/4 for every x)."""
    heads = layer.num_v_heads
    current = {n: torch.zeros(heads, 1, dtype=torch.float64) for n in solving}
    starts: dict[str, torch.Tensor] = {}
    for _ in range(rounds):
        for name in solving:

            def log_decay(grid: torch.Tensor, name=name) -> torch.Tensor:
                values = dict(fixed)
                values.update({o: _input_value(layer, o, current[o]) for o in solving})
                values[name] = _input_value(layer, name, grid.expand(heads, -1))
                return _evaluate(log, values).expand(heads, -1)

            starts[name] = _solve(log_decay, target)
            current[name] = starts[name].double().reshape(heads, -1).mean(-1, keepdim=True)
    return starts


def start_erases(layer) -> None:
    """Set every erase strength to start at ERASE_INIT: the bias of the inputs it reads (one
    value shared by them, those a decay reads left as `start_decays` set them) is the grid
    value whose strength is nearest it, each head solved with the mean of the other values it
    reads. An erase strength that is not elementwise keeps bias 0."""
    heads = layer.num_v_heads
    decayed = {n for d in layer.roles.decays for n in _reads(d.log, set(layer.bias))}
    done: set[str] = set()
    for erase in layer.roles.erases:
        solving = [n for n in _reads(erase, set(layer.bias)) if n not in decayed | done]
        if not solving:
            continue
        fixed = _per_head_values(layer, erase, exclude=set(solving))

        def strength(grid: torch.Tensor, erase=erase, solving=solving, fixed=fixed):
            row, values = grid.expand(heads, -1), dict(fixed)
            values.update({name: layer._transformed(name, row) for name in solving})
            return _evaluate(erase, values).expand(heads, -1)

        try:
            start = _solve(strength, torch.full((heads,), ERASE_INIT, dtype=torch.float64))
        except _UnsolvableError:
            continue
        for name in solving:
            t = layer.bias[name]
            t.copy_(start.view(heads, *[1] * (t.dim() - 1)))
        done |= set(solving)


def _per_head_values(layer, e: Expr, exclude: set[str]) -> dict[str, torch.Tensor]:
    """The value per head ([NH, 1], the mean over a head's entries) of every parameter and
    transformed bias `e` reads outside `exclude`, and the head index h."""
    heads = layer.num_v_heads
    h = torch.arange(heads, dtype=torch.float64)[:, None]
    out = {"h": h}
    for p in layer.spec.mixer.params:
        if p.default is not None and p.name in _reads(e, {p.name}):
            out[p.name] = _evaluate(inline(layer.spec.mixer, p.default), {"h": h}).expand(heads, 1)
    params = layer.param_values()
    for name in _reads(e, set(layer.learned) - exclude):
        out[name] = params[name].double().reshape(heads, -1).mean(-1, keepdim=True)
    for name in _reads(e, set(layer.bias) - exclude):
        biased = layer._transformed(name, layer.bias[name].double())
        out[name] = biased.reshape(heads, -1).mean(-1, keepdim=True)
    return out
