"""How a chunked kernel is called: eagerly, or under torch.compile as one opaque operator.

Traced by torch.compile, a kernel's loops over spans and chunks unroll into graphs of thousands
of nodes (minutes to compile). A generated module therefore registers its kernels as custom
operators (torch.library) when it is imported (_register_spans, _register_calls) and, while
torch.compile traces it, each kernel call is one operator call, with a fake (shape)
implementation and an autograd formula. Eager calls never go through the operators.

Two entries, one per kind of kernel:

- _own_backward, for the kernels with their own backward (common._OwnBackward): the operator
  `spans` runs the spans' forward keeping what the backward needs (each kind of kept tensor
  joined over the spans, chunk-major), returns it beside the outputs, and its autograd formula
  calls the operator `spans_backward`, which runs the kernel's own backward from it. The shapes
  of the kept tensors come from running the span function on one chunk of fake tensors.
- _opaque_call, for the other kernels: the operator `call` runs the kernel without autograd,
  its fake runs it on fake tensors (of fixed sizes: its loops need whole numbers), and
  `call_backward` gives the gradients. A kernel that goes through autograd is run again there
  under autograd (recomputation). A kernel with a backward of its own from what its forward
  keeps (the elementwise kernel: the state entering each span) keeps it, among the outputs
  of `call` after the kernel's own, and `call_backward` runs that backward; eagerly such a
  kernel runs as _KeptBackward, so compiled and eager do the same work.

A rotation of a vector by angles is the operator `rotate` of rotations.py.

Limits: a compiled graph has no double backward through these operators (eager kernels do),
and a new sequence length compiles the graph again (the kernels' loops are fixed by it).

The operators find the kernel's functions by name in the module that registered them (the
names of its own functions, never text from a caller). Their namespace, `mixc_` and a hash of
the module's kernel text, is the same for modules that carry the same kernels, which then share
the operators: importing a module again, or another with the same kernels, registers nothing.
Every tensor an operator returns is fresh, and laid out as its fake says: the outputs o
[B, NH, T, V] as transposed views of [B, T, NH, V] tensors (the callers' layout), every other
one contiguous.
"""

import torch

from mixc.backends.pytorch.kernels.common import (
    _chunk_size_for,
    _fresh_copy,
    _guarded_spans,
    _needs_grad,
    _OwnBackward,
    _span_tokens,
    _spans_backward,
    _spans_keeping,
)


class _Operators:
    """The operators of this module's kernels once registered (_register_spans,
    _register_calls; its rotations: _register_rotations; a sum of angles: _register_angle_sums),
    else None: its kernels are then traced like any other code. slots: how many tensors an
    operator takes (a kernel's sequences and its initial state, None where absent).
    own_outputs: how many outputs a kernel with a backward of its own returns (o, final state),
    which the operator `call` returns before what it kept. shapes: what the fake
    implementations found by running a kernel on fake tensors, by call (_found_once)."""

    slots = 7
    own_outputs = 2
    spans = None
    call = None
    rotate = None
    angle_sums = None
    shapes = {}  # noqa: RUF012 - one cache for the module, filled by _found_once


def _slots(tensors):
    """The tensors padded with None to _Operators.slots."""
    return [*tensors, *[None] * (_Operators.slots - len(tensors))]


def _with_bound(span_fn, gk_min, order=0):
    """span_fn (or a gradient function), given the lower bound of its log-gate (gk_min) where
    there is one, and the order of its tokens where not the plain one (order: 1 reverse, a
    state that runs backward in time; 2 strict, a state read before the token's update; 4
    decayed, with strict: after the token's decay, before its write)."""
    given = {} if gk_min is None else {"gk_min": gk_min}
    given |= {"reverse": True} if order & 1 else {}
    given |= {"strict": True} if order & 2 else {}
    given |= {"decayed": True} if order & 4 else {}
    if not given:
        return span_fn

    def span(*chunks_and_state):
        return span_fn(*chunks_and_state, **given)

    return span


