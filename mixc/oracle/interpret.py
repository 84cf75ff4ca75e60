"""The reference interpreter: a verified spec run token by token in float64.

This is the oracle every compiled form is tested against, so it favours being obviously right
over being fast: it walks the IR of each equation at every time step, with no analysis, no
rewriting and nothing shared with the code generators. It is differentiable (autograd flows
through it), so it is the reference for gradients too.

Values are float64 tensors with leading dims [B, NH] and two trailing matrix dims, as in the
verifier: a scalar is [B, NH, 1, 1], a vector x[K] the column [B, NH, K, 1], a matrix [B, NH, m, n].
Per-head parameters are [1, NH, r, c] and broadcast. `I` has no size of its own, so an
identity-shaped subexpression is kept as a recipe (`_Sized`) until it meets a tensor that fixes n.

Layout (the compiled-module contract):

- per-token inputs: scalar [B, T, NH], vector [B, T, NH, d], matrix [B, T, NH, m, n]; an input
  with 1 head or NH/g heads is shared by groups of g consecutive heads (repeat_interleave).
- params: [NH, *shape]; one with a default may be omitted (its default is evaluated with h the
  head index 0..NH-1).
- states: [B, NH, *shape], zeros when not given. An input read at t-1 (`x_{t-1}`) is carried
  like a state, named `x_{t-1}` and shaped [B, NH, *shape]: its value before the first token
  (zeros when not given), and the last token's among the final states.
- outputs: [B, T, NH, *shape] for every equation whose target is not a state; a row vector is
  returned as a vector [B, T, NH, d].
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from mixc.errors import InputError, MixcError
from mixc.frontend.builtins import BUILTINS
from mixc.frontend.ir import (
    ANGLE_ARGUMENTS,
    CHANNEL,
    POSITION,
    Binary,
    Call,
    Equation,
    Expr,
    Identity,
    Mixer,
    Name,
    Neg,
    Number,
    Timed,
    Transpose,
    walk,
)
from mixc.frontend.shapes import declared
from mixc.frontend.spec import Spec, load_spec

__all__ = ["interpret"]

DTYPE = torch.float64

#: The built-in functions on tensors: name -> the tensor version from the builtins table.
FUNCTIONS: dict[str, Callable[[Tensor], Tensor]] = {
    name: builtin.tensor for name, builtin in BUILTINS.items()
}


@dataclass(frozen=True)
class _Sized:
    """An identity-shaped value (I, 2 I, I - I, ...) whose size comes from context: `at(n)`."""

    at: Callable[[int], Tensor]


Value = Tensor | _Sized


def _is_scalar(x: Tensor) -> bool:
    return x.shape[-2:] == (1, 1)


def _apply(op: str, a: Tensor, b: Tensor) -> Tensor:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        return a / b
    if op == "^":
        return torch.pow(a, b)
    if op == "@":  # a scalar times anything scales it
        return a * b if _is_scalar(a) or _is_scalar(b) else a @ b
    if op == ".":
        return (a.flatten(-2) * b.flatten(-2)).sum(-1)[..., None, None]
    raise MixcError(f"unknown operator {op!r}")


def _binary(op: str, a: Value, b: Value) -> Value:
    """`a op b`, fixing the size of an identity-shaped side from the other side."""
    if isinstance(a, _Sized) and isinstance(b, _Sized):
        return _Sized(lambda n: _apply(op, a.at(n), b.at(n)))
    if isinstance(a, _Sized):
        if _is_scalar(b):
            return _Sized(lambda n: _apply(op, a.at(n), b))
        return _apply(op, a.at(b.shape[-2]), b)
    if isinstance(b, _Sized):
        if _is_scalar(a):
            return _Sized(lambda n: _apply(op, a, b.at(n)))
        return _apply(op, a, b.at(a.shape[-1]))
    return _apply(op, a, b)


class _Evaluator:
    """Evaluates expressions of one mixer. `now` holds values at t, `prev` states at t-1,
    `earlier` the lagged inputs at t-1 and `next` the backward states at t+1."""

    def __init__(
        self,
        mixer: Mixer,
        params: dict[str, Tensor],
        device: torch.device,
        sizes: dict[str, int] | None = None,
    ) -> None:
        self.mixer = mixer
        self.sizes = sizes or {}
        self.lets = {fn.name: fn for fn in mixer.lets}
        self.params = params
        self.device = device
        self.now: dict[str, Tensor] = {}
        self.prev: dict[str, Tensor] = {}
        self.earlier: dict[str, Tensor] = {}
        self.next: dict[str, Tensor] = {}
        self.rounding: Callable[[Tensor], Tensor] | None = None  # see interpret

    def eval(self, e: Expr, args: dict[str, Value]) -> Value:
        if isinstance(e, Number):
            return torch.tensor(float(e.text), dtype=DTYPE, device=self.device).reshape(1, 1, 1, 1)
        if isinstance(e, Identity):
            return _Sized(lambda n: torch.eye(n, dtype=DTYPE, device=self.device))
        if isinstance(e, Name):
            if e.name in args:
                return args[e.name]
            if e.name in self.params:
                return self.params[e.name]
            if e.name in self.sizes:  # a size read as a number
                size = float(self.sizes[e.name])
                return torch.tensor(size, dtype=DTYPE, device=self.device).reshape(1, 1, 1, 1)
            raise MixcError(f"no value for {e.name}")
        if isinstance(e, Timed):
            if e.offset == -1 and e.name in self.earlier:
                return self.earlier[e.name]
            table = {0: self.now, -1: self.prev, 1: self.next}.get(e.offset, {})
            if e.name not in table:
                raise MixcError(f"{e.name} at t{e.offset:+d} is not available here")
            return table[e.name]
        if isinstance(e, Neg):
            x = self.eval(e.operand, args)
            return _Sized(lambda n: -x.at(n)) if isinstance(x, _Sized) else -x
        if isinstance(e, Transpose):
            x = self.eval(e.operand, args)
            return _Sized(lambda n: x.at(n).mT) if isinstance(x, _Sized) else x.mT
        if isinstance(e, Binary):
            return _binary(e.op, self.eval(e.left, args), self.eval(e.right, args))
        if isinstance(e, Call):
            values = [self.eval(a, args) for a in e.args]
            if e.func in self.lets:
                fn = self.lets[e.func]
                return self.eval(fn.body, dict(zip(fn.args, values, strict=True)))
            if any(isinstance(v, _Sized) for v in values):
                raise MixcError(f"{e.func}(I): the size of I is unknown here")
            result = FUNCTIONS[e.func](*values)
            if self.rounding is not None and e.func in ANGLE_ARGUMENTS:
                result = self.rounding(result)
            return result
        raise MixcError(f"cannot evaluate {type(e).__name__} nodes")


def _lag0_reads(mixer: Mixer, e: Expr) -> set[str]:
    """Names read at time t by `e`, looking inside the let functions it calls."""
    lets = {fn.name: fn for fn in mixer.lets}
    reads: set[str] = set()
    todo, seen = [e], set()
    while todo:
        for node in walk(todo.pop()):
            if isinstance(node, Timed) and node.offset == 0:
                reads.add(node.name)
            elif isinstance(node, Call) and node.func in lets and node.func not in seen:
                seen.add(node.func)
                todo.append(lets[node.func].body)
    return reads


class _Sizes:
    """Binds symbolic sizes (K, V, ...) to the sizes of the tensors passed in."""

    def __init__(self) -> None:
        self.sizes: dict[str, int] = {}
        self.source: dict[str, str] = {}

    def bind(self, dims: tuple[str, ...], got: tuple[int, ...], what: str) -> None:
        for dim, n in zip(dims, got, strict=True):
            if dim.isdigit():
                if int(dim) != n:
                    raise InputError(f"{what}: size {n} where the spec says {dim}")
            elif dim in self.sizes and self.sizes[dim] != n:
                raise InputError(
                    f"size {dim} is {self.sizes[dim]} from {self.source[dim]} but {n} from {what}"
                )
            else:
                self.sizes.setdefault(dim, n)
                self.source.setdefault(dim, what)

    def matrix(self, dims: tuple[str, ...], what: str) -> tuple[int, int]:
        """The concrete (rows, cols) of a declared shape: a vector is a column."""
        out = []
        for dim in declared(dims):
            if dim.isdigit():
                out.append(int(dim))
            elif dim in self.sizes:
                out.append(self.sizes[dim])
            else:
                raise InputError(f"size {dim} of {what} is unknown: no input or state fixes it")
        return out[0], out[1]


def _layout(dims: tuple[str, ...], lead: str) -> str:
    return "[" + ", ".join([lead, *dims]) + "]"


def interpret(
    spec: Spec | str | os.PathLike,
    inputs: dict[str, Tensor],
    params: dict[str, Tensor] | None = None,
    initial_state: dict[str, Tensor] | None = None,
    rounding: Callable[[Tensor], Tensor] | None = None,
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Run a spec step by step in float64. `rounding`, if given, is applied to the result of
    every call of a built-in with an angle argument (`rotate`, `cos`, ...): the fuzzer moves
    them by one rounding of the precision under test, as it moves the inputs, to see how well
    conditioned an example is (a rotated vector is rounded before any kernel reads it).

    Returns (outputs by the target name of every non-state equation, final states by name).
    """
    spec = spec if isinstance(spec, Spec) else load_spec(spec)
    mixer = spec.mixer
    params, initial_state = dict(params or {}), dict(initial_state or {})
    _check_names(mixer, inputs, params, initial_state)
    first = inputs[mixer.inputs[0].name]
    device = first.device if isinstance(first, Tensor) else torch.device("cpu")

    sizes = _Sizes()
    raw = _given_inputs(mixer, inputs, device, sizes)
    B, T = first.shape[:2]
    params = _given_params(mixer, params, device, sizes)
    initial_state = _given_states(mixer, initial_state, device, sizes, B)
    NH = _head_count(raw, params, initial_state)

    xs = _spread_heads(mixer, raw, sizes, NH)
    values = _param_values(mixer, params, sizes, NH, device)
    evaluator = _Evaluator(mixer, values, device, sizes.sizes)
    evaluator.rounding = rounding
    evaluator.prev = _start_states(mixer, initial_state, sizes, B, NH, device)
    outputs = _output_buffers(spec, sizes, B, T, NH, device)
    _run(evaluator, spec.order, xs, outputs, B, T, NH)

    finals = {s.name: _unpack(evaluator.prev[s.name], 2, len(s.shape)) for s in mixer.carried}
    results = {name: _unpack(x, 3, _rank(spec.shapes[name])) for name, x in outputs.items()}
    return results, finals


