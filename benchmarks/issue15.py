"""RWKV-6, mLSTM and DeltaProduct (issue 15): agreement with flash-linear-attention's RWKV-6 and
gated DeltaProduct references, and each spec's chunked forward against its recurrent form and
against fla's references.

Writes the section between the ISSUE15 markers of benchmarks/RESULTS.md. One command:

    python benchmarks/issue15.py            # a few minutes on 2 cores

fla's references (`fla/ops/rwkv6/recurrent_naive.py`, `chunk_naive.py` and
`fla/ops/gated_delta_product/naive.py` of the fla-core package) are loaded by file path, in the benchmark's environment only (see README.md here). Outputs are
compared in float64 before any timing; the two sides of each ratio are timed in alternation in
one process (peers.time_alternating), medians over the timed calls.
"""

from __future__ import annotations

import datetime
import os
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from peers import _load_fla, _rel, time_alternating  # noqa: E402

import mixc  # noqa: E402
from mixc.check import sample_inputs  # noqa: E402

B, NH, D = 1, 4, 64
PEER_T, RECURRENT_T = 4096, 8192
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
BEGIN, END = "<!-- ISSUE15 BEGIN -->", "<!-- ISSUE15 END -->"


def _fla(file: str, function: str, ops: str = "rwkv6"):
    return getattr(_load_fla(ops, file), function)


def _rwkv6_inputs(T: int, dtype):
    """r, k, v [B, T, NH, D], w <= 0 (RWKV-6's -exp(.)), u [NH, D], state [B, NH, V, K]."""
    gen = torch.Generator().manual_seed(0)
    r, k, v = (torch.randn(B, T, NH, D, generator=gen, dtype=torch.float64) for _ in range(3))
    w = -torch.exp(torch.randn(B, T, NH, D, generator=gen, dtype=torch.float64) - 2)
    u = torch.randn(NH, D, generator=gen, dtype=torch.float64)
    H0 = torch.randn(B, NH, D, D, generator=gen, dtype=torch.float64)
    return [x.to(dtype) for x in (r, k, v, w)], u.to(dtype), H0.to(dtype)


def _head_major(*xs):
    return [x.transpose(1, 2).contiguous() for x in xs]


def agreement() -> list[tuple[str, float]]:
    """Relative errors, float64, of mixc's forms against fla's references (q scaled alike)."""
    module = mixc.load(ROOT / "specs/rwkv6.mix")
    recurrent = _fla("recurrent_naive", "naive_recurrent_rwkv6")
    chunked = _fla("chunk_naive", "naive_chunk_rwkv6")
    (r, k, v, w), u, H0 = _rwkv6_inputs(256, torch.float64)
    scale = D**-0.5
    ours, ours_final = module.chunk(
        r * scale, k, v, w, u, initial_state=H0, output_final_state=True, chunk_size=32
    )
    theirs, final = recurrent(
        *_head_major(r, k, v, w), u, scale=scale, initial_state=H0.mT, output_final_state=True
    )
    rows = [
        (
            "chunk vs naive_recurrent_rwkv6 (output, initial state)",
            _rel(ours, theirs.transpose(1, 2)),
        ),
        ("chunk vs naive_recurrent_rwkv6 (final state)", _rel(ours_final.mT, final)),
    ]
    ours_r, _ = module.recurrent(r * scale, k, v, w, u, initial_state=H0)
    rows.append(("recurrent vs naive_recurrent_rwkv6", _rel(ours_r, theirs.transpose(1, 2))))
    ours0, _ = module.chunk(r * scale, k, v, w, u, chunk_size=32)
    theirs0 = chunked(*_head_major(r * scale, k, v, w), u, chunk_size=32)
    rows.append(("chunk vs naive_chunk_rwkv6 (zero state)", _rel(ours0, theirs0.transpose(1, 2))))
    return rows


#: DeltaProduct with a decay on each token's first step, as fla's gated_delta_product applies it.
GATED_DELTAPRODUCT = (
    (ROOT / "specs/deltaproduct.mix")
    .read_text(encoding="utf-8")
    .replace(
        "in    q[K], k1[K], v1[V], b1, k2[K], v2[V], b2",
        "in    q[K], k1[K], v1[V], b1, k2[K], v2[V], b2, g",
    )
    .replace("U_t = H_{t-1} (I", "U_t = exp(g_t) H_{t-1} (I")
)


