"""Helpers a compiled module carries where it uses them (copied verbatim by the PyTorch backend).

They check arguments against the module's layout, broadcast shared heads, pick the compute
dtype, and move tensors between the spec layout and the kernels' layout. Only torch is used.
"""

import torch


def _fail(message):
    raise MixcError(message)  # noqa: F821 - defined by the compiled module


def _compute_dtype(dtype):
    """The precision the inputs of this dtype compute in: fp64 stays fp64, everything else runs
    in fp32 (bf16 and fp16 inputs accumulate in fp32); states are kept in it too."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check_tensor(name, x, device):
    if not isinstance(x, torch.Tensor):
        _fail(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        _fail(f"{name}: expected a floating-point tensor, got {x.dtype}")
    if device is not None and x.device != device:
        _fail(
            f"{name}: expected a tensor on {device} (like the first input), got one on {x.device}"
        )


def _output_dtype(layout, first):
    """The dtype of the outputs: the first input's, which every input shares. Checked here, since
    the forms read it before the other arguments are checked."""
    _check_tensor(layout[0][0], first, None)
    return first.dtype


def _empty_batch(x):
    """Whether the first input `x` holds no sequence (B = 0), which some forms answer apart."""
    return isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == 0


def _no_sequences(result):
    """A form's result (a tensor, None, or tuples of them) cut to an empty batch, B = 0."""
    if isinstance(result, tuple):
        return tuple(_no_sequences(x) for x in result)
    return None if result is None else result[:0]


def _check_flag(name, value):
    """A yes-or-no option is True or False: a tensor, a string ("no" is true) or a number is
    refused rather than read by its truth."""
    if not isinstance(value, bool):
        _fail(f"{name}: expected True or False, got {type(value).__name__}")