# ----------------------------------------------------------------------------- the arguments


def _check_names(mixer: Mixer, inputs: dict, params: dict, initial_state: dict) -> None:
    """Every name given is declared, every input and every param without a default is given,
    and there is an input to take the sequence length from."""
    for kind, given, decls in (
        ("input", inputs, mixer.inputs),
        ("param", params, mixer.params),
        ("state", initial_state, mixer.carried),
    ):
        unknown = sorted(set(given) - {d.name for d in decls})
        if unknown:
            known = ", ".join(d.name for d in decls) or "none"
            raise InputError(
                f"unknown {kind}(s) {', '.join(unknown)} for {mixer.name}; {kind}s: {known}"
            )
    missing = [f"input {d.name}" for d in mixer.inputs if d.name not in inputs]
    missing += [
        f"param {p.name}" for p in mixer.params if p.default is None and p.name not in params
    ]
    if missing:
        raise InputError(f"{mixer.name} is missing {', '.join(missing)} (no default)")
    if not mixer.inputs:
        raise InputError(f"{mixer.name} has no per-token inputs, so the sequence length is unknown")


def _as_float64(x, what: str, device: torch.device) -> Tensor:
    """`x` as a float64 tensor on `device`; refuses what is not a real tensor."""
    if not isinstance(x, Tensor):
        raise InputError(f"{what} must be a torch.Tensor, got {type(x).__name__}")
    if x.is_complex():
        raise InputError(f"{what} is complex; mixc works on real numbers")
    return x.to(dtype=DTYPE, device=device)


