"""The fuzzer can fail: small breakages of correct compiled modules are all caught.

Each mutant edits the source of a compiled module (`mixc.compile_source`) in one place: an
off-by-one at a chunk boundary, a missing decay factor, a dropped initial state, a transposed
state, a wrong sign in the delta rule, a readout from the previous state, a dropped gate, a
wrong triangular solve in the diagonal-plus-low-rank kernel, a pipeline's readout passed on
one token late, or a value-side transition's transpose dropped or its beta on the wrong side. Every edit asserts its target occurs exactly once, so a change in the
generated code fails here loudly instead of silently leaving the module unmutated. Each mutant states how the fuzzer must catch it
(`Failure.kind`): by its values (numerical, nearly all of them), or by a crash or a wrong shape,
which any check would see.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

import mixc
from mixc.check import Example, check, fuzz, input_ranges
from mixc.check.reproducer import reproducer

ROOT = Path(__file__).resolve().parents[2]

NUMERICAL, SHAPE, CRASH = "numerical", "shape", "crash"

# (spec, what breaks, target text, replacement, the forms that must notice, how they notice:
# Failure.kind). A mutant is NUMERICAL unless said otherwise: the fuzzer must see its values
# differ from the oracle's. A crash (or a quantity of the wrong shape) would be caught whatever
# the comparison did, so it shows nothing about the fuzzer's tolerances; the few that are kept
# show that such a form is reported as a failure.
MUTANTS = [
    # pipelines of states: a later pass reads an earlier pass's readouts as its inputs
    (
        "stacked",
        "a readout taken one token late (the value of the second state's pass)",
        "    _read_H1 = _from_seq(_o, cu_seqlens)  # H1_t q_t",
        "    _read_H1 = _from_seq(_torch.cat([_torch.zeros_like(_o[:, :, :1]), _o[:, :, :-1]], 2), cu_seqlens)",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "stacked",
        "a readout taken one token late in the quadratic form",
        "    _read_H1 = _from_seq(_o)  # H1_t q_t\n    # H2: identity -> parallel",
        "    _read_H1 = _from_seq(_torch.cat([_torch.zeros_like(_o[:, :, :1]), _o[:, :, :-1]], 2))"
        "\n    # H2: identity -> parallel",
        {"parallel"},
        NUMERICAL,
    ),
    (
        "gsa",
        "a readout taken one token late (the softmax query of the second pass)",
        "    _read_Ks = _from_seq(_o, cu_seqlens)  # Ks_t l2norm(q_t)",
        "    _read_Ks = _from_seq(_torch.cat([_torch.zeros_like(_o[:, :, :1]), _o[:, :, :-1]], 2), cu_seqlens)",
        {"chunk"},
        NUMERICAL,
    ),
    # a scalar decay (Class 1): chunk_scalar_decay and parallel_scalar_decay
    (
        "gated_retention",
        "decay from the chunk start off by one token",
        "return gamma[..., :, 0] * torch.exp(g[..., :1]), gamma[..., -1, :]",
        "return gamma[..., :, 0], gamma[..., -1, :]",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "gated_retention",
        "keys without their decay to the chunk end",
        "k_c * to_end, g_c.sum(-1)",
        "k_c, g_c.sum(-1)",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "gated_retention",
        "intra-chunk mask misses the diagonal",
        "else x.tril_(-int(strict))",
        "else x.tril_(-1)",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "gated_retention",
        "output shifted by one token (the last shows the padding's, or the first's)",
        "[:, :length].transpose(1, 2)",
        "[:, :length].roll(-1, 1).transpose(1, 2)",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "gated_retention",
        "carried state without its decay",
        "q_from_start = q_c if from_start is None else q_c * from_start  # diag(exp(b)) Q",
        "q_from_start = q_c",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "gated_retention",
        "no decay from chunk to chunk",
        "_scan_scalar(state, chunk_g, chunk_kv, reverse)",
        "_scan_scalar(state, None, chunk_kv, reverse)",
        {"chunk"},
        NUMERICAL,
    ),
    # its own backward (chunk_scalar_decay's gradients): only gradients can notice
    (
        "gated_retention",
        "gradient flowing back between chunks without the decay",
        "_scan_scalar(d_state, chunk_g, local, not reverse)",
        "_scan_scalar(d_state, None, local, not reverse)",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "gated_retention",
        "key gradient from later chunks without its decay",
        "q_c * from_start, v_c * to_end, do_c * from_start",
        "q_c * from_start, v_c, do_c * from_start",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "gated_retention",
        "gate gradient missing the whole-chunk decay",
        "(states_in * d_next).sum((-1, -2)) * chunk_g.exp(),",
        "0 * chunk_g,",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "gated_retention",
        "gate gradient missing the decays from the chunk start",
        "(q_c * from_q).sum(-1),  # exp(b_i) in Q's inter part",
        "(0 * from_q).sum(-1),",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "linear_attention",
        "query and key gradients ignore the causal mask",
        "d_scores = _masked(d_probs, gamma, reverse, strict)",
        "d_scores = d_probs",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "gated_retention",
        "dropped initial state",
        "_S0_H = H.mT",
        "_S0_H = None",
        {"chunk"},
        NUMERICAL,
    ),
    # a transposed state of K != V channels comes back with the wrong shape; its entries in the
    # wrong layout (reshaped, not transposed) keep the shape and must be seen by their values
    ("gated_retention", "final state transposed", "H = _S.mT", "H = _S", {"chunk"}, SHAPE),
    (
        "gated_retention",
        "final state in the wrong layout",
        "H = _S.mT",
        "H = _S.reshape(_S.mT.shape)",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "gated_retention",
        "readout from the previous state",
        "_ys.append(H_t @ q_t)",
        "_ys.append(H @ q_t)",
        {"recurrent"},
        NUMERICAL,
    ),
    (
        "gated_retention",
        "quadratic form without its decay",
        "        decay = _pair_decays(g)",
        "        decay = None",
        {"parallel"},
        NUMERICAL,
    ),
    # a key-side diagonal gate (Class 2): chunk_diagonal
    (
        "gla",
        "blocks without the key-side decay",
        "k_left = k_left * _halves(suf_k, block)[0]  # exp(b_r - b_j)",
        "k_left = k_left",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "gla",
        "blocks without the query-side decay",
        "q_right = q_right * _halves(pre_k, block)[1]  # exp(b_i - b_r)",
        "q_right = q_right",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "gla",
        "carried state without its decay",
        "q_from_start = q_c * pre_k",
        "q_from_start = q_c",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "gla",
        "chunk decay from the chunk's first token, not its last",
        "chunk_decay_k = pre_k[..., -1, :]",
        "chunk_decay_k = pre_k[..., 0, :]",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "gla",
        "dropped initial state",
        "_S0_H = H.mT",
        "_S0_H = torch.zeros_like(H.mT)",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "gla",
        "output shifted by one token (the last shows the padding's, or the first's)",
        "[:, :length].transpose(1, 2)",
        "[:, :length].roll(-1, 1).transpose(1, 2)",
        {"chunk"},
        NUMERICAL,
    ),
    # its own backward (chunk_diagonal's gradients without value-side gates)
    (
        "gla",
        "key gradient of a level without its decay",
        "                d_k_left = d_k_left * _halves(suf_k, block)[0]",
        "                d_k_left = d_k_left",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "gla",
        "gate gradient of the right halves summed the wrong way",
        "_halves(dg, block)[1].add_(_within(d_q_right * q_right, block, upper=True))",
        "_halves(dg, block)[1].add_(_within(d_q_right * q_right, block, upper=False))",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "gla",
        "gate gradient missing the chunk decay",
        "        dg += whole.unsqueeze(-2)",
        "        dg += 0",
        {"chunk"},
        NUMERICAL,
    ),
    # the delta rule (Class 3): chunk_delta
    (
        "deltanet",
        "wrong sign of the state correction",
        "v = torch.baddbmm(u_n[n], w_n[n], state, alpha=-1.0,",
        "v = torch.baddbmm(u_n[n], w_n[n], state, alpha=1.0,",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "deltanet",
        "wrong sign in the UT transform",
        "(beta_c.unsqueeze(-1) * kk).tril_(-1)",
        "(-beta_c.unsqueeze(-1) * kk).tril_(-1)",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "deltanet",
        "off-by-one in the triangular mask",
        "(beta_c.unsqueeze(-1) * kk).tril_(-1)",
        "(beta_c.unsqueeze(-1) * kk).tril_(-2)",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "deltanet",
        "beta missing from W",
        "k_scaled = k_c * beta_c.unsqueeze(-1)",
        "k_scaled = k_c",
        {"chunk"},
        NUMERICAL,
    ),
    # its own backward (chunk_delta's gradients; the gradient attached to the forward's inverse
    # serves double backward only: tests/backends/test_kernels.py checks it with gradgradcheck)
    (
        "deltanet",
        "gradient through the triangular inverse dropped",
        "d_kk = d_a * beta",
        "d_kk = d_a * 0",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "deltanet",
        "state gradient with the wrong sign of the correction",
        "return torch.baddbmm(y, w_t_n[n], dv, alpha=-1.0, out=out)",
        "return torch.baddbmm(y, w_t_n[n], dv, alpha=1.0, out=out)",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "gated_deltanet",
        "gate gradient missing the mask's entries",
        "d_scores * scores + d_kk * kk,",
        "d_scores * scores,",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "deltanet",
        "wrong sign in the recurrence",
        "H_t = H - beta_t * ((H @ k_t) * k_t.mT)",
        "H_t = H + beta_t * ((H @ k_t) * k_t.mT)",
        {"recurrent"},
        NUMERICAL,
    ),
    # a transposed initial state of K != V channels makes the kernel's backward raise: a crash
    # is a failure of its form; the same state in the wrong layout keeps its shape
    ("deltanet", "initial state transposed", "_S0_H = H.mT", "_S0_H = H", {"chunk"}, CRASH),
    (
        "deltanet",
        "initial state in the wrong layout",
        "_S0_H = H.mT",
        "_S0_H = H.reshape(H.mT.shape)",
        {"chunk"},
        NUMERICAL,
    ),
    # a full elementwise gate: chunk_elementwise (autograd through checkpointed spans)
    (
        "mamba1",
        "gate applied one token late",
        "    rows = (q.unsqueeze(-2), k.unsqueeze(-1), v.unsqueeze(-2), g, g_scale)",
        "    rows = (q.unsqueeze(-2), k.unsqueeze(-1), v.unsqueeze(-2), g.roll(1, 2), g_scale)",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "mamba1",
        "initial state dropped",
        "    state = initial_state\n",
        "    state = None\n",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "hgrn",
        "gate applied one token late",
        "    rows = (q.unsqueeze(-2), k.unsqueeze(-1), v.unsqueeze(-2), g, g_scale)",
        "    rows = (q.unsqueeze(-2), k.unsqueeze(-1), v.unsqueeze(-2), g.roll(1, 2), g_scale)",
        {"chunk"},
        NUMERICAL,
    ),
    # diagonal plus low rank (chunk_dplr): the gate, the triangular solve, the chunk boundary
    (
        "kda",
        "gate dropped inside the chunk",
        "pre = g_c.exp()  # inside blocks",
        "pre = torch.ones_like(g_c)  # inside blocks",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "rwkv7",
        "no decay from chunk to chunk",
        "torch.diagonal(moves, dim1=-2, dim2=-1).add_(chunk_decay.reshape(*moves.shape[:-1]))",
        "torch.diagonal(moves, dim1=-2, dim2=-1).add_(1.0)",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "kda",
        "triangular solve of I + ab instead of I - ab",
        "t_inv = _unit_lower_inverse(minus_ab.detach())",
        "t_inv = _unit_lower_inverse(-minus_ab.detach())",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "rwkv7",
        "triangular solve dropped (T = I)",
        "t_inv = _unit_lower_inverse(minus_ab.detach())",
        "t_inv = _unit_lower_inverse(torch.zeros_like(minus_ab))",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "kda",
        "the rank-1 read of the incoming state decayed one token too far",
        "w = _bmm(t_inv, a_before)",
        "w = _bmm(t_inv, a_before * g_c.exp())",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "rwkv7",
        "a chunk's scores as one matmul read a's decay through its own token",
        "torch.mul(a_c, decay_before, out=rows[..., 1, :])",
        "torch.mul(a_c, decay, out=rows[..., 1, :])",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "rwkv7",
        "a chunk's scores as one matmul keep the a row's pair with its own key",
        "for column, offset in ((0, 0), (1, 0), (0, 1)):",
        "for column, offset in ((1, 0), (0, 1)):",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "rwkv7",
        "the first token of each chunk loses its own query-key pair",
        "own.copy_(torch.matmul(q_c.unsqueeze(-2), cols.transpose(-1, -2)).squeeze(-2).mT)",
        "own.copy_(torch.matmul(q_c.unsqueeze(-2), cols.transpose(-1, -2)).squeeze(-2).mT)\n"
        "    own[..., 0, 0] = 0",
        {"chunk"},
        NUMERICAL,
    ),
    # several steps per token as sub-tokens (DeltaProduct)
    (
        "deltaproduct",
        "the query read at each token's first sub-token",
        "_q = _sub_tokens([_torch.zeros_like(_q), _q])",
        "_q = _sub_tokens([_q, _torch.zeros_like(_q)])",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "deltaproduct",
        "the two steps of a token swapped (in chunk, where the initial state follows)",
        "_beta_H = _sub_tokens([_beta1_H, _beta2_H])  # 2 sub-tokens a token, one per step\n"
        "    _S0_H",
        "_k_H, _v_H = _sub_tokens([_k2_H, _k1_H]), _sub_tokens([_v2_H, _v1_H])\n"
        "    _beta_H = _sub_tokens([_beta2_H, _beta1_H])\n"
        "    _S0_H",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "deltaproduct",
        "the output read at the first sub-token",
        "_o = _o[:, :, 1::2]",
        "_o = _o[:, :, 0::2]",
        {"chunk"},
        NUMERICAL,
    ),
    # non-causal mixers: a backward state runs on the time-reversed sequence (a kernel without
    # its own reverse order: bidirectional_gla's diagonal one), or backward in time itself
    # (hydra's scalar-decay kernel: reverse=, strict=)
    (
        "bidirectional_gla",
        "the backward pass reversed over the whole packed row, not per packed sequence",
        "    if cu_seqlens is None:\n        return x.flip(2)\n",
        "    if cu_seqlens is None:\n        return x.flip(2)\n    return x.flip(0).flip(2)\n",
        {"packed"},
        NUMERICAL,
    ),
    (
        "hydra",
        "the forward shift dropped (H_t C_t read for H_{t-1} C_t)",
        "strict=True, initial_state=_S0_H",
        "initial_state=_S0_H",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "hydra",
        "the backward state's chunks chained forward in time",
        "_scan_scalar(state, chunk_g, chunk_kv, reverse)",
        "_scan_scalar(state, chunk_g, chunk_kv)",
        {"chunk", "packed"},
        NUMERICAL,
    ),
    (
        "hydra",
        "the backward state read after the token's update (the strict triangle's diagonal kept)",
        "return x.triu_(int(strict)) if reverse else x.tril_(-int(strict))",
        "return x.triu_(0) if reverse else x.tril_(-int(strict))",
        {"chunk", "packed", "parallel"},
        NUMERICAL,
    ),
    (
        "hydra",
        "the forward state read after the token's update inside a chunk (the diagonal kept)",
        "return x.triu_(int(strict)) if reverse else x.tril_(-int(strict))",
        "return x.triu_(int(strict)) if reverse else x.tril_(0)",
        {"chunk", "packed", "parallel"},
        NUMERICAL,
    ),
    (
        "hydra",
        "the backward state's scores in the lower triangle",
        "return x.triu_(int(strict)) if reverse else x.tril_(-int(strict))",
        "return x.tril_(-int(strict))",
        {"chunk", "packed", "parallel"},
        NUMERICAL,
    ),
    (
        "hydra",
        "a read before the update decayed by one factor too many between two tokens",
        "shift = 1 + int(strict)",
        "shift = 1",
        {"chunk", "packed", "parallel"},
        NUMERICAL,
    ),
    (
        "hydra",
        "the backward state entering a chunk decayed by the token's own factor",
        "    return gamma, _padded(after, 0, 1), _padded(before, 1, 0)",
        "    return gamma, gamma[..., :, -1] * a[..., -1:], _padded(before, 1, 0)",
        {"chunk", "packed"},
        NUMERICAL,
    ),
    (
        "hydra",
        "the forward state entering a chunk decayed by the token's own factor",
        "        return gamma, _padded(before, 1, 0), _padded(after, 0, 1)",
        "        return gamma, a.cumprod(-1), _padded(after, 0, 1)",
        {"chunk", "packed"},
        NUMERICAL,
    ),
    (
        "hydra",
        "the backward state's gradient passed from chunk to chunk backward in time",
        "_scan_scalar(d_state, chunk_g, local, not reverse)",
        "_scan_scalar(d_state, chunk_g, local, True)",
        {"chunk", "packed"},
        NUMERICAL,
    ),
    (
        "hydra",
        "the backward gate's gradient counting the token's own factor in the state it reads",
        "torch.triu(ones, int(strict))",
        "torch.triu(ones)",
        {"chunk", "packed"},
        NUMERICAL,
    ),
    (
        "hydra",
        "the backward shift dropped in the recurrence (G_t Cb_t read for G_{t+1} Cb_t)",
        "_read_G = G @ Cb_t",
        "_read_G = G_t @ Cb_t",
        {"recurrent"},
        NUMERICAL,
    ),
    (
        "hydra",
        "the backward loop run forward in time",
        '_range(_sizes["T"] - 1, -1, -1)',
        '_range(_sizes["T"])',
        {"recurrent"},
        NUMERICAL,
    ),
    (
        "hydra",
        "the diagonal D x counted twice",
        "x, D, out=_spare(y, _own))  # H_{t-1} C_t + G_{t+1} Cb_t + D x_t\n"
        "    y = y.squeeze(-1).to(_out_dtype)\n    return y, ((H, G)",
        "x, D + D, out=_spare(y, _own))\n    y = y.squeeze(-1).to(_out_dtype)\n    return y, ((H, G)",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "bidirectional_gla",
        "the backward shift dropped: the token's own v_t k_t^T q_t counted twice",
        "_q_next = _next_tokens(_q, True, cu_seqlens)  # the next token's query, in reverse time "
        "order\n    _o, _S = _chunk_diagonal(\n"
        "        _q_next, _k_G, _v_G, gk=_gk_G, initial_state=_S0_G, chunk_size=chunk_size\n    )\n"
        "    del _gk_G, _k_G, _q_next, _v_G\n"
        "    # S_{t-1} q_t, back in time order\n"
        "    _o = _previous_tokens(_o, _final_tokens(_q, cu_seqlens) @ _S0_G, True, cu_seqlens)\n",
        "_q_next = _reverse_tokens(_q, cu_seqlens)\n    _o, _S = _chunk_diagonal(\n"
        "        _q_next, _k_G, _v_G, gk=_gk_G, initial_state=_S0_G, chunk_size=chunk_size\n    )\n"
        "    del _gk_G, _k_G, _q_next, _v_G\n"
        "    _o = _reverse_tokens(_o, cu_seqlens)\n",
        {"chunk"},
        NUMERICAL,
    ),
    # several writes a token: joined (a scalar decay) or as sub-tokens that only write
    (
        "tests/check/specs/scalar_two_writes",
        "the second write dropped from the joined values",
        "_v_H = [_v1_H, _v2_H]",
        "_v_H = [_v1_H, _torch.zeros_like(_v2_H)]",
        {"chunk"},
        NUMERICAL,
    ),
    # a lagged write folded into the previous token's own (mixc.analysis.folds)
    (
        "mamba3_trapezoid",
        "the previous token's key read at the token itself (B_t for B_{t-1}) at the start",
        "_k0_H = _prev_B  # B_{t-1}",
        "_k0_H = B[:, 0]  # B_{t-1}",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "mamba3_trapezoid",
        "the next token's lagged write not written ahead",
        "_v_H = (_d_H + _cnext_H)[..., None] * _x_H",
        "_v_H = _d_H[..., None] * _x_H",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "mamba3_trapezoid",
        "c read at the token itself, not the next one",
        "_cnext_H = _next_tokens(_c_H)",
        "_cnext_H = _c_H",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "mamba3_trapezoid",
        "the readout of the state before the update not decayed by the token",
        "decayed=True,",
        "decayed=False,",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "mamba3_trapezoid",
        "the initial state without the carried token's write",
        "_S0_H = _lagged_start(H.mT, _k0_H, _v0_H, _c_H)",
        "_S0_H = H.mT",
        {"chunk"},
        NUMERICAL,
    ),
    # a value-side transition (chunk_dplr_value): chunk_dplr on the transpose, then chunk_diagonal
    (
        "gated_oja",
        "beta on the wrong side of the write (on its key, the unit v, not its value k)",
        "    _k_H = _seq_vector(_unit_v, _sizes, cu_seqlens)\n"
        "    _v_H = _seq_vector(beta * k, _sizes, cu_seqlens)",
        "    _k_H = _seq_vector(beta * _unit_v, _sizes, cu_seqlens)\n"
        "    _v_H = _seq_vector(k, _sizes, cu_seqlens)",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "gated_oja",
        "the transpose dropped: the first pass starts from the state as laid out",
        "s0 = initial_state.mT  # S = M^T",
        "s0 = initial_state  # S = M^T",
        {"chunk"},
        CRASH,
    ),
    (
        "gated_oja",
        "the transpose dropped: the final state returned as the first pass holds it",
        "return o, state.mT",
        "return o, state",
        {"chunk"},
        SHAPE,
    ),
    (
        "gated_oja",
        "the rank-1 term's read not folded into the second pass's write",
        "chunk_diagonal(q, v + u, k,",
        "chunk_diagonal(q, v, k,",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "gated_oja",
        "the rank-1 term's read taken from the token's own state, not the one before",
        "a_next = torch.cat([a[:, :, 1:], torch.zeros_like(a[:, :, :1])], 2)",
        "a_next = a",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "gated_oja",
        "the second pass without its value-side gate",
        "gv = None if gk is None else gk.expand_as(k)",
        "gv = None",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "tests/check/specs/scalar_two_writes",
        "a token's second write masked as a later token's (not read at its own token)",
        "scores = [_masked(_bmm(q_r, k_r.transpose(-1, -2)), gamma) for k_r in keys]",
        "scores = [_masked(_bmm(q_r, k_r.mT), gamma).tril_(-r) for r, k_r in enumerate(keys)]",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "mamba3_trapezoid",
        "the step's previous token not carried (x_{t-1} read at t)",
        "H, _prev_x, _prev_B = H_t, x_t, B_t",
        "H, _prev_x, _prev_B = H_t, _prev_x, _prev_B",
        {"recurrent", "step"},
        NUMERICAL,
    ),
    # a state of angles (Mamba-3's Th): one cumulative sum in float64 gives Th_{t-1} and Th_t
    (
        "mamba3",
        "the angle read a token late (Th_t where the spec reads Th_{t-1}, and back)",
        "_read_Th, _read2_Th, Th = _tanh_angle_sums(_scaled_dt, w, Th, cu_seqlens)",
        "_read2_Th, _read_Th, Th = _tanh_angle_sums(_scaled_dt, w, Th, cu_seqlens)",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "mamba3",
        "the step's angles not carried (each token turned by the first token's angle)",
        "Th, H, _prev_x, _prev_B = Th_t, H_t, x_t, B_t",
        "Th, H, _prev_x, _prev_B = Th, H_t, x_t, B_t",
        {"recurrent", "step"},
        NUMERICAL,
    ),
    (
        "gla_rank2",
        "the second write's sub-token dropped",
        "_v_H = _sub_tokens([_v1_H, _v2_H])  # 2 sub-tokens a token, one per step\n"
        "    _gk_H = _sub_tokens([_gk1_H, _torch.zeros_like(_gk1_H)])  # 2 sub-tokens a token, "
        "one per step\n    _S0_H",
        "_v_H = _sub_tokens([_v1_H, _torch.zeros_like(_v2_H)])\n"
        "    _gk_H = _sub_tokens([_gk1_H, _torch.zeros_like(_gk1_H)])\n    _S0_H",
        {"chunk"},
        NUMERICAL,
    ),
    (
        "gla_rank2",
        "the decay applied on both sub-tokens of a token",
        "_gk_H = _sub_tokens([_gk1_H, _torch.zeros_like(_gk1_H)])  # 2 sub-tokens a token, "
        "one per step\n    _S0_H",
        "_gk_H = _sub_tokens([_gk1_H, _gk1_H])\n    _S0_H",
        {"chunk"},
        NUMERICAL,
    ),
]


def mutate(source: str, target: str, replacement: str) -> str:
    assert source.count(target) == 1, (
        f"the generated code changed: {target!r} occurs {source.count(target)} times"
    )
    return source.replace(target, replacement)


@functools.cache
def _compiled(path: Path) -> str:
    """The module mixc writes for the spec at `path` (the same text each time: each mutant of
    the spec edits it, and the spec is compiled once)."""
    return mixc.compile_source(path)


def _spec_path(spec: str) -> Path:
    """A shipped spec by name, or a test's own spec by its path from the root (a kernel no
    shipped spec runs)."""
    return ROOT / f"{spec}.mix" if "/" in spec else ROOT / "specs" / f"{spec}.mix"


@pytest.mark.parametrize(
    "spec, what, target, replacement, forms, kind",
    MUTANTS,
    ids=[f"{m[0]}: {m[1]}" for m in MUTANTS],
)
def test_every_mutant_is_caught(
    tmp_path: Path, spec, what, target, replacement, forms, kind
) -> None:
    """Caught by the form and in the way it states: a numerical mutant by its values."""
    path = _spec_path(spec)
    module = tmp_path / f"{Path(spec).name}_mutant.py"
    module.write_text(mutate(_compiled(path), target, replacement))
    report = fuzz(path, module, examples=40, shrink=False)
    assert not report.ok, f"{what}: survived {report.examples} examples"
    assert report.failure.form in forms, report.failure.summary()
    assert report.failure.kind == kind, report.failure.summary()
    # what the fuzzer caught is the edit: the module it edits passes the same example
    assert _unmutated_failure(path, report.failure.example) is None


@functools.cache
def _unmutated_failure(path: Path, example: Example) -> str | None:
    """How the module mixc writes for the spec at `path` fails on `example` (None: it passes;
    many mutants of a spec are caught on the same example, which is checked once)."""
    _, failure = check(input_ranges(path), mixc.load(path), example)
    return None if failure is None else failure.summary()


#: The unmutated modules fuzzed on the mutants' seed. By default only the spec no other test
#: fuzzes: each shipped spec's module (the same text) passes the fuzzer by default in
#: tests/check/test_fuzz.py::test_every_shipped_spec_passes, and every example a mutant is
#: caught on is checked on the unmutated module above.
UNMUTATED = [
    pytest.param(s, marks=[pytest.mark.slow] * ("/" not in s))
    for s in sorted({m[0] for m in MUTANTS})
]


@pytest.mark.parametrize("spec", UNMUTATED)
def test_the_unmutated_module_passes(tmp_path: Path, spec: str) -> None:
    path = _spec_path(spec)
    module = tmp_path / f"{Path(spec).name}.py"
    module.write_text(_compiled(path))
    report = fuzz(path, module, examples=15)
    assert report.ok, report.failure.summary()


def test_cli_shrinks_and_prints_a_reproducer_that_fails(tmp_path: Path) -> None:
    path = ROOT / "specs" / "gla.mix"
    module = tmp_path / "gla_mutant.py"
    (gla_mutant,) = [m for m in MUTANTS if m[:2] == ("gla", "carried state without its decay")]
    module.write_text(mutate(mixc.compile_source(path), *gla_mutant[2:4]))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mixc",
            "fuzz",
            "specs/gla.mix",
            "--module",
            str(module),
            "--examples",
            "10",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    head, script = run.stdout.split("reproducer (save as repro.py, run python repro.py):\n\n")
    assert head.startswith(f"FAILED mixc fuzz specs/gla.mix --module {module}: chunk (chunk_size=")
    assert "shrunk in" in head and "seed=" in head and "batch=1 heads=1" in head
    repro = tmp_path / "repro.py"
    repro.write_text(script)
    again = subprocess.run(
        [sys.executable, str(repro)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 1, again.stdout + again.stderr
    quantity = head.split(": ", 2)[2].split(" has relative RMS error")[0]
    assert any(
        line.startswith(quantity) and line.endswith("FAILS") for line in again.stdout.splitlines()
    ), again.stdout


def test_a_reproducer_keeps_inputs_named_like_its_own_variables(tmp_path: Path) -> None:
    """Mamba-2's input B rebound the reproducer's batch size B, and every draw after it failed:
    the spec's names are only keys of the script's dicts now."""
    path = ROOT / "specs" / "mamba2.mix"
    module = tmp_path / "mamba2_mutant.py"
    module.write_text(mutate(mixc.compile_source(path), "_ys.append(", "_ys.append(1.01 * "))
    report = fuzz(path, module, examples=3, shrink=False)
    assert not report.ok
    script = reproducer(input_ranges(path), report.failure, str(path), str(module))
    assert "\nB = " not in script and 'drawn["input", "B"] = ' in script
    with pytest.raises(SystemExit) as done:
        exec(compile(script, str(tmp_path / "repro.py"), "exec"), {})
    assert done.value.code is True


def test_a_reproducer_runs_for_sizes_named_like_its_own_names(tmp_path: Path) -> None:
    """The script binds torch, F, spec, module, gen, drawn and x; the spec's sizes (here named
    like two of them) are written as numbers, so the script still reproduces the failure."""
    text = (ROOT / "specs" / "gated_retention.mix").read_text()
    text = text.replace("[V, K]", "[gen, torch]").replace("[K]", "[torch]").replace("[V]", "[gen]")
    assert "[torch]" in text and "[gen, torch]" in text
    spec_path = tmp_path / "named.mix"
    spec_path.write_text(text)
    (gr_mutant,) = [
        m for m in MUTANTS if m[:2] == ("gated_retention", "intra-chunk mask misses the diagonal")
    ]
    module = tmp_path / "named_mutant.py"
    module.write_text(mutate(mixc.compile_source(spec_path), *gr_mutant[2:4]))
    report = fuzz(spec_path, module, examples=15, shrink=False)  # any failing example will do
    assert not report.ok
    script = reproducer(
        input_ranges(mixc.load_spec(spec_path)), report.failure, str(spec_path), str(module)
    )
    assert "# sizes: " in script
    repro = tmp_path / "repro.py"
    repro.write_text(script)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    run = subprocess.run(
        [sys.executable, str(repro)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 1 and "FAILS" in run.stdout, run.stdout + run.stderr
