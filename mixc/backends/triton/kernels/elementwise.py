"""The Triton kernel of the elementwise-gate class: S_t = exp(g_t) ⊙ S_{t-1} + k_t v_t^T,
o_t = q_t S_t, with a log-gate g_t [K, V] per token on every entry of the state, times g_scale
when given (Mamba-1's selective scan: g_t = dt_t ⊗ A, a per-token vector times a per-head
matrix; HGRN: a vector state, one key channel). The same function as the PyTorch kernel
(docs/algorithms.md, "Full elementwise gates"), as a scan: one program per (batch, head, block of
value columns) walks the tokens in order with its [K, BV] columns of the state in registers, as
mamba_ssm's selective scan keeps its state, reading each token's gate entries through the
strides of the broadcast gate (a per-head matrix is never expanded over T in memory).

The forward keeps the state entering every chunk of chunk_size tokens (memory linear in T:
T / C states). The backward walks the chunks from the last: it makes the chunk's states again
from the kept one into a scratch of C states per program, then walks the chunk's tokens back
with D, the gradient of S_t:
    D += q_t do_t^T,  dq_t = S_t do_t,  dk_t = D v_t,  dv_t = D^T k_t,
    dL_t = D ⊙ exp(L_t) ⊙ S_{t-1} (L_t = g_t g_scale_t),  D <- exp(L_t) ⊙ D
dq and dk sum over the value columns (each block writes its part); dL_t is written per entry
and reduced to the shapes of g and g_scale after the launch.

Each token is its own step, so a non-finite input reaches only its own and later outputs.
"""

import torch
import triton
import triton.language as tl

from mixc.backends.pytorch.kernels.common import _chunk_size_for, _needs_grad
from mixc.backends.triton.kernels.common import (
    _tl_block,
    _tl_check_device,
    _tl_columns,
    _tl_compute_dtype,
    _tl_launch,
    _tl_load_state,
    _tl_store_state,
    _tl_tiles,
    _tl_wide,
)


@triton.jit
def _tl_elementwise_token(
    q, k, v, g, gs, i_b, i_h, t, cols_k, cols_v, in_k, in_v,
    sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,
    sg_b, sg_h, sg_t, g_entries, ss_b, ss_h, ss_t, s_entries,
    HAS_SCALE: tl.constexpr,
):  # fmt: skip
    """Token t's query and key [BK], value [BV], and its log-gate L_t [BK, BV] (g times g_scale
    if HAS_SCALE) with its scale (1 without one), each read through its strides (a broadcast
    axis has stride 0; the last axes of q, k, v have stride 1); 0 outside K and V. g_entries,
    s_entries: the offsets [BK, BV] of this program's entries of a token's gate and scale,
    made once a program (the same every token)."""
    at_kv = in_k[:, None] & in_v[None, :]
    q_t = _tl_wide(tl.load(q + i_b * sq_b + i_h * sq_h + t * sq_t + cols_k, mask=in_k, other=0.0))
    k_t = _tl_wide(tl.load(k + i_b * sk_b + i_h * sk_h + t * sk_t + cols_k, mask=in_k, other=0.0))
    v_t = _tl_wide(tl.load(v + i_b * sv_b + i_h * sv_h + t * sv_t + cols_v, mask=in_v, other=0.0))
    gate = tl.load(g + i_b * sg_b + i_h * sg_h + t * sg_t + g_entries, mask=at_kv, other=0.0)
    gate = _tl_wide(gate)
    scale = tl.full(gate.shape, 1.0, gate.dtype)
    if HAS_SCALE:
        at = gs + i_b * ss_b + i_h * ss_h + t * ss_t + s_entries
        scale = _tl_wide(tl.load(at, mask=at_kv, other=0.0))
        gate = gate * scale
    return q_t, k_t, v_t, gate, scale


