"""What the Triton kernels of every class share: block sizes, the device check and strides.

Like the PyTorch kernels, this file's definitions are copied into the generated module (see
``definitions`` in this package), which imports only torch and triton.

Layout and numerics follow the PyTorch kernels (mixc/backends/pytorch/kernels/common.py): q, k
[B, NH, T, K], v [B, NH, T, V], per-token gates [B, NH, T], states [B, NH, K, V], log-gates
g <= 0. The kernels read their inputs through strides, so the transposed and broadcast views the
callers pass are not copied.

Precision: every kernel takes DOT (``_tl_dot_precision``), how its matmuls multiply. Elementwise
arithmetic, gates, decays, the triangular inverses and the states are float32 (float64 for
float64 inputs) whatever the inputs: a 16-bit tile is widened as it is loaded. The products of
the inputs, scores and states (``_tl_dot``) multiply float64 or IEEE float32 operands ("ieee",
the default for float32 inputs), TF32 operands ("tf32", for float32 inputs once
``torch.set_float32_matmul_precision("high")`` or ``"medium"`` allows TF32), or the inputs'
bfloat16 or float16 ("bf16", "fp16", for such inputs, as flash-linear-attention multiplies),
always accumulating in float32 or float64. The sums of gates are scans in float32 (float64)
(``_tl_gate_sums``, ``_tl_run_sums``), and so are the scalar gates' gradients
(``_tl_pair_grads``, ``_tl_gate_grads``): no matmul on gate quantities, none rounded to tensor-core operands.

A kernel is one program's walk over the chunks (its addressing, loads and stores, the state or its
gradient carried in registers); the arithmetic of one chunk is in @triton.jit helpers
(``_tl_<class>_chunk``, ``_tl_<class>_chunk_grad``), which Triton inlines. Without a gate the
kernels pass zeros for the gates: the diagonal kernels then decay by exp(0) = 1, the others'
helpers read them only under HAS_G (the compiler drops what is left unread). A kernel's parameters
are grouped by hand, ``# fmt: skip``: the tensors it reads, those it writes, the sizes, then one
line per tensor's strides (one a line, as the formatter puts them, the dplr backward's would take
57 lines).
"""

import torch
import triton
import triton.language as tl

from mixc.backends.pytorch.kernels.common import _chunk_size_for


def _tl_block(n):
    """A block size for an axis of n entries: the least power of two >= n, and at least 16, the
    smallest operand size of tl.dot on a GPU (the extra entries are masked zeros)."""
    return max(16, triton.next_power_of_2(n))


def _tl_tiles(kernel, dot=None):
    """A program's tile of the state and its launch for `kernel` (a @triton.jit function): (the
    most key rows of the state a program holds, None for all of them; the most value columns;
    warps). The kernels whose key rows are independent (scalar and diagonal decays) split the
    rows in blocks, one program each, as flash-linear-attention's kernels do, and their
    outputs are sums over the key blocks (the diagonal backward in two kernels, diagonal_bwd.py,
    the chunks' gradients 16 key rows a program: its levels of decayed [BT, BK] queries and
    keys are what a program runs short of); the delta
    and DPLR kernels mix the rows (k^T S, a^T S) and hold them all, the delta forward in three
    kernels (the chunks' UT transforms, the pass over the states, the outputs) and its
    backward in five (delta_bwd.py; the chunks' dQ, dK and dW a program per 64 key rows). At
    d_k = d_v = 128 and 64-token chunks these are the tiles that compiled for sm_90 with the
    fewest spills of those tried (benchmarks/gpu_static.py, RESULTS-gpu-static.md). With
    IEEE float32 products (dot "ieee", _tl_dot_precision) a kernel takes its tile of
    _tl_float32_tiles where that table has one (TF32 keeps bfloat16's)."""
    float32 = _tl_float32_tiles(dot)
    if kernel.__name__ in float32:
        return float32[kernel.__name__][:3]
    return {
        "_tl_scalar_decay_fwd": (64, 32, 8),
        "_tl_scalar_decay_bwd_grads": (64, 32, 8),
        "_tl_diagonal_fwd": (64, 32, 8),
        "_tl_diagonal_bwd_states": (64, 32, 4),
        "_tl_diagonal_bwd_grads": (16, 32, 8),
        "_tl_delta_fwd_wy": (None, 32, 4),
        "_tl_delta_fwd_states": (None, 32, 8),
        "_tl_delta_fwd_out": (None, 32, 8),
        "_tl_delta_bwd_local": (None, 32, 4),
        "_tl_delta_bwd_states": (None, 32, 8),
        "_tl_delta_bwd_grads": (64, 32, 8),
        "_tl_delta_bwd_wy": (None, 16, 4),
        "_tl_delta_bwd_gram": (None, 32, 8),
        "_tl_dplr_fwd_scores": (16, 16, 8),
        "_tl_dplr_fwd_states": (None, 32, 8),
        "_tl_dplr_fwd_outputs": (None, 32, 4),
        "_tl_dplr_bwd_states": (None, 32, 8),
        "_tl_dplr_bwd_scores": (None, 16, 8),
        "_tl_dplr_bwd_inputs": (16, 32, 8),
        "_tl_dplr_bwd_gates": (32, 32, 4),
        "_tl_elementwise_fwd": (None, 32, 8),
        "_tl_elementwise_bwd": (None, 32, 8),
    }[kernel.__name__]


