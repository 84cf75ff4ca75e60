"""Under torch.compile the generated modules call each chunked kernel as one opaque operator
(mixc/backends/pytorch/kernels/operators.py): the graph does not grow with the sequence, the
compiled forms match the float64 oracle (outputs, final states and every gradient, by the
fuzzer's bounds) over several spans, the fake implementations give the real shapes and strides
(torch.library.opcheck), and registering the operators again is harmless.

Graphs are captured with the aot_eager backend (graph capture and autograd, no code generation):
the inductor backend adds a C++ compile of the layer's pointwise code, which test_torch_compile
and benchmarks/compile.py cover.
"""

from __future__ import annotations

import inspect
import linecache
import re
from pathlib import Path

import pytest
import torch

import mixc
from mixc.check.tolerance import Result, compare, reference
from tests.mixers import random_states, rel, spec_inputs

ROOT = Path(__file__).parents[2]

#: One spec for each way a kernel runs as an operator: the own backwards (scalar decay, delta
#: rule, key-side diagonal, DPLR with a proven gate bound, scalar decay backward in time and
#: read before the update) through `spans`, the kernels through autograd (full elementwise gate,
#: the stabilised write scale) through `call`.
BY_KERNEL = ["gated_retention", "gated_deltanet", "gla", "rwkv7", "hydra", "mamba1", "mlstm"]


def _namespace(module) -> str:
    text = "".join(linecache.cache[module.__file__][2])
    return re.search(r' = _register_\w+\("(mixc_[0-9a-f]{16})", globals\(\)\)', text)[1]


def _example(name, T=11):
    spec = mixc.load_spec(ROOT / "specs" / f"{name}.mix")
    gen = torch.Generator().manual_seed(0)
    inputs, params = spec_inputs(spec, B=2, T=T, NH=2, generator=gen)
    states = random_states(spec, B=2, NH=2, generator=gen)
    return spec, inputs, params, states


def _compiled_result(module, spec, inputs, params, states, cot_y, cot_states):
    """The compiled chunk form's output, final states and gradients, in float32."""
    leaves = {n: x.detach().float().requires_grad_(True) for n, x in {**inputs, **params}.items()}
    initial = tuple(states[s.name].float().requires_grad_(True) for s in spec.mixer.carried)
    chunk = torch.compile(module.chunk, fullgraph=True, backend="aot_eager")
    y, finals = chunk(
        *leaves.values(), initial_state=initial, output_final_state=True, chunk_size=4
    )
    finals = dict(zip(states, finals if isinstance(finals, tuple) else (finals,), strict=True))
    loss = (y * cot_y.float()).sum() + sum(
        (finals[n] * c.float()).sum() for n, c in cot_states.items()
    )
    names = [*leaves, *states]
    got = torch.autograd.grad(loss, [*leaves.values(), *initial], allow_unused=True)
    grads = {n: None if g is None else g.double() for n, g in zip(names, got, strict=True)}
    return Result(y.detach().double(), {n: f.detach().double() for n, f in finals.items()}, grads)


# BY_KERNEL and the rank kernel reading several queries a token in one pass (its operator's
# output is m V wide); not opchecked below, whose arguments are captured eagerly, where the
# writes are not joined into the operator's seven tensors
@pytest.mark.parametrize("name", [*BY_KERNEL, "mamba3_mimo"])
def test_compiled_chunk_matches_the_oracle_over_several_spans(name, monkeypatch):
    """Spans of two chunks (the kept tensors are joined over the spans and split again), from
    given initial states, every gradient: against the float64 oracle, by the fuzzer's fp32
    bounds."""
    spec, inputs, params, states = _example(name)
    module = mixc.load(ROOT / "specs" / f"{name}.mix")
    monkeypatch.setitem(module.__dict__, "_span_tokens", lambda q, v, chunk_size: 2 * chunk_size)
    if "_span_chunks" in module.__dict__:  # the full elementwise kernel's spans
        monkeypatch.setitem(module.__dict__, "_span_chunks", lambda q, v, chunk_size: 2)
    gen = torch.Generator().manual_seed(1)
    ref0 = reference(spec, inputs, params, states)
    cot_y = torch.randn(ref0.y.shape, generator=gen, dtype=torch.float64)
    cot_states = {
        n: torch.randn(x.shape, generator=gen, dtype=torch.float64) for n, x in states.items()
    }
    ref = reference(spec, inputs, params, states, cot_y, cot_states)
    torch._dynamo.reset()
    got = _compiled_result(module, spec, inputs, params, states, cot_y, cot_states)
    for quantity, (error, bound) in compare(got, ref, torch.float32).items():
        assert error <= bound, (quantity, error, bound)


def _graph_nodes(module, spec, T):
    """The number of nodes of the graph Dynamo captures of the chunk form at length T."""
    inputs, params = spec_inputs(spec, B=1, T=T, NH=2, dtype=torch.float32)
    counts = []

    def counting(gm, example_inputs):
        counts.append(len(gm.graph.nodes))
        return gm

    torch._dynamo.reset()
    torch.compile(module.chunk, fullgraph=True, backend=counting)(
        *inputs.values(), *params.values(), chunk_size=4
    )
    return counts[0]


@pytest.mark.parametrize("name", ["gated_deltanet", "mamba1"])
def test_the_graph_does_not_grow_with_the_sequence(name):
    """Eight chunks or sixty-four: the same graph (the kernel's loops run inside its operator)."""
    spec = mixc.load_spec(ROOT / "specs" / f"{name}.mix")
    module = mixc.load(ROOT / "specs" / f"{name}.mix")
    assert _graph_nodes(module, spec, 32) == _graph_nodes(module, spec, 256)