@triton.jit
def _tl_elementwise_fwd(
    q, k, v, g, gs, h0,  # read
    o, ht, hs,  # written
    T, NH, K, V,
    sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,
    sg_b, sg_h, sg_t, sg_k, sg_v, ss_b, ss_h, ss_t, ss_k, ss_v,
    so_b, so_h, so_t,
    HAS_SCALE: tl.constexpr, KEEP: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr,
):  # fmt: skip
    """One (value block, batch x head) program: the tokens in order, the state in registers.
    h0, ht: [B * NH, K, V]; hs (KEEP): the states entering each chunk of C tokens,
    [B * NH, N, K, V]; contiguous."""
    i_bh = tl.program_id(1)
    i_b, i_h = i_bh // NH, i_bh % NH
    cols_k, cols_v, in_k, in_v = _tl_columns(K, V, BK, BV)
    state = _tl_load_state(h0, i_bh, K, V, cols_k, cols_v)
    g_entries = cols_k[:, None] * sg_k + cols_v[None, :] * sg_v
    s_entries = cols_k[:, None] * ss_k + cols_v[None, :] * ss_v
    n_chunks = tl.cdiv(T, C)
    for t in range(0, T):
        if KEEP:
            if t % C == 0:
                _tl_store_state(hs, i_bh * n_chunks + t // C, K, V, cols_k, cols_v, state)
        q_t, k_t, v_t, gate, _ = _tl_elementwise_token(
            q, k, v, g, gs, i_b, i_h, t, cols_k, cols_v, in_k, in_v,
            sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,
            sg_b, sg_h, sg_t, g_entries, ss_b, ss_h, ss_t, s_entries, HAS_SCALE,
        )  # fmt: skip
        state = tl.exp(gate) * state + k_t[:, None] * v_t[None, :]
        out = tl.sum(q_t[:, None] * state, axis=0)
        tl.store(o + i_b * so_b + i_h * so_h + t * so_t + cols_v, out, mask=in_v)
    _tl_store_state(ht, i_bh, K, V, cols_k, cols_v, state)


@triton.jit
def _tl_elementwise_remake(
    q, k, v, g, gs, hs, scratch, i_bh, i_b, i_h, n, n_chunks, part, start, end,
    K, V, cols_k, cols_v, in_k, in_v,
    sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,
    sg_b, sg_h, sg_t, g_entries, ss_b, ss_h, ss_t, s_entries,
    HAS_SCALE: tl.constexpr, C: tl.constexpr,
):  # fmt: skip
    """The states S_t of chunk n's tokens start, ..., end - 1, made again from the state the
    forward kept (hs) into this program's scratch [C, K, V] (slot part)."""
    state = _tl_load_state(hs, i_bh * n_chunks + n, K, V, cols_k, cols_v)
    for t in range(start, end):  # the chunk's states S_t, again
        _, k_t, v_t, gate, _ = _tl_elementwise_token(
            q, k, v, g, gs, i_b, i_h, t, cols_k, cols_v, in_k, in_v,
            sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,
            sg_b, sg_h, sg_t, g_entries, ss_b, ss_h, ss_t, s_entries, HAS_SCALE,
        )  # fmt: skip
        state = tl.exp(gate) * state + k_t[:, None] * v_t[None, :]
        _tl_store_state(scratch, part * C + t - start, K, V, cols_k, cols_v, state)


@triton.jit
def _tl_elementwise_bwd(
    q, k, v, g, gs, do, hs, dht, scratch,  # read (scratch: written, then read)
    dq, dk, dv, dl, dh0,  # written
    T, NH, K, V,
    sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,
    sg_b, sg_h, sg_t, sg_k, sg_v, ss_b, ss_h, ss_t, ss_k, ss_v,
    sdo_b, sdo_h, sdo_t,
    HAS_SCALE: tl.constexpr, GATE_GRAD: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr,
):  # fmt: skip
    """One (value block, batch x head) program: the chunks from the last, each made again from
    the state the forward kept into this program's scratch [C, K, V], then its tokens back with
    the gradient of the state in registers. dq, dk: this block's parts [NV, B * NH, T, K];
    dv [B * NH, T, V]; dl (GATE_GRAD): the gradient of L_t [B * NH, T, K, V]; all contiguous."""
    i_bh = tl.program_id(1)
    i_b, i_h = i_bh // NH, i_bh % NH
    cols_k, cols_v, in_k, in_v = _tl_columns(K, V, BK, BV)
    d_state = _tl_load_state(dht, i_bh, K, V, cols_k, cols_v)
    g_entries = cols_k[:, None] * sg_k + cols_v[None, :] * sg_v
    s_entries = cols_k[:, None] * ss_k + cols_v[None, :] * ss_v
    n_chunks = tl.cdiv(T, C)
    part = tl.program_id(0) * tl.num_programs(1) + i_bh  # this block's part of dq, dk
    for m in range(0, n_chunks):
        n = n_chunks - 1 - m
        start = n * C
        end = tl.minimum(start + C, T)
        _tl_elementwise_remake(
            q, k, v, g, gs, hs, scratch, i_bh, i_b, i_h, n, n_chunks, part, start, end,
            K, V, cols_k, cols_v, in_k, in_v,
            sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,
            sg_b, sg_h, sg_t, g_entries, ss_b, ss_h, ss_t, s_entries, HAS_SCALE, C,
        )  # fmt: skip
        tl.debug_barrier()  # the scratch, written by some threads, is read by others
        for j in range(0, end - start):
            t = end - 1 - j
            q_t, k_t, v_t, gate, _ = _tl_elementwise_token(
                q, k, v, g, gs, i_b, i_h, t, cols_k, cols_v, in_k, in_v,
                sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,
                sg_b, sg_h, sg_t, g_entries, ss_b, ss_h, ss_t, s_entries, HAS_SCALE,
            )  # fmt: skip
            state = _tl_load_state(scratch, part * C + t - start, K, V, cols_k, cols_v)
            at_do = do + i_b * sdo_b + i_h * sdo_h + t * sdo_t + cols_v
            do_t = _tl_wide(tl.load(at_do, mask=in_v, other=0.0))
            d_state += q_t[:, None] * do_t[None, :]
            dq_t, dk_t = tl.sum(state * do_t[None, :], axis=1), tl.sum(d_state * v_t[None, :], 1)
            tl.store(dq + (part * T + t) * K + cols_k, dq_t, mask=in_k)
            tl.store(dk + (part * T + t) * K + cols_k, dk_t, mask=in_k)
            dv_t = tl.sum(d_state * k_t[:, None], axis=0)
            tl.store(dv + (i_bh * T + t) * V + cols_v, dv_t, mask=in_v)
            decay = tl.exp(gate)
            if GATE_GRAD:
                if t > start:
                    before = _tl_load_state(scratch, part * C + t - 1 - start, K, V, cols_k, cols_v)
                else:
                    before = _tl_load_state(hs, i_bh * n_chunks + n, K, V, cols_k, cols_v)
                at = dl + ((i_bh * T + t) * K + cols_k[:, None]) * V + cols_v[None, :]
                tl.store(at, d_state * decay * before, mask=in_k[:, None] & in_v[None, :])
            d_state = d_state * decay
        tl.debug_barrier()  # the scratch is read before the next chunk overwrites it
    _tl_store_state(dh0, i_bh, K, V, cols_k, cols_v, d_state)


def _tl_elementwise_args(q, k, v, g, g_scale, chunk_size):
    """The launch's shared arguments: (q, k, v with unit last strides; g and g_scale as views
    [B, NH, T, K, V] (g_scale: g when None, never read); the chunk, key and value block sizes;
    the number of value blocks and of chunks)."""
    batch, heads, length, d_k = q.shape
    d_v = v.shape[-1]
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    full = (batch, heads, length, d_k, d_v)
    g = g.expand(full)
    g_scale = g if g_scale is None else g_scale.expand(full)
    chunk = _chunk_size_for(chunk_size, length)
    block_v = min(_tl_block(d_v), _tl_tiles(_tl_elementwise_fwd)[1])
    sizes = (chunk, _tl_block(d_k), block_v, triton.cdiv(d_v, block_v), triton.cdiv(length, chunk))
    return q, k, v, g, g_scale, sizes


def _tl_elementwise_strides(q, k, v, g, g_scale):
    """The strides a kernel reads q, k, v, g and g_scale through."""
    return (
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *g.stride(), *g_scale.stride()
    )  # fmt: skip


def _tl_elementwise_forward(q, k, v, g, g_scale, initial_state, chunk_size, keep):
    """(o [B, NH, T, V], final state [B, NH, K, V], the states entering each chunk
    [B, NH, N, K, V] if keep else None)."""
    batch, heads, length, d_k = q.shape
    d_v = v.shape[-1]
    dtype = _tl_compute_dtype(q)
    has_scale = g_scale is not None
    q, k, v, g, g_scale, (chunk, block_k, block_v, n_v, n_chunks) = _tl_elementwise_args(
        q, k, v, g, g_scale, chunk_size
    )
    if initial_state is None:
        initial_state = q.new_zeros(batch, heads, d_k, d_v, dtype=dtype)
    initial_state = initial_state.to(dtype).contiguous()
    final = torch.empty_like(initial_state)
    kept = q.new_empty(batch, heads, n_chunks, d_k, d_v, dtype=dtype) if keep else final
    o = torch.empty(batch, length, heads, d_v, dtype=q.dtype, device=q.device).transpose(1, 2)
    _tl_elementwise_fwd[(n_v, batch * heads)](
        q, k, v, g, g_scale, initial_state, o, final, kept,
        length, heads, d_k, d_v,
        *_tl_elementwise_strides(q, k, v, g, g_scale), *o.stride()[:3],
        HAS_SCALE=has_scale, KEEP=keep, C=chunk, BK=block_k, BV=block_v,
        **_tl_launch(_tl_elementwise_fwd),
    )  # fmt: skip
    return o, final, kept if keep else None


class _TlElementwise(torch.autograd.Function):
    """The scan under autograd: the forward keeps the inputs and the states entering each chunk;
    the backward is one launch of _tl_elementwise_bwd, the gradient of the log-gate reduced to
    the shapes of g and g_scale after it."""

    @staticmethod
    def forward(ctx, q, k, v, g, g_scale, initial_state, chunk_size):
        o, final, kept = _tl_elementwise_forward(
            q, k, v, g, g_scale, initial_state, chunk_size, True
        )
        ctx.save_for_backward(q, k, v, g, g_scale, kept)
        ctx.chunk_size = chunk_size
        return o, final

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_o, d_final):
        q, k, v, g, g_scale, kept = ctx.saved_tensors
        batch, heads, length, d_k = q.shape
        d_v = v.shape[-1]
        dtype = _tl_compute_dtype(q)
        has_scale = g_scale is not None
        args = _tl_elementwise_args(q, k, v, g, g_scale, ctx.chunk_size)
        q_, k_, v_, g_, s_, (chunk, block_k, block_v, n_v, _) = args
        gate_grad = ctx.needs_input_grad[3] or (has_scale and ctx.needs_input_grad[4])
        d_o = d_o if d_o.stride(-1) == 1 else d_o.contiguous()
        if d_final is None:
            d_final = q.new_zeros(batch, heads, d_k, d_v, dtype=dtype)
        d_final = d_final.to(dtype).contiguous()
        dq = q.new_empty(n_v, batch, heads, length, d_k, dtype=dtype)
        dk = torch.empty_like(dq)
        dv = q.new_empty(batch, heads, length, d_v, dtype=dtype)
        dl = q.new_empty(batch, heads, length, d_k, d_v, dtype=dtype) if gate_grad else dv
        scratch = q.new_empty(n_v * batch * heads, chunk, d_k, d_v, dtype=dtype)
        d_initial = torch.empty_like(d_final)
        _tl_elementwise_bwd[(n_v, batch * heads)](
            q_, k_, v_, g_, s_, d_o, kept, d_final, scratch,
            dq, dk, dv, dl, d_initial,
            length, heads, d_k, d_v,
            *_tl_elementwise_strides(q_, k_, v_, g_, s_), *d_o.stride()[:3],
            HAS_SCALE=has_scale, GATE_GRAD=gate_grad, C=chunk, BK=block_k, BV=block_v,
            **_tl_launch(_tl_elementwise_bwd),
        )  # fmt: skip
        d_g = d_scale = None
        if gate_grad:  # L = g * g_scale: back to each factor's own (broadcast) shape
            d_g = (dl if not has_scale else dl * g_scale).sum_to_size(g.shape)
            if has_scale:
                d_scale = (dl * g).sum_to_size(g_scale.shape)
        d_initial = d_initial if ctx.needs_input_grad[5] else None
        return dq.sum(0), dk.sum(0), dv, d_g, d_scale, d_initial, None


def chunk_elementwise(q, k, v, g, g_scale=None, initial_state=None, chunk_size=64):
    """S_t = exp(g_t) ⊙ S_{t-1} + k_t v_t^T, o_t = q_t S_t as a Triton scan, forward and
    backward; the arguments and results of the PyTorch kernel chunk_elementwise (g, g_scale
    broadcastable to [B, NH, T, K, V], a T axis of 1 constant in time; chunk_size: the tokens
    between the states the forward keeps)."""
    _tl_check_device(_tl_elementwise_fwd, q)
    batch, heads, length = q.shape[:3]
    if length == 0:
        state = initial_state
        if state is None:
            state = q.new_zeros(batch, heads, q.shape[-1], v.shape[-1])
        return q.new_zeros(batch, heads, 0, v.shape[-1]), state
    if _needs_grad(q, k, v, g, g_scale, initial_state):
        return _TlElementwise.apply(q, k, v, g, g_scale, initial_state, chunk_size)
    o, final, _ = _tl_elementwise_forward(q, k, v, g, g_scale, initial_state, chunk_size, False)
    return o, final