def _check_chunk_size(chunk_size):
    """A chunk size is a positive power of two, given as an int (a bool or a float is refused
    rather than rounded or read as 1)."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
        _fail(f"chunk_size: expected a power of two (an int), got {type(chunk_size).__name__}")
    if chunk_size < 1 or chunk_size & (chunk_size - 1):
        _fail(f"chunk_size: expected a power of two, got {chunk_size}")


def _bind_size(sizes, symbol, got, name, shape_text):
    """Bind a size symbol of `name`'s shape to `got`, which every argument must agree on. A size
    of 0 is refused but for B (an empty batch) and T (refused with its own message): no form
    computes anything over zero heads or zero-width vectors."""
    if got == 0 and symbol not in ("B", "T"):
        _fail(f"{name}: expected {symbol} >= 1 in {shape_text}, got {symbol} = 0")
    if symbol.isdigit():
        if got != int(symbol):
            _fail(f"{name}: expected size {symbol} in {shape_text}, got {got}")
        return
    want = sizes.setdefault(symbol, got)
    if want != got:
        _fail(
            f"{name}: expected {symbol} = {want} (as in an earlier argument) in {shape_text}, "
            f"got {got}"
        )


def _prepare_inputs(layout, values, sequence):
    """Check per-token inputs and return them as [B, T, NH, rows, cols] in the compute dtype.

    `layout` is ((name, (size, ...)), ...); a vector becomes a column, a scalar 1 x 1.
    `sequence` is False for `step`, whose inputs have no T axis. An input may have NH heads,
    one head, or NH / g heads shared by groups of g consecutive heads.
    """
    device = values[0].device if isinstance(values[0], torch.Tensor) else None
    for (name, _), x in zip(layout, values):
        _check_tensor(name, x, device)
        if x.dtype != values[0].dtype:
            _fail(
                f"{name}: expected {values[0].dtype} like {layout[0][0]} (the inputs share one "
                f"dtype, which the outputs get), got {x.dtype}"
            )
    dtype = _compute_dtype(values[0].dtype)
    lead = ("B", "T", "NH") if sequence else ("B", "NH")
    sizes, heads, out = {}, [], []
    for (name, dims), x in zip(layout, values):
        shape_text = "[" + ", ".join(lead + tuple(dims)) + "]"
        if x.dim() != len(lead) + len(dims):
            _fail(
                f"{name}: expected {len(lead) + len(dims)} dimensions {shape_text}, "
                f"got shape {list(x.shape)}"
            )
        for symbol, got in zip(
            lead[:-1] + tuple(dims), x.shape[: len(lead) - 1] + x.shape[len(lead) :]
        ):
            _bind_size(sizes, symbol, got, name, shape_text)
        heads.append(x.shape[len(lead) - 1])
        if heads[-1] == 0:
            _fail(f"{name}: expected NH >= 1 in {shape_text}, got NH = 0")
    n_heads = max(heads)
    for (name, dims), x, h in zip(layout, values, heads):
        if n_heads % h:
            _fail(f"{name}: {h} heads do not divide the {n_heads} heads of the other inputs")
        x = x.to(dtype)  # before sharing heads: the gradient sums over heads in fp32
        if h != n_heads:
            x = x.repeat_interleave(n_heads // h, dim=len(lead) - 1)
        if not sequence:
            x = x.unsqueeze(1)
        out.append(x[..., :, None] if len(dims) == 1 else x[..., None, None] if not dims else x)
    sizes["NH"] = n_heads
    if not sequence:
        sizes["T"] = 1
    elif sizes["T"] == 0:
        _fail(f"{layout[0][0]}: the sequence is empty (T = 0); every form needs at least one token")
    return out, sizes, dtype


def _prepare_param(name, x, dims, sizes, dtype, device):
    """A per-head parameter [NH] or [NH, d] (or a Python number) as [NH, rows, cols] in the
    compute dtype, from any floating dtype of at most that precision."""
    n_heads = sizes["NH"]
    if not isinstance(x, torch.Tensor):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or dims:
            _fail(
                f"{name}: expected a tensor of shape [NH{''.join(', ' + d for d in dims)}], "
                f"got {type(x).__name__}"
            )
        x = torch.full((n_heads,), float(x), dtype=dtype, device=device)
    _check_tensor(name, x, device)
    if _compute_dtype(x.dtype) == torch.float64 != dtype:
        # a parameter in the compute dtype or below is widened exactly; a float64 one would be
        # rounded without a word
        _fail(f"{name}: a float64 parameter needs float64 inputs (they compute in {dtype})")
    shape_text = "[" + ", ".join(("NH", *tuple(dims))) + "]"
    if x.dim() == 0 and not dims:
        x = x.expand(n_heads)
    if x.dim() != 1 + len(dims) or x.shape[0] not in (1, n_heads):
        _fail(f"{name}: expected shape {shape_text} with NH = {n_heads}, got {list(x.shape)}")
    for symbol, got in zip(dims, x.shape[1:]):
        _bind_size(sizes, symbol, got, name, shape_text)
    x = x.to(dtype).expand(n_heads, *x.shape[1:])
    return x[:, :, None] if len(dims) == 1 else x[:, None, None] if not dims else x


def _prepare_states(layout, given, sizes, dtype, device, batch, argument, wide=()):
    """Initial states (a tensor, or a tuple in declaration order) as [B, NH, rows, cols], or
    zeros; in the compute dtype `dtype`, in which the forms also return them, but for the
    states named in `wide` (those that only feed angles), float64 always (given in float64 or
    `dtype`). `argument` is the name the caller gave them (`initial_state`, or `state` for a
    step), for the errors."""
    n_heads = sizes["NH"]
    if given is not None and len(layout) == 1 and isinstance(given, torch.Tensor):
        given = (given,)
    if given is not None and (not isinstance(given, (tuple, list)) or len(given) != len(layout)):
        names = ", ".join(name for name, _ in layout)
        _fail(
            f"{argument}: expected {len(layout)} tensors ({names}) in a tuple, "
            f"got {type(given).__name__}"
        )
    out = []
    for i, (name, dims) in enumerate(layout):
        full = tuple(sizes[d] if not d.isdigit() else int(d) for d in dims)
        own = torch.float64 if name in wide else dtype
        if given is None:
            x = torch.zeros(batch, n_heads, *full, dtype=own, device=device)
        else:
            x = given[i]
            _check_tensor(f"{argument} {name}", x, device)
            if tuple(x.shape) != (batch, n_heads, *full):
                shape_text = "[" + ", ".join(("B", "NH", *tuple(dims))) + "]"
                _fail(
                    f"{argument} {name}: expected shape {shape_text} = "
                    f"{[batch, n_heads, *full]}, got {list(x.shape)}"
                )
            if x.dtype not in (dtype, own):
                _fail(
                    f"{argument} {name}: expected {own} (states are float32, float64 for "
                    f"float64 inputs; a state of angles float64), got {x.dtype}"
                )
            x = x.to(own)
        out.append(x[..., None] if len(dims) == 1 else x)
    return out


def _seq_vector(x, sizes, cu_seqlens=None):
    """[.., d, 1] broadcast over [B, T, NH] -> the kernels' [B, NH, T, d] (or, for packed
    sequences, [N, NH, longest, d] with zeros after each sequence's end)."""
    x = x.squeeze(-1)  # not x[..., 0]: its backward fills a zero tensor first
    x = x.expand(sizes["B"], sizes["T"], sizes["NH"], x.shape[-1]).transpose(1, 2)
    return x if cu_seqlens is None else _unpack(x, cu_seqlens)