def _own_backward(
    span_fn, grads_fn, gate, chunk_size, initial_state, seqs, gk_min=None, strided=(), order=0
):
    """A chunked kernel with its own backward, over seqs [q, k, v, ...] (None entries allowed):
    span_fn and grads_fn as _OwnBackward takes them, gate the index in seqs of the log-gate,
    gk_min a lower bound of the log-gate that span_fn takes (None: none), strided the inputs
    span_fn may get as strided views without autograd (_over_spans), order the order of the
    tokens that span_fn and grads_fn take (_with_bound; reverse: the spans run from the last).
    Returns (o [B, NH, T, V], final state [B, NH, K, V]).

    Under autograd it runs as _OwnBackward, else as guarded spans; under torch.compile, in a
    module that registered its operators, as the operator `spans` (see this file's docstring).
    """
    if _Operators.spans is not None and torch.compiler.is_compiling():
        keep = _needs_grad(initial_state, *seqs)
        outs = _Operators.spans(
            span_fn.__name__, grads_fn.__name__, gate, *_slots([initial_state, *seqs]),
            chunk_size, gk_min, sum(1 << i for i in strided), order, keep,
        )  # fmt: skip
        return outs[0], outs[1]
    span, reverse = _with_bound(span_fn, gk_min, order), bool(order & 1)
    if _needs_grad(initial_state, *seqs):
        grads = _with_bound(grads_fn, None, order)
        # a _Turned (a rotated q or k) goes in as its x, which takes the gradient, beside it
        turned = [None if x is None or isinstance(x, torch.Tensor) else x for x in seqs]
        xs = _distinct([x if t is None else t.x for x, t in zip(seqs, turned)])
        fns = (span, grads, turned)
        return _OwnBackward.apply(fns, gate, chunk_size, reverse, initial_state, *xs)
    (o,), state, _ = _guarded_spans(
        span, seqs, initial_state, chunk_size, strided=strided, reverse=reverse
    )
    return o, state


def _opaque_call(kernel, tensors, chunk_size, backward=None):
    """kernel(*tensors, chunk_size): a kernel without its own backward (backward None) goes
    through autograd; one with a backward of its own from what it keeps, kernel(*tensors,
    chunk_size, kept) and backward(tensors, chunk_size, kept, d_outs, wanted), runs under
    autograd as _KeptBackward. Under torch.compile, in a module that registered its operators,
    either is the operator `call` (see this file's docstring); in one that did not, the kernel
    is traced through autograd as it runs (torch.compile traces no backward of a Function that
    runs autograd itself, as the elementwise kernel's does)."""
    if _Operators.call is not None and torch.compiler.is_compiling():
        keep = backward is not None and _needs_grad(*tensors)
        name = "" if backward is None else backward.__name__
        found = _Operators.call(kernel.__name__, name, *_slots(tensors), chunk_size, keep)
        return tuple(found if backward is None else found[: _Operators.own_outputs])
    if backward is not None and _needs_grad(*tensors) and not torch.compiler.is_compiling():
        return _KeptBackward.apply(kernel, backward, chunk_size, *tensors)
    return kernel(*tensors, chunk_size)


def _distinct(tensors):
    """The tensors, under torch.compile each one that comes again (dplr_value's k, its key and
    its erase key) as a view of it: torch.compile traces no autograd.Function that takes one
    tensor twice. Eagerly they are as given (a view costs a node of autograd's graph)."""
    if not torch.compiler.is_compiling():
        return tensors
    return [x if x is None or not any(x is y for y in tensors[:i]) else x.view_as(x)
            for i, x in enumerate(tensors)]  # fmt: skip


class _KeptBackward(torch.autograd.Function):
    """A kernel with a backward of its own from what its forward keeps (_opaque_call), under
    autograd: the kernel runs without autograd, keeping, and the backward takes the gradients
    from what it kept. A graph of the backward asked for (double backward) runs the kernel
    again through autograd instead (what it kept was made without one)."""

    @staticmethod
    def forward(ctx, kernel, backward, chunk_size, *tensors):
        kept = []
        outs = kernel(*tensors, chunk_size, kept)
        ctx.save_for_backward(*tensors, *kept)
        ctx.fns, ctx.chunk_size, ctx.n_tensors = (kernel, backward), chunk_size, len(tensors)
        return outs

    @staticmethod
    def backward(ctx, *d_outs):
        saved = ctx.saved_tensors
        tensors, kept = saved[: ctx.n_tensors], list(saved[ctx.n_tensors :])
        wanted = list(ctx.needs_input_grad[3:])
        if torch.is_grad_enabled():
            outs = ctx.fns[0](*tensors, ctx.chunk_size)
            pairs = [(o, d) for o, d in zip(outs, d_outs) if d is not None and o.requires_grad]
            wrt = [x for x, w in zip(tensors, wanted) if w]
            found = iter(
                torch.autograd.grad(
                    [o for o, _ in pairs], wrt, [d for _, d in pairs],
                    create_graph=True, allow_unused=True,
                )
            )  # fmt: skip
            grads = [next(found) if w else None for w in wanted]
        else:
            grads = ctx.fns[1](list(tensors), ctx.chunk_size, kept, list(d_outs), wanted)
        return None, None, None, *grads