def _given_inputs(
    mixer: Mixer, inputs: dict, device: torch.device, sizes: _Sizes
) -> dict[str, Tensor]:
    """The per-token inputs as given, [B, T, nh, *shape] in float64, their sizes bound."""
    first = inputs[mixer.inputs[0].name]
    raw: dict[str, Tensor] = {}
    for d in mixer.inputs:
        x = _as_float64(inputs[d.name], f"input {d.name}", device)
        if x.dim() != 3 + len(d.shape):
            raise InputError(
                f"input {d.name} should be {_layout(d.shape, 'B, T, NH')}, "
                f"got shape {tuple(x.shape)}"
            )
        if x.shape[:2] != first.shape[:2]:
            raise InputError(
                f"input {d.name} has [B, T] = {list(x.shape[:2])} but "
                f"{mixer.inputs[0].name} has {list(first.shape[:2])}"
            )
        sizes.bind(d.shape, tuple(x.shape[3:]), f"input {d.name}")
        raw[d.name] = x
    return raw


def _given_params(
    mixer: Mixer, params: dict, device: torch.device, sizes: _Sizes
) -> dict[str, Tensor]:
    """The params given, [NH, *shape] in float64, their sizes bound."""
    out: dict[str, Tensor] = {}
    for d in mixer.params:
        if d.name in params:
            x = _as_float64(params[d.name], f"param {d.name}", device)
            if x.dim() != 1 + len(d.shape):
                raise InputError(
                    f"param {d.name} should be {_layout(d.shape, 'NH')}, got shape {tuple(x.shape)}"
                )
            sizes.bind(d.shape, tuple(x.shape[1:]), f"param {d.name}")
            out[d.name] = x
    return out