def _seq_scalar(x, sizes, cu_seqlens=None):
    """[.., 1, 1] broadcast over [B, T, NH] -> the kernels' [B, NH, T] (or [N, NH, longest])."""
    x = x.squeeze(-1).squeeze(-1).expand(sizes["B"], sizes["T"], sizes["NH"]).transpose(1, 2)
    return x if cu_seqlens is None else _unpack(x[..., None], cu_seqlens).squeeze(-1)


def _seq_matrix(x, sizes, cu_seqlens=None):
    """[.., V, K] broadcast over [B, T, NH] -> the kernels' [B, NH, T, K, V] (S's layout), with
    axes of 1 where x is the same for every batch entry or every token (or, for packed
    sequences, [N, NH, longest, K, V] with zeros after each sequence's end)."""
    x = x.reshape((1,) * (5 - x.dim()) + tuple(x.shape))
    x = x.expand(x.shape[0], x.shape[1], sizes["NH"], *x.shape[-2:]).permute(0, 2, 1, 4, 3)
    if cu_seqlens is None:
        return x
    x = x.expand(sizes["B"], sizes["NH"], sizes["T"], *x.shape[-2:])
    rows, cols = x.shape[-2:]
    return _unpack(x.reshape(*x.shape[:3], rows * cols), cu_seqlens).unflatten(-1, (rows, cols))


def _seq_factor(x, sizes, cu_seqlens=None):
    """A second factor of a log-gate, in _seq_matrix's layout: for packed sequences one constant
    in time stays so (the first factor is 0 after each sequence's end, so is their product)."""
    y = _seq_matrix(x, sizes)
    return y if cu_seqlens is None or y.shape[2] == 1 else _seq_matrix(x, sizes, cu_seqlens)


def _from_seq(o, cu_seqlens=None):
    """The kernels' [B, NH, T, d] (or packed [N, NH, longest, d]) -> [B, T, NH, d, 1]."""
    if cu_seqlens is not None:
        o = _pack(o, cu_seqlens)
    return o.transpose(1, 2)[..., None]


def _unrecorded(*tensors):
    """Where nothing records this form's operations (no gradient is taken of `tensors`, its
    arguments and initial states, and no compiler traces it): the addresses of their storages,
    which `_spare` keeps out of reach; else None."""
    if torch.compiler.is_compiling():
        return None
    tensors = [x for x in tensors if isinstance(x, torch.Tensor)]
    if torch.is_grad_enabled() and any(x.requires_grad for x in tensors):
        return None
    return {x.untyped_storage().data_ptr() for x in tensors}