def _kernel_arguments(name, monkeypatch):
    """The module and the arguments (by name) of its chunk form's first `_own_backward` or
    `_opaque_call`, recorded from an eager call."""
    module = mixc.load(ROOT / "specs" / f"{name}.mix")
    _, inputs, params, _ = _example(name, T=9)
    calls = []
    for entry in {"_own_backward", "_opaque_call"} & module.__dict__.keys():
        signature = inspect.signature(module.__dict__[entry])

        def record(*args, _entry=entry, _signature=signature, **kwargs):
            bound = _signature.bind(*args, **kwargs)
            bound.apply_defaults()
            calls.append((_entry, bound.arguments))
            raise _RecordedError

        monkeypatch.setitem(module.__dict__, entry, record)
    with pytest.raises(_RecordedError):
        module.chunk(*[x.float() for x in (*inputs.values(), *params.values())], chunk_size=4)
    return module, calls[0]


class _RecordedError(Exception):
    """Stops the form once its kernel call is recorded."""


@pytest.mark.parametrize("name", BY_KERNEL)
def test_fake_implementations_agree_with_the_operators(name, monkeypatch):
    """torch.library.opcheck: schema, fake shapes and strides, autograd registration, and the
    operator under AOT dispatch with dynamic shapes."""
    module, (entry, a) = _kernel_arguments(name, monkeypatch)
    ops = getattr(torch.ops, _namespace(module))
    slots = module._Operators.slots

    def leaves(tensors):
        tensors = [*tensors, *[None] * (slots - len(tensors))]
        return [None if x is None else x.detach().requires_grad_(True) for x in tensors]

    if entry == "_own_backward":
        names = (a["span_fn"].__name__, a["grads_fn"].__name__, a["gate"])
        tensors = leaves([a["initial_state"], *a["seqs"]])
        args = (
            *names,
            *tensors,
            a["chunk_size"],
            a["gk_min"],
            sum(1 << i for i in a["strided"]),
            a["order"],
            True,
        )
        torch.library.opcheck(ops.spans, args)
    else:
        tensors, own = leaves(a["tensors"]), a["backward"]
        names = (a["kernel"].__name__, "" if own is None else own.__name__)
        # a kernel with its own backward keeps what it needs (keep True) under autograd
        torch.library.opcheck(ops.call, (*names, *tensors, a["chunk_size"], own is not None))


def test_registering_again_is_harmless():
    """The same module loaded twice, and another with other kernels: each registers (or reuses)
    the operators of its namespace, named by its kernels' text, and compiles."""
    first = mixc.load(ROOT / "specs" / "gated_retention.mix")
    mixc.clear_cache()
    again = mixc.load(ROOT / "specs" / "gated_retention.mix")
    other = mixc.load(ROOT / "specs" / "deltanet.mix")
    assert again is not first and _namespace(again) == _namespace(first)
    assert _namespace(other) != _namespace(first)
    spec = mixc.load_spec(ROOT / "specs" / "gated_retention.mix")
    inputs, params = spec_inputs(spec, B=1, T=8, NH=2, dtype=torch.float32)
    args = [*inputs.values(), *params.values()]
    y_ref = reference(spec, inputs, params).y
    for module in (first, again):
        torch._dynamo.reset()
        y, _ = torch.compile(module.chunk, fullgraph=True, backend="aot_eager")(*args)
        assert rel(y, y_ref) <= 1e-5  # the project's float32 bound against the float64 oracle


def test_the_elementwise_kernel_runs_its_recurrence_once_forward_once_backward(monkeypatch):
    """A forward+backward of the full elementwise kernel makes each span's states twice, in
    place (the forward, then again in its own backward from the state kept entering the span),
    and never through autograd: no checkpoint, compiled or eager (checkpoints made them three
    times eagerly, once more under autograd, and four times in the compiled operator). The
    operators call the kernels of the module that registered them first (another test's, for
    the same kernels), so the in-place spans are counted eagerly, the checkpoints everywhere."""
    _, inputs, params, _ = _example("mamba1", T=11)
    module = mixc.load(ROOT / "specs" / "mamba1.mix")
    monkeypatch.setitem(module.__dict__, "_span_chunks", lambda q, v, chunk_size: 2)
    runs = {"in place": 0, "checkpoints": 0}

    def counted(key, fn):
        def run(*args, **kwargs):
            runs[key] += 1
            return fn(*args, **kwargs)

        return run

    monkeypatch.setitem(
        module.__dict__, "_span_in_place", counted("in place", module._span_in_place)
    )
    monkeypatch.setattr(
        torch.utils.checkpoint,
        "checkpoint",
        counted("checkpoints", torch.utils.checkpoint.checkpoint),
    )
    torch._dynamo.reset()
    for chunk in (module.chunk, torch.compile(module.chunk, fullgraph=True, backend="aot_eager")):
        leaves = [
            x.detach().float().requires_grad_(True) for x in (*inputs.values(), *params.values())
        ]
        y, _ = chunk(*leaves, chunk_size=4)
        y.square().sum().backward()
        assert runs["checkpoints"] == 0
        if chunk is module.chunk:
            assert runs["in place"] == 2 * 2  # 3 chunks of 4 tokens: 2 spans