def _callers_layout(o):
    """o [B, NH, T, V] as a fresh transposed view of a contiguous [B, T, NH, V] tensor."""
    return o.transpose(1, 2).contiguous().transpose(1, 2)


def _fresh(x, inputs):
    """x with the strides of a new contiguous tensor (those of the fakes: contiguous() keeps
    other strides on axes of size 1), and not one of the inputs (an operator's outputs may not
    alias them)."""
    strides, step = [], 1
    for n in reversed(x.shape):
        strides.insert(0, step)
        step *= max(n, 1)
    if x.stride() == tuple(strides) and not any(x is t for t in inputs):
        return x
    return _fresh_copy(x)


def _like(d, x, inputs):
    """The gradient d of x laid out as torch.empty_like(x), as the fakes say (for an input that
    is a transposed view of the callers' layout, so is its gradient: what the caller's own
    gradients, computed from it, expect), and not one of the inputs."""
    target = torch.empty_like(x)
    if d.stride() == target.stride() and not any(d is t for t in inputs):
        return d
    return target.copy_(d)


def _found_once(key, tensors, find):
    """The sizes and dtypes [(shape, dtype), ...] that find() gives (from running a kernel on
    fake tensors: hundreds of operations), once per key and sizes, dtypes and devices of the
    tensors: the compiler asks a fake implementation the same question several times per call
    (tracing, autograd, partitioning, lowering). Symbolic sizes are never kept."""
    described = [None if x is None else (tuple(x.shape), x.dtype, x.device) for x in tensors]
    if not all(type(n) is int for d in described if d is not None for n in d[0]):
        return find()
    key = (*key, *described)
    if key not in _Operators.shapes:
        _Operators.shapes[key] = find()
    return _Operators.shapes[key]


def _split_tensors(span_fn, tensors, gate):
    """(initial state, seqs) from an operator's tensors: as many seqs as span_fn takes before
    (state, kept, guard) and its keyword parameters; for a span_fn of any number of seqs (a
    rank kernel's writes), up to its log-gate, the last (`gate`: its index in seqs)."""
    code = span_fn.__code__
    n_seqs = code.co_argcount - len(span_fn.__defaults__ or ()) - 3
    if code.co_flags & 0x04:  # *args (inspect.CO_VARARGS): the slots after the gate are padding
        n_seqs = gate + 1
    return tensors[0], list(tensors[1 : 1 + n_seqs])


def _kept_per_span(seqs, chunk_size):
    """How many chunks each span of _over_spans holds, the chunks' count and their size (whole
    numbers: under torch.compile the length is fixed, a new one compiles again)."""
    length = int(seqs[0].shape[2])
    size = _chunk_size_for(int(chunk_size), length)
    return int(_span_tokens(seqs[0], seqs[2], size)) // size, -(-length // size), size


def _spans_forward(fn, gate, tensors, chunk_size, gk_min, strided, order, keep):
    """The operator `spans`: [o, final state, *kept] (kept: each kind of kept tensor of every
    span joined chunk-major [N, B, NH, ...], in time order, only if `keep`)."""
    initial_state, seqs = _split_tensors(fn, tensors, gate)
    span, reverse = _with_bound(fn, gk_min, order), bool(order & 1)
    with torch.no_grad():
        if keep:
            o, state, kept, _ = _spans_keeping(span, seqs, initial_state, chunk_size, None, reverse)
            kept = [torch.cat(kind[::-1] if reverse else kind) for kind in zip(*kept)]
        else:
            (o,), state, _ = _guarded_spans(
                span, seqs, initial_state, chunk_size, strided=strided, reverse=reverse
            )
            kept = []
    inputs = [t for t in tensors if t is not None]
    return [_callers_layout(o), _fresh(state, inputs), *[_fresh(x, inputs) for x in kept]]