def _spare(x, own):
    """x, to take an elementwise result of its own shape in place (out=x), where `own` (from
    `_unrecorded`) says nothing records it and x shares no memory with the arguments nor
    between its own entries (a kernel's fresh output, read once); else None (a fresh result).
    One full-size tensor and one pass of fresh memory less, the same values to the bit."""
    if own is None or x.untyped_storage().data_ptr() in own:
        return None
    return x if all(s or n == 1 for s, n in zip(x.stride(), x.shape)) else None


def _add_skip(base, x, *params, value=1, out=None):
    """base + value x p_1 ... p_n (torch.addcmul, `out=` as _spare allows) for a per-token
    tensor x and per-head parameters p_i broadcast over its tokens: a skip term such as Mamba's
    D x_t. Where autograd records it, the parameters' gradients are summed in float64 (_Skip):
    each sums a product over every token and channel (65,536 of them for 2 sequences of 512
    tokens of 64 channels) whose terms largely cancel, so that in float32 its rounding follows
    the order of the sum, which eager torch and a compiler choose differently."""
    if torch.is_grad_enabled() and any(p.requires_grad for p in params):
        return _Skip.apply(base, x, value, *params)
    return torch.addcmul(base, x, _times(params), value=value, out=out)


def _times(factors):
    """The product of the tensors `factors`, from the first."""
    product = factors[0]
    for factor in factors[1:]:
        product = product * factor
    return product


def _wide_sum(x, shape):
    """x summed to `shape` (as x.sum_to_size(shape)) in float64."""
    lead = x.dim() - len(shape)
    dims = [*range(lead)]
    dims += [lead + i for i, n in enumerate(shape) if n == 1 and x.shape[lead + i] != 1]
    if not dims:
        return x.double()
    return torch.sum(x, dims, keepdim=True, dtype=torch.float64).reshape(shape)


class _Skip(torch.autograd.Function):
    """_add_skip under autograd: the gradient of each parameter is the float64 sum over the
    tokens of the output's gradient times x, times the other parameters, rounded once to the
    parameter's dtype."""

    @staticmethod
    def forward(ctx, base, x, value, *params):
        ctx.save_for_backward(x, *params)
        ctx.value, ctx.base_shape = value, base.shape
        return torch.addcmul(base, x, _times(params), value=value)

    @staticmethod
    def backward(ctx, d):
        x, *params = ctx.saved_tensors
        wanted = ctx.needs_input_grad
        d_base = d.sum_to_size(ctx.base_shape) if wanted[0] else None
        d_x = (d * _times(params) * ctx.value).sum_to_size(x.shape) if wanted[1] else None
        d_params = [None] * len(params)
        if any(wanted[3:]):
            g = _wide_sum(d * x, torch.broadcast_shapes(*(p.shape for p in params)))
            g = g * ctx.value
            for i, p in enumerate(params):
                if wanted[3 + i]:
                    others = [g, *(q.double() for j, q in enumerate(params) if j != i)]
                    d_params[i] = _wide_sum(_times(others), p.shape).to(p.dtype)
        return d_base, d_x, None, *d_params