def _deltaproduct_inputs(T: int, dtype):
    """q, k1, v1, k2, v2 [B, T, NH, D], erase strengths b1, b2 in (0, 1) (the spec's 2 b in
    (0, 2)), log-decays g <= 0 [B, T, NH], state [B, NH, V, K]."""
    gen = torch.Generator().manual_seed(0)
    q, k1, v1, k2, v2 = (
        torch.randn(B, T, NH, D, generator=gen, dtype=torch.float64) for _ in range(5)
    )
    b1, b2 = (torch.rand(B, T, NH, generator=gen, dtype=torch.float64) for _ in range(2))
    g = -torch.rand(B, T, NH, generator=gen, dtype=torch.float64) * 0.5
    H0 = torch.randn(B, NH, D, D, generator=gen, dtype=torch.float64)
    return [x.to(dtype) for x in (q, k1, v1, b1, k2, v2, b2)], g.to(dtype), H0.to(dtype)


def _householder_layout(k1, v1, b1, k2, v2, b2):
    """fla's num_householder=2 layout: each token's two steps at 2t and 2t + 1 along T, the
    keys normalised (the spec normalises its own) and the erase strengths 2 b."""
    unit = torch.nn.functional.normalize

    def steps(a, b):
        return torch.stack([a, b], 2).flatten(1, 2)

    return steps(unit(k1, dim=-1), unit(k2, dim=-1)), steps(v1, v2), steps(2 * b1, 2 * b2)


def deltaproduct_agreement() -> list[tuple[str, float]]:
    """Relative errors, float64, of mixc's DeltaProduct forms against fla's
    naive_recurrent_gated_delta_product (num_householder=2, scale 1), without and with a gate."""
    reference = _fla("naive", "naive_recurrent_gated_delta_product", ops="gated_delta_product")
    (q, k1, v1, b1, k2, v2, b2), g, H0 = _deltaproduct_inputs(256, torch.float64)
    k, v, beta = _householder_layout(k1, v1, b1, k2, v2, b2)
    rows = []
    for label, module, gate in (
        ("deltaproduct", mixc.load(ROOT / "specs/deltaproduct.mix"), None),
        ("gated (g on the first step)", mixc.load(text=GATED_DELTAPRODUCT), g),
    ):
        args = [q, k1, v1, b1, k2, v2, b2] + ([] if gate is None else [gate])
        theirs, final = reference(
            q,
            k,
            v,
            gate,
            beta,
            1.0,
            initial_state=H0.mT.clone(),
            output_final_state=True,
            num_householder=2,
        )
        for form in ("chunk", "recurrent"):
            options = {"chunk_size": 32} if form == "chunk" else {}
            ours, ours_final = getattr(module, form)(
                *args, initial_state=H0, output_final_state=True, **options
            )
            rows.append(
                (f"{label}: {form} vs naive_recurrent_gated_delta_product", _rel(ours, theirs))
            )
            rows.append((f"{label}: {form} final state", _rel(ours_final.mT, final)))
    return rows


def _median_ratio(times: dict, slow: str, fast: str) -> tuple[float, float, float]:
    a, b = statistics.median(times[slow]), statistics.median(times[fast])
    return a / b, a, b