def _spans_fake(fn, gate, tensors, chunk_size, gk_min, order, keep):
    """The shapes of the operator `spans`: o and the state from the inputs, the kept tensors
    from one chunk of span_fn on fake tensors (their leading axis then the chunks' count)."""
    initial_state, seqs = _split_tensors(fn, tensors, gate)
    q, v = seqs[0], seqs[2]
    batch, heads, length = q.shape[:3]
    width = v.shape[-1] if initial_state is None else initial_state.shape[-1]  # V (not rank V)
    # K (not m K: the rank kernel's m queries a token come joined, its outputs too)
    keys = q.shape[-1] if initial_state is None else initial_state.shape[-2]
    o = q.new_empty(batch, length, heads, q.shape[-1] // keys * width).transpose(1, 2)
    state = q.new_empty(batch, heads, keys, width)
    if not keep:
        return [o, state]
    _, n_chunks, size = _kept_per_span(seqs, chunk_size)
    chunk = [None if x is None else x.new_empty(1, *x.shape[:2], size, *x.shape[3:]) for x in seqs]

    def find():
        kept = []
        start = state if initial_state is None else initial_state
        _with_bound(fn, gk_min, order)(*chunk, start, kept, True)
        return [(x.shape[1:], x.dtype) for x in kept[0]]

    kept = _found_once((fn.__name__, gk_min, order, size), [initial_state, *chunk], find)
    return [o, state, *[q.new_empty(n_chunks, *shape, dtype=dtype) for shape, dtype in kept]]


def _spans_gradients(fns, tensors, chunk_size, gk_min, order, kept, d_o, d_state, wanted):
    """The operator `spans_backward`: the gradients of the wanted tensors (initial state, then
    seqs) by the kernel's own backward, from the kept tensors of `spans`."""
    initial_state, seqs = _split_tensors(fns[0], tensors, fns[2])
    per_span, _, _ = _kept_per_span(seqs, chunk_size)
    # _spans_backward takes the kept tensors span after span, as _spans_keeping made them
    own = list(zip(*[kind.split(per_span) for kind in kept]))
    flat = [x for span in (own[::-1] if order & 1 else own) for x in span]
    gate_grad = wanted[1 + fns[2]]
    with torch.no_grad():
        grads, d_initial = _spans_backward(
            _with_bound(fns[0], gk_min, order), _with_bound(fns[1], None, order), seqs,
            initial_state, flat, len(kept), chunk_size, d_o, d_state, gate_grad, True,
            bool(order & 1),
        )  # fmt: skip
    grads = [d_initial, *[None if d is None else d.reshape(x.shape) for d, x in zip(grads, seqs)]]
    grads += [None] * (len(tensors) - len(grads))
    inputs = [t for t in tensors if t is not None]
    return [_like(d, x, inputs) for d, x, w in zip(grads, tensors, wanted) if w]


def _wanted_like(tensors, wanted):
    """Fake gradients: torch.empty_like each wanted input (see _like)."""
    return [torch.empty_like(x) for x, w in zip(tensors, wanted) if w]


def _define_spans(namespace, functions):
    """Register the operators `spans` and `spans_backward` of `namespace`, over the span and
    gradient functions of the module whose globals are `functions`."""
    slots = ", ".join(f"Tensor? t{i}" for i in range(_Operators.slots))
    head = f"(str span, str grads, int gate, {slots}, SymInt chunk_size, float? gk_min"

    def fns(span, grads, gate):
        return functions[span], functions[grads], gate

    def forward(span, grads, gate, *args):
        *tensors, chunk_size, gk_min, strided, order, keep = args
        strided = tuple(i for i in range(len(tensors)) if strided >> i & 1)
        fn = functions[span]
        return _spans_forward(fn, gate, tensors, chunk_size, gk_min, strided, order, keep)

    def fake(span, grads, gate, *args):
        *tensors, chunk_size, gk_min, _, order, keep = args
        return _spans_fake(functions[span], gate, tensors, chunk_size, gk_min, order, keep)

    def backward(span, grads, gate, *args):
        *tensors, chunk_size, gk_min, order, kept, d_o, d_state, wanted = args
        return _spans_gradients(fns(span, grads, gate), tensors, chunk_size, gk_min, order, kept,
                                d_o, d_state, wanted)  # fmt: skip

    def backward_fake(span, grads, gate, *args):
        return _wanted_like(args[: _Operators.slots], args[-1])

    spans = torch.library.custom_op(f"{namespace}::spans", forward, mutates_args=(),
                                    schema=f"{head}, int strided, int order, bool keep) -> Tensor[]")  # fmt: skip
    spans.register_fake(fake)
    spans_backward = torch.library.custom_op(
        f"{namespace}::spans_backward", backward, mutates_args=(),
        schema=f"{head}, int order, Tensor[] kept, Tensor d_o, Tensor d_state, bool[] wanted) -> Tensor[]",
    )  # fmt: skip
    spans_backward.register_fake(backward_fake)
    spans.register_autograd(_spans_autograd(spans_backward), setup_context=_save_spans)


def _save_spans(ctx, inputs, output):
    """What the autograd formula of `spans` keeps: its arguments and the kept tensors."""
    ctx.arguments = (
        *inputs[:3],
        *inputs[3 + _Operators.slots : 5 + _Operators.slots],
        inputs[-2],
    )  # span, grads, gate, chunk_size, gk_min, order
    ctx.save_for_backward(*inputs[3 : 3 + _Operators.slots], *output[2:])
    ctx.mark_non_differentiable(*output[2:])


def _spans_autograd(spans_backward):
    """The autograd formula of `spans`: the operator `spans_backward`."""

    def backward(ctx, grads):
        saved = ctx.saved_tensors
        tensors, kept = saved[: _Operators.slots], list(saved[_Operators.slots :])
        wanted = list(ctx.needs_input_grad[3 : 3 + _Operators.slots])
        span, grads_name, gate, chunk_size, gk_min, order = ctx.arguments
        d_o, d_state = grads[0], grads[1]
        if d_state is None:
            d_state = torch.zeros_like(saved_state_like(tensors))
        found = iter(spans_backward(span, grads_name, gate, *tensors, chunk_size, gk_min, order,
                                    kept, d_o, d_state, wanted))  # fmt: skip
        out = [next(found) if w else None for w in wanted]
        return None, None, None, *out, None, None, None, None, None

    def saved_state_like(tensors):
        q, v = tensors[1], tensors[3]
        return q.new_empty(*q.shape[:2], q.shape[-1], v.shape[-1])

    return backward


def _call_forward(kernel, tensors, chunk_size, keep=False):
    """The operator `call`: the kernel's outputs, then what it kept for its own backward (only
    if `keep`), run without autograd, each fresh and contiguous."""
    kept = [] if keep else None
    with torch.no_grad():
        outs = kernel(*tensors[: _arity(kernel)], chunk_size, *([kept] if keep else []))
    inputs = [t for t in tensors if t is not None]
    return [_fresh(x, inputs) for x in (*outs, *(kept or []))]


def _fixed(x):
    """A fake tensor like x with whole-number sizes and strides (None stays None)."""
    if x is None:
        return None
    return x.new_empty_strided([int(n) for n in x.shape], [int(n) for n in x.stride()])


def _arity(kernel):
    """How many tensors the kernel takes: its parameters before its chunk size."""
    return kernel.__code__.co_varnames.index("chunk_size")


def _recording():
    """A context in which autograd records inside an operator again. An operator's
    implementation runs with autograd's dispatch keys excluded, so that torch.autograd records
    nothing there (and torch.func.vjp, which would, cannot run checkpoints): this takes them
    out of the excluded keys for the block, autocast's staying excluded."""
    keys = torch._C.DispatchKey
    excluded = torch._C._dispatch_tls_local_exclude_set()
    for key in (keys.AutogradFunctionality, keys.AutogradOther, keys.AutogradNestedTensor):
        excluded = excluded.remove(key)
    return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), excluded)