def _check_cu_seqlens(cu_seqlens, sizes, device):
    """Packed sequences: B = 1 and cu_seqlens = [0, end_1, ..., T], non-decreasing, integers on
    the inputs' device (not on the meta device, where no offsets can be read)."""
    expected = "cu_seqlens: expected a 1-D integer tensor [0, end_1, ..., T]"
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1:
        _fail(expected)
    dtype, where = cu_seqlens.dtype, cu_seqlens.device
    if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
        _fail(f"{expected}, got {dtype}")
    if where != device:
        _fail(f"cu_seqlens: expected a tensor on {device} (like the inputs), got one on {where}")
    if where.type == "meta":
        _fail("cu_seqlens: a tensor on the meta device holds no offsets to split sequences by")
    if sizes["B"] != 1:
        _fail(f"cu_seqlens: packed sequences need B = 1, got B = {sizes['B']}")
    if cu_seqlens.numel() < 2:
        _fail("cu_seqlens: expected at least two entries [0, T]")
    if torch.compiler.is_compiling():
        return cu_seqlens.numel() - 1
    ends = cu_seqlens.tolist()
    decreasing = any(b < a for a, b in zip(ends, ends[1:]))  # noqa: RUF007 (imports only torch)
    if ends[0] != 0 or ends[-1] != sizes["T"] or decreasing:
        _fail(f"cu_seqlens: expected non-decreasing offsets from 0 to T = {sizes['T']}, got {ends}")
    return len(ends) - 1


def _unpack(x, cu_seqlens):
    """[1, NH, T, d] packed -> [N, NH, longest, d], zero-padded after each sequence."""
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    longest = max(int(lengths.max()), 1)
    offsets = torch.arange(longest, device=x.device)
    valid = offsets[None, :] < lengths[:, None]  # [N, longest]
    index = (cu_seqlens[:-1, None] + offsets[None, :]).clamp(max=max(x.shape[2] - 1, 0))
    out = x[0][:, index]  # [NH, N, longest, d]
    out = torch.where(valid[None, :, :, None], out, torch.zeros((), dtype=x.dtype, device=x.device))
    return out.transpose(0, 1)


def _pack(o, cu_seqlens):
    """[N, NH, longest, d] -> [1, NH, T, d], keeping each sequence's tokens in order."""
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    valid = torch.arange(o.shape[2], device=o.device)[None, :] < lengths[:, None]
    return o.transpose(0, 1)[:, valid][None]


def _l2norm(x):
    """x / sqrt(sum(x^2) + 1e-6), over a vector's entries. The sum of squares is the squared
    norm: one fused reduction, where (x * x).sum() wrote x * x first (4x slower on CPU)."""
    norm = torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True)
    return x * torch.rsqrt(norm * norm + 1e-6)


def _log_gate(x):
    """log(x) for a log-gate, reading a decay x in [0, 2^-64) as 2^-64, with the gradient of
    that log (1 / 2^-64), not of the clamp (0).

    At a decay of exactly 0 the log-gate would be -inf, the kernel's gradient for it 0 (a factor
    0 passes nothing on) and the log's gradient 1 / 0: the decay's gradient 0 * inf, where the
    recurrence's is finite. From 2^-64 the kernel's gradient is the decay's gradient times
    2^-64, which the log's gradient divides out again, while an output moves by at most 2^-64
    of a value (below float64's resolution). A negative x keeps its NaN.
    """
    floor = 2.0**-64
    lifted = torch.where((x >= 0) & (x < floor), floor, x)
    return torch.log(x + (lifted - x).detach())


def _check_decay_sign(x, name, decay, state):
    """A decay the caller passes (an input or a parameter) that the spec cannot prove >= 0: the
    chunked forms work with its log, NaN at a negative entry where the recurrence multiplies by
    it, so one is refused. Costs one comparison over `x` and, on an accelerator, one sync per
    call; a decay written provably positive (sigmoid, exp) is never checked. Under
    torch.compile, which cannot branch on a tensor's values, the check is an assertion in the
    graph (a RuntimeError with the same message when the compiled call runs)."""
    message = (
        f"{name}: the decay {decay} of {state} has negative entries, and the chunked forms "
        "(chunk, parallel, summary) work with log(decay); use recurrent() or step(), or "
        "make the decay provably positive in the spec (sigmoid(x), exp(x))"
    )
    if torch.compiler.is_compiling():
        torch._assert_async(~(x < 0).any(), message)
    elif bool((x < 0).any()):
        _fail(message)