def _tl_float32_tiles(dot):
    """The tiles (as _tl_tiles) of the kernels whose float32 products need other tiles than
    bfloat16's, and the parts their products are summed in along the inner dimension (16 or
    32, _tl_ieee_dot); {} for a dot without float32 products. "ieee" (IEEE multiply-adds off
    the tensor cores; float64's too, under the interpreter): each thread holds its rows of a
    and columns of b along a part, so fewer value or key columns (16) or more warps (8; at 16
    the 128-register cap spills more), and parts of 16 where those of 32 still spilled. At
    d_k = d_v = 128 and 64-token chunks, the fewest spills on sm_90 and sm_100 of those tried
    (benchmarks/gpu_static.py): none but in the delta forward's UT transform, DPLR's state
    passes and key-side backward, and on sm_100 DPLR's score kernel (docs/triton.md)."""
    if dot != "ieee":
        return {}
    return {
        "_tl_scalar_decay_fwd": (64, 16, 8, 16),
        "_tl_scalar_decay_bwd_grads": (16, 32, 8, 32),
        "_tl_diagonal_fwd": (32, 16, 8, 32),
        "_tl_diagonal_bwd_grads": (16, 32, 8, 16),
        "_tl_delta_fwd_wy": (None, 16, 8, 32),
        "_tl_delta_fwd_states": (None, 16, 8, 32),
        "_tl_delta_bwd_local": (None, 32, 8, 16),
        "_tl_delta_bwd_states": (None, 16, 8, 32),
        "_tl_delta_bwd_grads": (16, 32, 8, 32),
        "_tl_delta_bwd_wy": (None, 16, 8, 16),
        "_tl_dplr_fwd_states": (None, 16, 8, 32),
        "_tl_dplr_fwd_outputs": (None, 32, 8, 32),
        "_tl_dplr_bwd_inputs": (16, 32, 8, 16),
    }


def _tl_launch(kernel, dot=None):
    """The launch options of `kernel` for products as dot says: its warps (_tl_tiles), one
    pipeline stage (no chunk prefetched: registers, not loads, are what a program runs short
    of), and for a kernel with products (a DOT) its DOT: dot, but "ieee16" (IEEE products in
    parts of 16) where _tl_float32_tiles says so."""
    launch = {"num_warps": _tl_tiles(kernel, dot)[2], "num_stages": 1}
    if "DOT" in kernel.arg_names:
        part = _tl_float32_tiles(dot).get(kernel.__name__, (None, None, None, 32))[3]
        launch["DOT"] = "ieee16" if part == 16 else dot
    return launch