def _call_gradients(kernel, backward, tensors, chunk_size, kept, d_outs, wanted):
    """The operator `call_backward`: the gradients of the wanted tensors (0 for one the outputs
    do not depend on), by the kernel's own backward from what it kept, or (backward None) the
    kernel run again under autograd."""
    n = _arity(kernel)
    if backward is not None:
        with _recording():
            found = backward(list(tensors[:n]), chunk_size, kept, list(d_outs), wanted[:n])
        found = [d for d, w in zip(found, wanted) if w]
    else:
        with _recording(), torch.enable_grad():
            leaves = [
                None if x is None else x.detach().requires_grad_(w) for x, w in zip(tensors, wanted)
            ]
            outs = kernel(*leaves[:n], chunk_size)
            pairs = [(o, d) for o, d in zip(outs, d_outs) if d is not None and o.requires_grad]
            wrt = [x for x, w in zip(leaves, wanted) if w]
            found = torch.autograd.grad(
                [o for o, _ in pairs], wrt, [d for _, d in pairs], allow_unused=True
            )
    inputs = [t for t in tensors if t is not None]
    wrt = [x for x, w in zip(tensors, wanted) if w]
    return [torch.zeros_like(x) if d is None else _like(d, x, inputs) for d, x in zip(found, wrt)]