def _given_states(
    mixer: Mixer, initial_state: dict, device: torch.device, sizes: _Sizes, B: int
) -> dict[str, Tensor]:
    """The initial states given, [B, NH, *shape] in float64, their sizes bound."""
    out: dict[str, Tensor] = {}
    for d in mixer.carried:
        if d.name in initial_state:
            x = _as_float64(initial_state[d.name], f"initial state {d.name}", device)
            if x.dim() != 2 + len(d.shape) or x.shape[0] != B:
                raise InputError(
                    f"initial state {d.name} should be {_layout(d.shape, f'B={B}, NH')}, "
                    f"got shape {tuple(x.shape)}"
                )
            sizes.bind(d.shape, tuple(x.shape[2:]), f"initial state {d.name}")
            out[d.name] = x
    return out


def _head_count(raw: dict, params: dict, initial_state: dict) -> int:
    """The call's number of heads NH: the most any argument has (inputs may have fewer)."""
    heads = [x.shape[2] for x in raw.values()]
    heads += [x.shape[0] for x in params.values()]
    heads += [x.shape[1] for x in initial_state.values()]
    NH = max(heads)
    if NH < 1:
        raise InputError("the number of heads is 0")
    return NH


def _spread_heads(mixer: Mixer, raw: dict, sizes: _Sizes, NH: int) -> dict[str, Tensor]:
    """Per-token inputs as [B, T, NH, rows, cols]: one with nh heads serves NH/nh heads each."""
    xs: dict[str, Tensor] = {}
    for d in mixer.inputs:
        x = raw[d.name]
        B, T, nh = x.shape[:3]
        if nh < 1 or NH % nh:
            raise InputError(
                f"input {d.name} has {nh} heads, which does not divide the {NH} heads of the call"
            )
        r, c = sizes.matrix(d.shape, f"input {d.name}")
        xs[d.name] = x.reshape(B, T, nh, r, c).repeat_interleave(NH // nh, dim=2)
    return xs


def _param_values(
    mixer: Mixer, params: dict, sizes: _Sizes, NH: int, device: torch.device
) -> dict[str, Tensor]:
    """Every param as [1, NH, rows, cols]: as given, or its default with h = 0..NH-1."""
    defaults = _Evaluator(mixer, {}, device, sizes.sizes)
    h = torch.arange(NH, dtype=DTYPE, device=device).reshape(1, NH, 1, 1)
    out: dict[str, Tensor] = {}
    for p in mixer.params:
        r, c = sizes.matrix(p.shape, f"param {p.name}")
        if p.name in params:
            x = params[p.name]
            if x.shape[0] != NH:
                raise InputError(f"param {p.name} has {x.shape[0]} heads, the call has {NH}")
            out[p.name] = x.reshape(1, NH, r, c)
        else:
            channel = torch.arange(r, dtype=DTYPE, device=device).reshape(1, 1, r, 1)
            value = defaults.eval(p.default, {"h": h, CHANNEL: channel})
            out[p.name] = value.expand(1, NH, r, c)
    return out


def _start_states(
    mixer: Mixer, initial_state: dict, sizes: _Sizes, B: int, NH: int, device: torch.device
) -> dict[str, Tensor]:
    """Every state (and lagged input) before the first token as [B, NH, rows, cols]: as given,
    or zeros."""
    out: dict[str, Tensor] = {}
    for s in mixer.carried:
        r, c = sizes.matrix(s.shape, f"state {s.name}")
        if s.name in initial_state:
            x = initial_state[s.name]
            if x.shape[1] != NH:
                raise InputError(
                    f"initial state {s.name} has {x.shape[1]} heads, the call has {NH}"
                )
            out[s.name] = x.reshape(B, NH, r, c)
        else:
            out[s.name] = torch.zeros(B, NH, r, c, dtype=DTYPE, device=device)
    return out


def _output_buffers(
    spec: Spec, sizes: _Sizes, B: int, T: int, NH: int, device: torch.device
) -> dict[str, Tensor]:
    """An empty [B, T, NH, rows, cols] for every equation whose target is not a state."""
    states = {s.name for s in spec.mixer.states}
    out: dict[str, Tensor] = {}
    for eq in spec.mixer.equations:
        if eq.target not in states:
            r, c = sizes.matrix(spec.shapes[eq.target], f"{eq.target}_t")
            out[eq.target] = torch.empty(B, T, NH, r, c, dtype=DTYPE, device=device)
    return out


# ----------------------------------------------------------------------------- the steps


def _run(
    evaluator: _Evaluator,
    order: tuple[Equation, ...],
    xs: dict[str, Tensor],
    outputs: dict[str, Tensor],
    B: int,
    T: int,
    NH: int,
) -> None:
    """Every time step: the equations in `order` (the verifier's dependency order), then outputs
    stored and states advanced (evaluator.prev ends holding the final states)."""
    shapes = {n: x.shape[-2:] for n, x in (*evaluator.prev.items(), *outputs.items())}
    lagged = [d.name for d in evaluator.mixer.lagged]
    backward = set(evaluator.mixer.backward)
    # the backward states first, from the last token (each token's values kept), then the rest
    ahead = _run_backward(evaluator, order, xs, shapes, (B, T, NH)) if backward else []
    for t in range(T):
        evaluator.now = {name: x[:, t] for name, x in xs.items()}
        if POSITION in evaluator.prev:  # the carried position is this token's
            evaluator.now[POSITION] = evaluator.prev[POSITION]
        evaluator.earlier = {name: evaluator.prev[f"{name}_{{t-1}}"] for name in lagged}
        if backward:
            evaluator.now.update(ahead[t])
            evaluator.next = ahead[t + 1]
        for eq in order:
            if eq.target not in backward:
                evaluator.now[eq.target] = _value(evaluator, eq, shapes, B, NH)
        for eq in order:
            if eq.target in outputs:
                outputs[eq.target][:, t] = evaluator.now[eq.target]
            elif eq.target not in backward:
                evaluator.prev[eq.target] = evaluator.now[eq.target]
        for name in lagged:
            evaluator.prev[f"{name}_{{t-1}}"] = evaluator.now[name]
        if POSITION in evaluator.prev:
            evaluator.prev[POSITION] = evaluator.now[POSITION] + 1
    for name in backward:  # a backward state's final state is its value at the first token
        evaluator.prev[name] = ahead[0][name]


def _value(evaluator: _Evaluator, eq: Equation, shapes: dict, B: int, NH: int) -> Tensor:
    """The value of one equation at the current token, [B, NH, rows, cols]."""
    r, c = shapes[eq.target]
    value = evaluator.eval(eq.value, {})
    if isinstance(value, _Sized):
        value = value.at(r)
    if value.shape[-2:] not in ((r, c), (1, 1)):
        raise MixcError(f"{eq.target}_t came out {tuple(value.shape[-2:])}, expected {(r, c)}")
    return value.expand(B, NH, r, c)


def _run_backward(
    evaluator: _Evaluator,
    order: tuple[Equation, ...],
    xs: dict[str, Tensor],
    shapes: dict,
    sizes: tuple[int, int, int],
) -> list[dict[str, Tensor]]:
    """The backward states (`G_t = f(G_{t+1}, ...)`) from the last token to the first, from
    their initial states (after the last token): their values at each token t, then (at T)
    the initial states. Evaluates only the equations they need (their updates and the
    per-token values those read)."""
    B, T, NH = sizes
    mixer = evaluator.mixer
    by_target = {eq.target: eq for eq in order}
    needed, todo = set(mixer.backward), list(mixer.backward)
    while todo:
        for name in _lag0_reads(mixer, by_target[todo.pop()].value):
            if name in by_target and name not in needed and mixer.state(name) is None:
                needed.add(name)
                todo.append(name)
    current = {name: evaluator.prev[name] for name in mixer.backward}
    ahead = [current]
    for t in reversed(range(T)):
        evaluator.now = {name: x[:, t] for name, x in xs.items()}
        evaluator.next = current
        for eq in order:
            if eq.target in needed:
                evaluator.now[eq.target] = _value(evaluator, eq, shapes, B, NH)
        current = {name: evaluator.now[name] for name in mixer.backward}
        ahead.append(current)
    return ahead[::-1]


def _unpack(x: Tensor, lead: int, ndim: int) -> Tensor:
    """[..., r, c] -> [..., *shape]: a scalar loses both matrix dims, a vector one."""
    if ndim == 0:
        return x.reshape(x.shape[:lead])
    return x.flatten(lead) if ndim == 1 else x


def _rank(shape: tuple[str, str]) -> int:
    """Of a verifier shape: 0 for (1, 1), 1 for (n, 1) or (1, n), 2 for (m, n)."""
    return 2 - shape.count("1")