def _tl_dot_precision(x, kernel, operands=None):
    """How kernel's products multiply for inputs of x's dtype (the DOT constexpr), or of the
    dtype `operands` where the caller widened 16-bit inputs to x (a generated module computes
    in float32 whatever its inputs, and passes their dtype): "ieee" for float64, and for
    float32 unless torch's float32 matmul precision allows TF32 ("tf32"); "bf16" and "fp16"
    for those dtypes, the products then rounding their operands to it, as
    flash-linear-attention multiplies 16-bit inputs. Triton's interpreter holds bfloat16 as
    raw 16-bit integers and multiplies those in a bfloat16 tl.dot: there, "bf16 emulated"
    rounds the operands to the nearest bfloat16 and multiplies them in float32 (each product
    exact), as the tensor cores do up to the order of the sums."""
    dtype = x.dtype if operands is None or x.dtype == torch.float64 else operands
    if dtype == torch.bfloat16:
        interpreted = type(kernel).__name__ == "InterpretedFunction"
        return "bf16 emulated" if interpreted else "bf16"
    if dtype == torch.float16:
        return "fp16"
    if dtype == torch.float32 and torch.get_float32_matmul_precision() != "highest":
        return "tf32"
    return "ieee"


def _tl_compute_dtype(x):
    """The dtype of the states, decays and gradients a kernel keeps for inputs like x: float64
    for float64, else float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _tl_sizes(q, v, chunk_size, kernel, dot=None):
    """The launch sizes of `kernel` for q [B, NH, T, K] and v [B, NH, T, V], products as dot
    says: (the chunk, key and value block sizes, the grid (value blocks, B * NH, key blocks),
    the number of chunks). A chunk is chunk_size tokens (capped as the PyTorch kernels cap
    it), at least 16; key rows and value columns go in blocks of at most _tl_tiles(kernel,
    dot), one program each."""
    length, d_k, d_v = q.shape[2], q.shape[3], v.shape[3]
    most_k, most_v, _ = _tl_tiles(kernel, dot)
    block_t = _tl_block(_chunk_size_for(chunk_size, length))
    block_k = _tl_block(d_k) if most_k is None else min(_tl_block(d_k), most_k)
    block_v = min(_tl_block(d_v), most_v)
    grid = (triton.cdiv(d_v, block_v), q.shape[0] * q.shape[1], triton.cdiv(d_k, block_k))
    return block_t, block_k, block_v, grid, triton.cdiv(length, block_t)


def _tl_sum_parts(x, n, dtype):
    """The sum, in dtype and x's layout, of the n parts x [n * B, ...] that n programs wrote
    (x itself for one part)."""
    if n == 1:
        return x.to(dtype)
    parts = x.unflatten(0, (n, -1))
    return torch.sum(parts, 0, dtype=dtype, out=torch.empty_like(parts[0], dtype=dtype))


def _tl_check_device(kernel, x):
    """Refuse to launch `kernel` on a tensor it cannot run on: Triton kernels run on a CUDA
    device, or anywhere under triton's interpreter (TRITON_INTERPRET=1 set before the module
    is imported)."""
    if x.device.type != "cuda" and type(kernel).__name__ != "InterpretedFunction":
        raise RuntimeError(
            f"the Triton kernels of this module run on a CUDA device, got a tensor on {x.device}; "
            "on CPU set TRITON_INTERPRET=1 before importing the module (triton's interpreter), "
            "or compile the spec with the PyTorch backend"
        )


def _tl_strides(x, n):
    """The first n strides of x (a per-token gate of None: zeros, never read)."""
    return (0,) * n if x is None else tuple(x.stride())[:n]


def _tl_new_like_callers(x, d, parts=1):
    """An output [parts * B, NH, T, d] for inputs like x [B, NH, T, ...], as a view of a
    [parts * B, T, NH, d] tensor: the callers' layout, so that their transpose back is
    contiguous. One part: in x's dtype; more (one per key block, summed after the launch): in
    _tl_compute_dtype(x)."""
    batch, heads, length = x.shape[:3]
    dtype = x.dtype if parts == 1 else _tl_compute_dtype(x)
    out = torch.empty(parts * batch, length, heads, d, dtype=dtype, device=x.device)
    return out.transpose(1, 2)


def _tl_outputs(q, v, initial_state, n_chunks, keep, n_k=1):
    """What a forward launch writes, for q [B, NH, T, K] and v [B, NH, T, V]: (the initial state
    [B, NH, K, V], zeros if None, in q's dtype and contiguous; o (_tl_new_like_callers), one
    part per key block of n_k; the final state; the states entering each chunk
    [B, NH, N, K, V] if keep, else the final state, an argument the kernel never writes)."""
    batch, heads, _, d_k = q.shape
    d_v = v.shape[-1]
    dtype = _tl_compute_dtype(q)
    if initial_state is None:
        initial_state = q.new_zeros(batch, heads, d_k, d_v, dtype=dtype)
    initial_state = initial_state.to(dtype).contiguous()
    final = torch.empty_like(initial_state)
    kept = q.new_empty(batch, heads, n_chunks, d_k, d_v, dtype=dtype) if keep else final
    return initial_state, _tl_new_like_callers(q, d_v, n_k), final, kept


def _tl_gradients(q, v, d_o, d_final, n_v, n_k=1):
    """What a backward launch reads and writes: (d_o in q's dtype; the gradient of the final
    state, zeros if None, contiguous; dq and dk, one part per value block [NV, B, NH, T, K]; dv,
    one part per key block [n_k * B, NH, T, V]; the gradient of the initial state), the
    gradients in _tl_compute_dtype(q)."""
    batch, heads, length, d_k = q.shape
    d_v = v.shape[-1]
    dtype = _tl_compute_dtype(q)
    if d_final is None:
        d_final = q.new_zeros(batch, heads, d_k, d_v, dtype=dtype)
    d_final = d_final.to(dtype).contiguous()
    dq = q.new_empty(n_v, batch, heads, length, d_k, dtype=dtype)
    dk = q.new_empty(n_v, batch, heads, length, d_k, dtype=dtype)
    dv = q.new_empty(n_k * batch, heads, length, d_v, dtype=dtype)
    return d_o.to(q.dtype), d_final, dq, dk, dv, torch.empty_like(d_final)


def _tl_levels(block_t):
    """The levels of blocks inside a chunk of block_t (a power of two) tokens: log2(block_t)."""
    return block_t.bit_length() - 1


@triton.jit
def _tl_dot(a, b, DOT: tl.constexpr):
    """a @ b, accumulated in float32 (float64 for float64 operands), its products as DOT says
    (see the module's docstring): "bf16" and "fp16" round the operands to that dtype."""
    if DOT == "bf16":
        product = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), out_dtype=tl.float32)
    elif DOT == "bf16 emulated":
        product = tl.dot(_tl_round_bf16(a), _tl_round_bf16(b), input_precision="ieee")
    elif DOT == "fp16":
        product = tl.dot(a.to(tl.float16), b.to(tl.float16), out_dtype=tl.float32)
    elif DOT == "tf32":
        product = tl.dot(a, b, input_precision="tf32")
    elif DOT == "ieee16":
        product = _tl_ieee_dot(a, b, 16, None)
    else:
        product = _tl_ieee_dot(a, b, 32, None)
    return product