def _define_call(namespace, functions):
    """Register the operators `call` and `call_backward` of `namespace`, over the kernels (and
    their own backwards, by name; "": none) of the module whose globals are `functions`."""
    slots = ", ".join(f"Tensor? t{i}" for i in range(_Operators.slots))
    head = f"(str kernel, str backward, {slots}, SymInt chunk_size"

    def forward(kernel, backward, *args):
        *tensors, chunk_size, keep = args
        return _call_forward(functions[kernel], tensors, chunk_size, keep)

    def fake(kernel, backward, *args):
        # the kernel itself on fake tensors: its loops run, but nothing is traced; its loops
        # need whole numbers, so the sizes are fixed (a new size compiles again)
        tensors, chunk_size, keep = [_fixed(x) for x in args[:-2]], int(args[-2]), args[-1]

        def find():
            return [
                (x.shape, x.dtype)
                for x in _call_forward(functions[kernel], tensors, chunk_size, keep)
            ]

        found = _found_once((kernel, chunk_size, keep), tensors, find)
        first = next(x for x in tensors if x is not None)
        return [first.new_empty(shape, dtype=dtype) for shape, dtype in found]

    def gradients(kernel, backward, *args):
        *tensors, chunk_size, kept, d_outs, wanted = args
        own = functions[backward] if backward else None
        return _call_gradients(functions[kernel], own, tensors, chunk_size, kept, d_outs, wanted)

    def gradients_fake(kernel, backward, *args):
        return _wanted_like(args[: _Operators.slots], args[-1])

    call = torch.library.custom_op(
        f"{namespace}::call", forward, mutates_args=(),
        schema=f"{head}, bool keep) -> Tensor[]",
    )  # fmt: skip
    call.register_fake(fake)
    call_backward = torch.library.custom_op(
        f"{namespace}::call_backward", gradients, mutates_args=(),
        schema=f"{head}, Tensor[] kept, Tensor?[] d_outs, bool[] wanted) -> Tensor[]",
    )  # fmt: skip
    call_backward.register_fake(gradients_fake)

    def save(ctx, inputs, output):
        ctx.names, ctx.chunk_size = inputs[:2], inputs[-2]
        ctx.n_outs = _Operators.own_outputs if inputs[1] else len(output)
        ctx.save_for_backward(*inputs[2:-2], *output[ctx.n_outs :])
        ctx.mark_non_differentiable(*output[ctx.n_outs :])

    def formula(ctx, grads):
        saved = ctx.saved_tensors
        tensors, kept = saved[: _Operators.slots], list(saved[_Operators.slots :])
        wanted = list(ctx.needs_input_grad[2:-2])
        d_outs = list(grads[: ctx.n_outs])
        found = iter(call_backward(*ctx.names, *tensors, ctx.chunk_size, kept, d_outs, wanted))
        return None, None, *[next(found) if w else None for w in wanted], None, None

    call.register_autograd(formula, setup_context=save)


def _register_spans(namespace, functions):
    """Register the operators `spans` and `spans_backward` over the span functions among
    `functions` (a module's globals) under `namespace` (`mixc_` and a hash of the kernels'
    text), unless they are registered already (this module imported again, or another with the
    same kernels), and let _own_backward call them under torch.compile from now on. Returns
    the operator `spans`."""
    ops = getattr(torch.ops, namespace)
    if not hasattr(ops, "spans"):
        _define_spans(namespace, functions)
    _Operators.spans = ops.spans
    return ops.spans


def _register_calls(namespace, functions):
    """Register the operators `call` and `call_backward` over the kernels among `functions` (as
    _register_spans does), for _opaque_call."""
    ops = getattr(torch.ops, namespace)
    if not hasattr(ops, "call"):
        _define_call(namespace, functions)
    _Operators.call = ops.call
    return ops.call
