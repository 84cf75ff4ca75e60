"""Hostile arguments to a compiled module: each is refused with a MixcError naming the argument
(or, for an oversized chunk, run at the size the sequence needs), never an AttributeError, a
TypeError from deep inside, a silent conversion or an allocation sized by the request."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mixc
from tests.mixers import positional, spec_inputs

ROOT = Path(__file__).parents[2]


def _module_and_args(name, dtype=torch.float32, T=7):
    spec = mixc.load_spec(ROOT / f"specs/{name}.mix")
    inputs, params = spec_inputs(spec, T=T, dtype=dtype)
    return mixc.load(ROOT / f"specs/{name}.mix"), positional(spec, inputs, params)


@pytest.mark.parametrize("first", [None, [1.0, 2.0]], ids=["None", "list"])
def test_a_first_input_that_is_no_tensor_is_named(first):
    module, args = _module_and_args("gated_retention")
    steps = [a[:, 0] for a in args]
    calls = {
        "chunk": lambda: module.chunk(first, *args[1:]),
        "parallel": lambda: module.parallel(first, *args[1:]),
        "recurrent": lambda: module.recurrent(first, *args[1:]),
        "summary": lambda: module.summary(first, *args[1:]),
        "step": lambda: module.step(first, *steps[1:]),
    }
    for call in calls.values():
        with pytest.raises(mixc.MixcError, match=r"^q: expected a torch\.Tensor, got "):
            call()


@pytest.mark.parametrize("chunk_size", [4.0, None, True, "4"], ids=repr)
def test_a_chunk_size_that_is_no_int_is_named(chunk_size):
    module, args = _module_and_args("gla")
    message = r"chunk_size: expected a power of two \(an int\), got "
    with pytest.raises(mixc.MixcError, match=message + type(chunk_size).__name__):
        module.chunk(*args, chunk_size=chunk_size)
    with pytest.raises(mixc.MixcError, match=message):
        module.summary(*args, chunk_size=chunk_size)
    with pytest.raises(mixc.MixcError, match="chunk_size: expected a power of two, got 12"):
        module.summary(*args, chunk_size=12)


@pytest.mark.parametrize("name", ["gated_retention", "gla", "gated_deltanet"])
def test_a_chunk_longer_than_the_sequence_runs_at_the_sequence_length(name):
    """chunk_size = 2^20 for 13 tokens runs as one chunk of 16 (it tried to allocate 2^40
    scores per head), forward and backward, and so does the summary."""
    module, args = _module_and_args(name, T=13)
    leaves = [a.clone().requires_grad_() for a in args]
    y_big, s_big = module.chunk(*leaves, chunk_size=2**20, output_final_state=True)
    y, s = module.chunk(*args, chunk_size=16, output_final_state=True)
    torch.testing.assert_close(y_big, y)
    torch.testing.assert_close(s_big, s)
    y_big.sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in leaves)
    p_big, f_big = module.summary(*args, chunk_size=2**20)
    p, f = module.summary(*args, chunk_size=16)
    torch.testing.assert_close(p_big, p)
    torch.testing.assert_close(f_big, f)


@pytest.mark.parametrize("other", [torch.float64, torch.bfloat16, torch.float16], ids=str)
def test_inputs_of_mixed_dtypes_are_refused(other):
    module, args = _module_and_args("gated_deltanet")
    mixed = [args[0], args[1].to(other), *args[2:]]
    message = rf"^k: expected torch\.float32 like q \(the inputs share one dtype.*got {other}$"
    for form in (module.chunk, module.recurrent):
        with pytest.raises(mixc.MixcError, match=message):
            form(*mixed)
    with pytest.raises(mixc.MixcError, match=message):
        module.step(*[a[:, 0] for a in mixed])


def test_parameters_may_be_widened_but_not_rounded():
    """A float64 parameter with float32 inputs would be rounded silently: refused, naming it. One
    in a lower precision (a bf16 model's parameter next to float32 inputs) widens exactly."""
    module, args = _module_and_args("mamba2")  # x, dt, B, C, A, D
    with pytest.raises(mixc.MixcError, match=r"^A: a float64 parameter needs float64 inputs"):
        module.chunk(*args[:4], args[4].double(), args[5])
    with pytest.raises(mixc.MixcError, match=r"^D: a float64 parameter needs float64 inputs"):
        module.recurrent(*args[:5], args[5].double())
    narrow = [*args[:4], args[4].to(torch.bfloat16), args[5].to(torch.bfloat16)]
    widened = [*args[:4], narrow[4].float(), narrow[5].float()]
    assert torch.equal(module.chunk(*narrow)[0], module.chunk(*widened)[0])
    module, args = _module_and_args("retnet")
    with pytest.raises(
        mixc.MixcError, match=r"^gamma: expected a tensor of shape \[NH\], got bool"
    ):
        module.chunk(*args, gamma=True)


@pytest.mark.parametrize(
    "inputs,state",
    [
        (torch.float32, torch.bfloat16),
        (torch.bfloat16, torch.bfloat16),
        (torch.float32, torch.float64),
        (torch.float64, torch.float32),
    ],
    ids=str,
)
def test_initial_states_must_be_in_the_dtype_states_are_kept_in(inputs, state):
    """States are float32 (float64 for float64 inputs), as every form returns them: a state in
    another dtype was rounded or widened on the way and is refused, naming it."""
    module, args = _module_and_args("gla", dtype=inputs)
    B, _, NH, K = args[0].shape
    V = args[2].shape[-1]
    given = torch.zeros(B, NH, V, K, dtype=state)
    message = r" H: expected torch\.float(32|64) \(states are float32"
    for form in (module.chunk, module.recurrent):
        with pytest.raises(mixc.MixcError, match="^initial_state" + message):
            form(*args, initial_state=given)
    with pytest.raises(mixc.MixcError, match="^state" + message):  # the step's argument
        module.step(*[a[:, 0] for a in args], state=given)


@pytest.mark.parametrize("name", ["gated_deltanet", "mamba2", "linear_attention_normalized"])
def test_an_empty_batch_runs_in_every_form(name):
    """B = 0: chunk and summary divided by zero (recurrent and parallel ran); every form returns
    empty outputs and final states of the shapes a batch of two has, and gradients flow."""
    module, args = _module_and_args(name, T=5)
    empty = [a[:0].clone().requires_grad_() if a.dim() > 2 else a for a in args]
    n = len(module.INPUTS)
    y_full, s_full = module.recurrent(*args, output_final_state=True)
    s_full = s_full if isinstance(s_full, tuple) else (s_full,)
    states = tuple(s[:0] for s in s_full)
    initial = states if len(states) > 1 else states[0]
    results = {
        form: getattr(module, form)(*empty, initial_state=initial, output_final_state=True)
        for form in ("chunk", "recurrent")
    }
    if "parallel" in module.FORMS:
        results["parallel"] = (module.parallel(*empty)[0], initial)
    for form, (y, s) in results.items():
        assert y.shape == (0, *y_full.shape[1:]), form
        s = s if isinstance(s, tuple) else (s,)
        assert [x.shape for x in s] == [x.shape for x in states], form
        y.sum().backward()
    y, s = module.step(*[a[:, 0] for a in empty[:n]], *empty[n:], state=initial)
    assert y.shape == (0, *y_full.shape[2:])
    p, f = module.summary(*empty)
    p_full, f_full = module.summary(*args)
    assert _shapes(p) == [(0, *x[1:]) for x in _shapes(p_full)]
    assert _shapes(f) == [(0, *x[1:]) for x in _shapes(f_full)]


def _shapes(x):
    return [tuple(t.shape) for t in (x if isinstance(x, tuple) else (x,))]


@pytest.mark.parametrize(
    "axis,message",
    [
        (2, r"^q: expected NH >= 1 in \[B, T, NH, K\], got NH = 0$"),
        (3, r"^q: expected K >= 1 in \[B, T, NH, K\], got K = 0$"),
    ],
    ids=["NH", "K"],
)
def test_zero_heads_or_widths_are_refused_by_every_form(axis, message):
    """NH = 0 divided by zero in every form and K = 0 (or V = 0) failed in a reshape of chunk
    while recurrent ran: every form refuses them alike, naming the argument and the size."""
    module, args = _module_and_args("linear_attention", T=5)
    index = [slice(None)] * axis + [slice(0, 0)]
    zero = [a[tuple(index)] for a in args]
    calls = [module.chunk, module.recurrent, module.parallel, module.summary]
    for call in calls:
        with pytest.raises(mixc.MixcError, match=message):
            call(*zero)
    with pytest.raises(mixc.MixcError, match=message.replace("T, ", "")):
        module.step(*[a[:, 0] for a in zero])
    v_zero = [*args[:2], args[2][..., :0]]
    for call in calls:
        with pytest.raises(mixc.MixcError, match=r"^v: expected V >= 1 in \[B, T, NH, V\], got V"):
            call(*v_zero)


def test_inputs_on_the_meta_device_give_shapes_in_every_form():
    """chunk raised `range() arg 3 must not be zero` where recurrent ran: a span of no chunk
    off the CPU for a sequence shorter than a chunk. Every form now gives the shapes."""
    module, args = _module_and_args("gated_retention", T=5)
    meta = [a.to("meta") for a in args]
    want = module.recurrent(*args, output_final_state=True)
    for form in (module.chunk, module.recurrent):
        y, s = form(*meta, output_final_state=True)
        assert y.device.type == "meta" and (y.shape, s.shape) == (want[0].shape, want[1].shape)
    assert module.parallel(*meta)[0].shape == want[0].shape
    assert [x.shape for x in module.summary(*meta)] == [x.shape for x in module.summary(*args)]


@pytest.mark.parametrize(
    "cu_seqlens,message",
    [
        (
            torch.tensor([False, True, True]),
            r"expected a 1-D integer tensor \[0, end_1, \.\.\., T\], got torch\.bool",
        ),
        (
            torch.tensor([0, 2, 5]).to(torch.complex64),
            r"expected a 1-D integer tensor .*, got torch\.complex64",
        ),
        (torch.tensor([0.0, 2.0, 5.0]), r"expected a 1-D integer tensor .*, got torch\.float32"),
        (torch.tensor([0, 2, 5], device="meta"), r"expected a tensor on cpu \(like the inputs\)"),
    ],
    ids=["bool", "complex", "float", "meta"],
)
def test_cu_seqlens_of_a_wrong_dtype_or_device_is_named(cu_seqlens, message):
    """A bool cu_seqlens was read as offsets [False, True, True]; a complex one raised a
    TypeError in a comparison, a meta one NotImplementedError: each is named, in both forms."""
    module, args = _module_and_args("gla", T=5)
    packed = [a[:1] for a in args]
    for form in (module.chunk, module.recurrent):
        with pytest.raises(mixc.MixcError, match="^cu_seqlens: " + message):
            form(*packed, cu_seqlens=cu_seqlens)


def test_cu_seqlens_on_the_meta_device_is_named():
    """Offsets on the meta device cannot be read: named, not NotImplementedError."""
    module, args = _module_and_args("gla", T=5)
    meta = [a[:1].to("meta") for a in args]
    for form in (module.chunk, module.recurrent):
        with pytest.raises(mixc.MixcError, match=r"^cu_seqlens: a tensor on the meta device"):
            form(*meta, cu_seqlens=torch.tensor([0, 2, 5], device="meta"))


@pytest.mark.parametrize(
    "flag", [torch.tensor([1, 1]), torch.tensor(True), "no", 1, None], ids=repr
)
def test_output_final_state_must_be_a_bool(flag):
    """A tensor of two entries raised `Boolean value of Tensor ... is ambiguous`; "no" was read
    as True: chunk and recurrent take True or False only."""
    module, args = _module_and_args("gla", T=5)
    for form in (module.chunk, module.recurrent):
        with pytest.raises(mixc.MixcError, match=r"^output_final_state: expected True or False"):
            form(*args, output_final_state=flag)