@triton.jit
def _tl_halves(a, b):
    """(a's even and odd columns, b's even and odd rows) for a [..., M, K] and b [..., K, N]
    (one batch axis at most): a @ b is the sum of the two halves' products."""
    if len(a.shape) == 2:
        a = tl.reshape(a, (a.shape[0], a.shape[1] // 2, 2))
        b = tl.permute(tl.reshape(b, (b.shape[0] // 2, 2, b.shape[1])), (0, 2, 1))
    else:
        a = tl.reshape(a, (a.shape[0], a.shape[1], a.shape[2] // 2, 2))
        b = tl.reshape(b, (b.shape[0], b.shape[1] // 2, 2, b.shape[2]))
        b = tl.permute(b, (0, 1, 3, 2))
    a_even, a_odd = tl.split(a)
    b_even, b_odd = tl.split(b)
    return a_even, a_odd, b_even, b_odd


@triton.jit
def _tl_ieee_dot(a, b, PART: tl.constexpr, acc):
    """a @ b (+ acc, unless None) in IEEE float32 (float64): plain multiply-adds, each thread
    holding its rows of a and columns of b along the whole inner dimension K of a tl.dot. So
    the product is a sum of products of at most PART along K (a power of two: the even and odd
    columns by halves, _tl_halves, into one accumulator); whole, ptxas spilled tens of
    kilobytes of the kernels' registers (docs/triton.md)."""
    if a.shape[len(a.shape) - 1] > PART:
        a_even, a_odd, b_even, b_odd = _tl_halves(a, b)
        acc = _tl_ieee_dot(a_odd, b_odd, PART, _tl_ieee_dot(a_even, b_even, PART, acc))
    elif acc is None:
        acc = tl.dot(a, b, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc, input_precision="ieee")
    return acc


@triton.jit
def _tl_wide_dot(a, b, DOT: tl.constexpr):
    """a @ b at about float32's accuracy whatever DOT, for the products whose operands are
    gradients that later sums cancel (the delta rule's solve): IEEE float32 (float64) for
    "ieee" and under the interpreter, else three TF32 passes ("tf32x3"), never operands
    rounded to 16 bits."""
    if DOT == "ieee":
        product = _tl_ieee_dot(a, b, 32, None)
    elif DOT == "ieee16":
        product = _tl_ieee_dot(a, b, 16, None)
    elif DOT == "bf16 emulated":
        product = tl.dot(a, b, input_precision="ieee")
    else:
        product = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="tf32x3")
    return product


@triton.jit
def _tl_operand(x, DOT: tl.constexpr):
    """A tile of the inputs as the products take it: rounded to the 16-bit dtype of a 16-bit
    DOT once, as it is loaded (half the registers of float32, and the same operand in every
    product and every elementwise use), held in float32 under the interpreter ("bf16
    emulated"); as it is otherwise."""
    if DOT == "bf16":
        x = x.to(tl.bfloat16)
    elif DOT == "bf16 emulated":
        x = _tl_round_bf16(x)
    elif DOT == "fp16":
        x = x.to(tl.float16)
    return x


@triton.jit
def _tl_split_dot(a, b, DOT: tl.constexpr):
    """a @ b for an a exact in DOT's 16-bit dtype (a 16-bit input) and a float32 b, at about
    float32's accuracy: for bfloat16 operands b is the sum of two bfloat16 parts (16 bits of its
    mantissa), two products on the tensor cores, emulated as such under the interpreter; for
    the others as _tl_wide_dot."""
    if DOT == "bf16":
        high = b.to(tl.bfloat16)
        low = (b - high.to(tl.float32)).to(tl.bfloat16)
        product = tl.dot(a.to(tl.bfloat16), high, out_dtype=tl.float32)
        product = tl.dot(a.to(tl.bfloat16), low, acc=product, out_dtype=tl.float32)
    elif DOT == "bf16 emulated":
        high = _tl_round_bf16(b)
        product = _tl_dot(a, high, DOT) + _tl_dot(a, b - high, DOT)
    else:
        product = _tl_wide_dot(a, b, DOT)
    return product


@triton.jit
def _tl_round_bf16(x):
    """x (float32) rounded to the nearest bfloat16, ties to even, held in float32: what a
    conversion to bfloat16 does on a GPU (triton's interpreter truncates instead)."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _tl_wide(x):
    """x, widened to float32 if it is a 16-bit float (every elementwise step computes in float32
    or float64)."""
    if x.dtype.is_bf16() or x.dtype.is_fp16():
        x = x.to(tl.float32)
    return x


@triton.jit
def _tl_columns(K, V, BK: tl.constexpr, BV: tl.constexpr):
    """This program's columns of a state [K, V] (its value block is program_id(0), its key
    block program_id(2)): (key and value column indices, and whether each is inside K or V)."""
    cols_k = tl.program_id(2) * BK + tl.arange(0, BK)
    cols_v = tl.program_id(0) * BV + tl.arange(0, BV)
    return cols_k, cols_v, cols_k < K, cols_v < V


@triton.jit
def _tl_tokens(n, rows, T, in_k, in_v):
    """The tokens of chunk n (rows: 0, ..., BT - 1): (their indices t, whether each is inside T,
    and the masks of their key and value columns)."""
    t = n * rows.shape[0] + rows
    in_t = t < T
    return t, in_t, in_t[:, None] & in_k[None, :], in_t[:, None] & in_v[None, :]


@triton.jit
def _tl_load_state(x, i, K, V, cols_k, cols_v):
    """This program's columns of state i of x [N, K, V] (contiguous), 0 outside [K, V]."""
    at = x + i * K * V + cols_k[:, None] * V + cols_v[None, :]
    return tl.load(at, mask=(cols_k < K)[:, None] & (cols_v < V)[None, :], other=0.0)


@triton.jit
def _tl_store_state(x, i, K, V, cols_k, cols_v, state):
    """Write this program's columns of state i of x [N, K, V] (contiguous)."""
    at = x + i * K * V + cols_k[:, None] * V + cols_v[None, :]
    tl.store(at, state, mask=(cols_k < K)[:, None] & (cols_v < V)[None, :])


@triton.jit
def _tl_store_rows(x, i, T, d, t, cols, mask, rows):
    """Write rows [len(t), len(cols)] at tokens t and columns cols of item i of x [N, T, d]
    (contiguous), where mask is True."""
    tl.store(x + (i * T + t[:, None]) * d + cols[None, :], rows, mask=mask)


@triton.jit
def _tl_tile(x, i, rows):
    """The entries of tile i of x [N, BT, BT] (contiguous; rows: 0, ..., BT - 1): the [BT, BT]
    matrices of a chunk that a forward keeps for its backward."""
    return x + (i * rows.shape[0] + rows[:, None]) * rows.shape[0] + rows[None, :]


@triton.jit
def _tl_finite(x):
    """(x with its entries that are not finite read as 0, and its poison: 0 where x is finite,
    NaN where it is not). The products inside a chunk take the finite values; a kernel adds the
    poison to the outputs from its token on and to the state, as the recurrence would carry it."""
    poison = x * 0.0
    return tl.where(poison == 0.0, x, 0.0), poison


@triton.jit
def _tl_gate_sums(g, rows):
    """The sums of a chunk's log-gates g [BT] that its decays need, each summed from its own
    terms: (b_i - b_j = g_{j+1} + ... + g_i for i >= j (0 above the diagonal) [BT, BT], and
    b_C - b_j = g_{j+1} + ... + g_C [BT]).

    Not differences of running sums: where b is large the difference of two of them loses
    about |b| roundings of accuracy, while a decay near 1 (a short stretch after a long one)
    needs its own small sum exactly. The pair sums are, row by row, a scan from the right of
    the gates after each column up to the row's own (row i, column m: g_{m+1} for m < i, else
    0; the gates moved by a gather of [BT] entries), and the sums to the chunk's end a scan of
    the same moved gates: every sum one of gates of one sign, in float32 (no matmul: no
    rounding to tensor-core operands, and no [BT, BT] tile but the pairs').
    """
    last = rows.shape[0] - 1
    g_next = tl.gather(g, tl.minimum(rows + 1, last), 0)  # g_{m+1}: a move, no sum
    g_next = tl.where(rows < last, g_next, 0.0)  # 0 for the last
    terms = tl.where(rows[None, :] < rows[:, None], g_next[None, :], 0.0)  # [i, m]
    pairs = tl.cumsum(terms, axis=1, reverse=True)
    return pairs, tl.cumsum(g_next, axis=0, reverse=True)


@triton.jit
def _tl_pair_grads(pairs, rows):
    """The part of a chunk's log-gates' gradient [BT] that Gamma passes on: pairs [BT, BT] is
    what each Gamma_ij passes on (its gradient times its value), and Gamma_ij holds g_l for
    j < l <= i. A sum of the contributions themselves: each row's sums of its columns j <= m (a
    scan along the row, inside a warp's registers rather than across the warps as a scan down
    the columns), then those of the rows i > m, moved one entry on (l = m + 1); in float32
    (float64), no matmul."""
    causal = rows[:, None] >= rows[None, :]  # [i, j]: j <= i
    up_to = tl.cumsum(tl.where(causal, pairs, 0.0), axis=1)  # [i, m]: j <= m
    below = tl.sum(tl.where(rows[:, None] > rows[None, :], up_to, 0.0), axis=0)  # [m]: i > m
    moved = tl.gather(below, tl.maximum(rows - 1, 0), 0)  # l = m + 1: a move, no sum
    return tl.where(rows > 0, moved, 0.0)


@triton.jit
def _tl_gate_grads(from_pairs, starts, ends, whole, rows):
    """The gradient of a chunk's log-gates g [BT] from what each decay factor holding exp(g_l)
    passes on (its gradient times its value), as the PyTorch kernels' _gate_grads: from_pairs
    [BT], Gamma's part (_tl_pair_grads); starts [BT] for exp(b_i), holding g_l for l <= i;
    ends [BT] for exp(b_C - b_j), holding g_l for j < l; whole, a scalar, for exp(b_C),
    holding every g_l. Each is a sum of the contributions themselves, so a hard reset (every
    factor holding it 0) gets exactly 0: the sums over i >= l and j < l are scans of [BT]
    entries, not masked sums of [BT, BT] tiles."""
    dg = from_pairs + tl.cumsum(starts, axis=0, reverse=True)  # over i >= l
    return dg + _tl_scan_before(ends, 0, False) + whole  # over j < l


@triton.jit
def _tl_rows(x, strides_b, strides_h, strides_t, strides_d, i_b, i_h, t, cols, mask):
    """The rows t and columns cols of one (batch, head) of x [B, NH, T, d] (strided), 0 where
    mask is False, widened to float32 if 16-bit (_tl_wide)."""
    at = x + i_b * strides_b + i_h * strides_h + t[:, None] * strides_t + cols[None, :] * strides_d
    return _tl_wide(tl.load(at, mask=mask, other=0.0))


@triton.jit
def _tl_put_rows(x, strides_b, strides_h, strides_t, strides_d, i_b, i_h, t, cols, mask, rows):
    """Write rows at tokens t and columns cols of one (batch, head) of x [B, NH, T, d]
    (strided), where mask is True."""
    at = x + i_b * strides_b + i_h * strides_h + t[:, None] * strides_t + cols[None, :] * strides_d
    tl.store(at, rows, mask=mask)


@triton.jit
def _tl_gates(g, strides_b, strides_h, strides_t, i_b, i_h, t, mask):
    """The log-gates at tokens t of one (batch, head) of g [B, NH, T] (strided), 0 where mask is
    False. A gate below -1e30 (a hard reset, -inf) is read as -1e30: its decay is still exactly
    0, and the sums of gates stay finite (a matmul's 0 times -inf would be NaN)."""
    gates = tl.load(g + i_b * strides_b + i_h * strides_h + t * strides_t, mask=mask, other=0.0)
    gates = _tl_wide(gates)
    return tl.where(gates < -1e30, -1e30, gates)


@triton.jit
def _tl_key_gates(g, strides_b, strides_h, strides_t, strides_d, i_b, i_h, t, cols, mask):
    """The log-gates at tokens t and key columns cols of one (batch, head) of g [B, NH, T, K]
    (strided), 0 where mask is False, a gate below -1e30 read as -1e30 (as in _tl_gates)."""
    gates = _tl_rows(g, strides_b, strides_h, strides_t, strides_d, i_b, i_h, t, cols, mask)
    return tl.where(gates < -1e30, -1e30, gates)


@triton.jit
def _tl_chunk_decays(g, rows):
    """The decays of a chunk from its log-gates g [BT] (_tl_gate_sums): (Gamma [BT, BT],
    exp(b_i - b_j) on and below the diagonal and 1, an empty product, above it; exp(b) and
    exp(b_C - b) [BT, 1]; the whole chunk's exp(b_C))."""
    pairs, to_end = _tl_gate_sums(g, rows)
    gamma = tl.exp(tl.where(rows[:, None] >= rows[None, :], pairs, 0.0))
    from_start = tl.exp(tl.cumsum(g, axis=0))[:, None]
    return gamma, from_start, tl.exp(to_end)[:, None], tl.exp(tl.sum(g, axis=0))


@triton.jit
def _tl_pairs(rows, BLOCK: tl.constexpr):
    """[i, j]: whether i is in the right half and j in the left half of one aligned block of
    2 * BLOCK rows (the pairs measured from that block's boundary)."""
    right, left = rows[:, None] // BLOCK, rows[None, :] // BLOCK
    return (right == left + 1) & (left % 2 == 0)


@triton.jit
def _tl_add_before(a_sum, a_before, b_sum, b_before):
    """The combination of a scan that carries (the sum up to an entry, the sum before it): a
    comes first in the scan's order. Every sum is one of the entries themselves."""
    return a_sum + b_sum, a_sum + b_before


@triton.jit
def _tl_scan_before(x, axis: tl.constexpr, REVERSE: tl.constexpr):
    """The exclusive running sums of x along axis: each entry's the sum of those before it (or,
    REVERSE, after it), its own left out; a sum of those entries, never a difference."""
    _, before = tl.associative_scan((x, tl.zeros_like(x)), axis, _tl_add_before, reverse=REVERSE)
    return before


@triton.jit
def _tl_run_scan(x, RUN: tl.constexpr, REVERSE: tl.constexpr, OWN: tl.constexpr):
    """Column by column, the running sums of x [BT, d] inside the aligned runs of RUN rows: from
    its run's start to each row, or (REVERSE) from it to its run's end, the row's own included
    if OWN (_tl_scan_before otherwise)."""
    runs = tl.reshape(x, (x.shape[0] // RUN, RUN, x.shape[1]))
    if OWN:
        runs = tl.cumsum(runs, axis=1, reverse=REVERSE)
    else:
        runs = _tl_scan_before(runs, 1, REVERSE)
    return tl.reshape(runs, (x.shape[0], x.shape[1]))


@triton.jit
def _tl_run_sums(g, rows, RUN: tl.constexpr):
    """Column by column, the sums of g [BT, d] inside the aligned runs of RUN rows: (to each row
    from its run's start, the row included; from after each row to its run's end) [BT, d].
    Each is summed from its own terms by a scan (_tl_run_scan), never a difference of running
    sums, and in float32 (float64): no matmul, no rounding to tensor-core operands."""
    return _tl_run_scan(g, RUN, False, True), _tl_run_scan(g, RUN, True, False)


@triton.jit
def _tl_run_sums_grad(d_up_to, d_after, rows, RUN: tl.constexpr):
    """The gradient for g of _tl_run_sums(g, rows, RUN), from those of its two sums: g_l is in
    the first sum of the rows from l to its run's end and in the second of the rows before l."""
    return _tl_run_scan(d_up_to, RUN, True, True) + _tl_run_scan(d_after, RUN, False, False)


@triton.jit
def _tl_unit_lower_inverse(a, rows, BT: tl.constexpr):
    """(I + a)^{-1} for a strictly lower-triangular a [BT, BT], by forward substitution: row i
    of the inverse is e_i minus the earlier rows weighted by row i of a."""
    inverse = tl.where(rows[:, None] == rows[None, :], 1.0, 0.0).to(a.dtype)
    for i in range(1, BT):
        a_i = tl.sum(tl.where(rows[:, None] == i, a, 0.0), axis=0)  # a[i, j], over j
        row = tl.where(rows == i, 1.0, 0.0) - tl.sum(a_i[:, None] * inverse, axis=0)
        inverse = tl.where(rows[:, None] == i, row[None, :], inverse)
    return inverse