def timings() -> list[tuple[str, float, float, float]]:
    """(comparison, ratio of medians, the slower side's median s, the faster side's median s)."""
    torch.set_num_threads(2)
    rows = []
    rwkv6 = mixc.load(ROOT / "specs/rwkv6.mix")
    scale = D**-0.5

    def no_grad(fn, *args):
        def call():
            with torch.no_grad():
                fn(*args)

        return call

    for T in (PEER_T, RECURRENT_T):
        (r, k, v, w), u, _ = _rwkv6_inputs(T, torch.float32)
        calls = {"chunk": no_grad(lambda *a: rwkv6.chunk(*a, chunk_size=32), r * scale, k, v, w, u)}
        if T == RECURRENT_T:
            calls["recurrent"] = no_grad(rwkv6.recurrent, r * scale, k, v, w, u)
            fla = _fla("recurrent_naive", "naive_recurrent_rwkv6")
            calls["fla naive_recurrent_rwkv6"] = no_grad(fla, *_head_major(r, k, v, w), u)
        else:
            fla = _fla("chunk_naive", "naive_chunk_rwkv6")
            calls["fla naive_chunk_rwkv6"] = no_grad(fla, *_head_major(r * scale, k, v, w), u)
        repeats = {name: 5 if name == "chunk" else 2 for name in calls}
        times = time_alternating(calls, repeats, warmup=1)
        for name in calls:
            if name != "chunk":
                rows.append((f"rwkv6 T={T}: {name} / chunk", *_median_ratio(times, name, "chunk")))
    mlstm = mixc.load(ROOT / "specs/mlstm.mix")
    spec = mixc.load_spec(ROOT / "specs/mlstm.mix")
    sizes = {"K": D, "V": D}
    args = sample_inputs(spec, sizes, RECURRENT_T, batch=B, heads=NH)
    calls = {
        "chunk": no_grad(lambda *a: mlstm.chunk(*a, chunk_size=64), *args),
        "recurrent": no_grad(mlstm.recurrent, *args),
    }
    times = time_alternating(calls, {"chunk": 5, "recurrent": 2}, warmup=1)
    rows.append(
        (f"mlstm T={RECURRENT_T}: recurrent / chunk", *_median_ratio(times, "recurrent", "chunk"))
    )
    deltaproduct = mixc.load(ROOT / "specs/deltaproduct.mix")
    args, _, _ = _deltaproduct_inputs(RECURRENT_T, torch.float32)
    calls = {
        "chunk": no_grad(lambda *a: deltaproduct.chunk(*a), *args),
        "recurrent": no_grad(deltaproduct.recurrent, *args),
    }
    times = time_alternating(calls, {"chunk": 5, "recurrent": 2}, warmup=1)
    rows.append(
        (
            f"deltaproduct T={RECURRENT_T}: recurrent / chunk",
            *_median_ratio(times, "recurrent", "chunk"),
        )
    )
    return rows


def report(agree, dp_agree, times) -> str:
    lines = [
        BEGIN,
        "## RWKV-6, mLSTM and DeltaProduct (issue 15)",
        "",
        f"`python benchmarks/issue15.py`, {datetime.date.today()}: CPU, 2 threads, fp32, B={B}, "
        f"NH={NH}, d_k=d_v={D}, forward only, load average {os.getloadavg()[0]:.1f} at the end. "
        "On a shared machine the absolute times are noisy, the ratios (both sides timed in "
        "alternation in one process, medians) less so.",
        "",
        "| agreement (RWKV-6, T=256, q scaled by 1/sqrt(d_k) on both sides; float64 inputs, which "
        "fla's references compute in float32) | relative error |",
        "| --- | --- |",
        *(f"| {what} | {err:.1e} |" for what, err in agree),
        "",
        "| agreement (DeltaProduct, T=256, 2 steps a token as fla's num_householder=2 layout, "
        "scale 1, from an initial state; float64 inputs, which fla's reference computes in "
        "float32) | relative error |",
        "| --- | --- |",
        *(f"| {what} | {err:.1e} |" for what, err in dp_agree),
        "",
        "| comparison | time ratio (other / chunk) | other (s) | chunk (s) |",
        "| --- | --- | --- | --- |",
        *(f"| {what} | {ratio:.1f}x | {a:.3f} | {b:.3f} |" for what, ratio, a, b in times),
        "",
        "mLSTM's chunked form runs the stabilised scalar-decay kernel (chunk by chunk through "
        "autograd, no own backward yet); RWKV-6's the diagonal kernel with each query moved one "
        "token earlier; DeltaProduct's the delta kernel over 2 T sub-tokens (its default chunk "
        "size, 32 sub-tokens).",
        END,
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    agree, dp_agree = agreement(), deltaproduct_agreement()
    for what, err in agree + dp_agree:
        print(f"{what}: {err:.1e}")
        if err > 1e-5:  # fla's references compute in float32 whatever they are given
            raise SystemExit(f"disagreement: {what}")
    times = timings()
    for row in times:
        print(row)
    text = RESULTS.read_text(encoding="utf-8")
    section = report(agree, dp_agree, times)
    if BEGIN in text:
        text = text[: text.index(BEGIN)] + section + text[text.index(END) + len(END) + 1 :]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    RESULTS.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
