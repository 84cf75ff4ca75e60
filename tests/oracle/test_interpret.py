"""The reference interpreter against float64 loops of each mixer's math, written out by hand.

Each reference below runs one (batch, head) sequence with plain 1-D/2-D tensors, in the form the
papers write the recurrence, and shares nothing with mixc but the input layout.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mixc import MixcError, load_spec
from mixc.frontend.ir import FUNCTIONS as IR_FUNCTIONS
from mixc.oracle.interpret import FUNCTIONS, interpret

#: The shipped specs, then the examples' (mixers not shipped yet): each has a reference below.
SPECS = sorted((Path(__file__).parents[2] / "specs").glob("*.mix")) + sorted(
    (Path(__file__).parents[2] / "examples" / "specs").glob("*.mix")
)
BATCH, STEPS, HEADS, DK, DV, CODES, DM = 2, 9, 3, 4, 5, 3, 6
TOL = {"rtol": 1e-12, "atol": 1e-12}
f64 = torch.float64


# --- hand-written references: one sequence, x[name] is [T, ...], p[name] a per-head value ---


def outer(a, b):
    return a[:, None] * b[None, :]


def ref_linear_attention(x, p, s):
    H, ys = s["H"], []
    for t in range(len(x["q"])):
        H = H + outer(x["v"][t], x["k"][t])
        ys.append(H @ x["q"][t])
    return {"y": ys}, {"H": H}


def ref_linear_attention_normalized(x, p, s):
    def phi(u):  # elu(u) + 1
        return torch.where(u > 0, u + 1, torch.exp(u))

    H, z, ys = s["H"], s["z"], []
    for t in range(len(x["q"])):
        H = H + outer(x["v"][t], phi(x["k"][t]))
        z = z + phi(x["k"][t])
        ys.append((H @ phi(x["q"][t])) / torch.dot(z, phi(x["q"][t])))
    return {"y": ys}, {"H": H, "z": z}


def ref_retnet(x, p, s):
    H, ys = s["H"], []
    for t in range(len(x["q"])):
        H = p["gamma"] * H + outer(x["v"][t], x["k"][t])
        ys.append(H @ x["q"][t])
    return {"y": ys}, {"H": H}


def ref_gated_retention(x, p, s):
    H, ys = s["H"], []
    for t in range(len(x["q"])):
        decay = 1 / (1 + math.exp(-float(x["a"][t])))
        H = decay * H + outer(x["v"][t], x["k"][t])
        ys.append(H @ x["q"][t])
    return {"y": ys}, {"H": H}


def ref_gla(x, p, s):
    H, ys = s["H"], []
    for t in range(len(x["q"])):
        H = H * torch.exp(x["g"][t])[None, :] + outer(x["v"][t], x["k"][t])  # column j * alpha_j
        ys.append(H @ x["q"][t])
    return {"y": ys}, {"H": H}


def ref_rwkv6(x, p, s):
    """Finch's wkv: the output reads the state before the token, plus the bonus u for the
    token's own key and value."""
    H, ys = s["H"], []
    for t in range(len(x["r"])):
        r, k, v = x["r"][t], x["k"][t], x["v"][t]
        ys.append(H @ r + torch.dot(r, p["u"] * k) * v)
        H = H * torch.exp(x["w"][t])[None, :] + outer(v, k)
    return {"y": ys}, {"H": H}


def ref_mlstm(x, p, s):
    """xLSTM's mLSTM cell without its stabiliser (float64 holds exp(i) for these gates)."""
    H, n, ys = s["H"], s["n"], []
    for t in range(len(x["q"])):
        forget, write = torch.sigmoid(x["f"][t]), torch.exp(x["i"][t])
        H = forget * H + write * outer(x["v"][t], x["k"][t])
        n = forget * n + write * x["k"][t]
        ys.append(H @ x["q"][t] / torch.clamp(torch.dot(n, x["q"][t]).abs(), min=1.0))
    return {"y": ys}, {"H": H, "n": n}


def ref_gated_general(x, p, s):
    H, ys = s["H"], []
    for t in range(len(x["q"])):
        H = x["G"][t] * H + outer(x["v"][t], x["k"][t])
        ys.append(H @ x["q"][t])
    return {"y": ys}, {"H": H}


def ref_deltanet(x, p, s):
    H, ys = s["H"], []
    for t in range(len(x["q"])):
        k, v, beta = x["k"][t], x["v"][t], x["beta"][t]
        H = H - beta * outer(H @ k, k) + beta * outer(v, k)
        ys.append(H @ x["q"][t])
    return {"y": ys}, {"H": H}


def ref_deltanet_negeig(x, p, s):
    """DeltaNet with erase and write scaled by 2 beta_t (a reflection at beta_t = 1)."""
    H, ys = s["H"], []
    for t in range(len(x["q"])):
        k, v, b2 = x["k"][t], x["v"][t], 2 * x["beta"][t]
        H = H @ (torch.eye(len(k), dtype=k.dtype) - b2 * outer(k, k)) + b2 * outer(v, k)
        ys.append(H @ x["q"][t])
    return {"y": ys}, {"H": H}


def ref_deltaproduct(x, p, s):
    H, ys, us = s["H"], [], []
    for t in range(len(x["q"])):
        for n in ("1", "2"):  # two delta steps a token, each with erase strength 2 b
            k = x["k" + n][t] / (x["k" + n][t].square().sum() + 1e-6).sqrt()  # l2norm, its eps
            v, beta = x["v" + n][t], 2 * x["b" + n][t]
            H = H - beta * outer(H @ k, k) + beta * outer(v, k)
            if n == "1":
                us.append(H)  # the per-token value U_t, the state after the first step
        ys.append(H @ x["q"][t])
    return {"y": ys, "U": us}, {"H": H}


def ref_gated_deltanet(x, p, s):
    H, ys = s["H"], []
    for t in range(len(x["q"])):
        k, v, beta = x["k"][t], x["v"][t], x["beta"][t]
        H = math.exp(float(x["g"][t])) * (H - beta * outer(H @ k, k)) + beta * outer(v, k)
        ys.append(H @ x["q"][t])
    return {"y": ys}, {"H": H}


def ref_kda(x, p, s):
    """Kimi Linear's form: decay each key channel, then the delta rule."""
    H, ys = s["H"], []
    for t in range(len(x["q"])):
        k, v, beta = x["k"][t], x["v"][t], x["beta"][t]
        H = H * torch.exp(x["g"][t])[None, :]
        H = H - beta * outer(H @ k, k) + beta * outer(v, k)
        ys.append(H @ x["q"][t])
    return {"y": ys}, {"H": H}


def ref_comba(x, p, s):
    """Comba's procedure: decay, then correct the value by the state read with its own key
    p = sigmoid(d) * k (fla's Comba layer's inner decay), then write along k."""
    H, ys, read_keys = s["H"], [], []
    for t in range(len(x["q"])):
        H = math.exp(float(x["g"][t])) * H
        read_key = torch.sigmoid(x["d"][t]) * x["k"][t]
        correction = x["beta"][t] * (x["v"][t] - H @ read_key)
        H = H + outer(correction, x["k"][t])
        ys.append(H @ x["q"][t])
        read_keys.append(read_key)
    return {"p": read_keys, "y": ys}, {"H": H}


def ref_gdn2(x, p, s):
    """GDN-2's procedure: decay each key channel, read at the gated key b * k, write w * v minus
    what was read."""
    H, ys = s["H"], []
    for t in range(len(x["q"])):
        k = x["k"][t]
        H = H * torch.exp(x["g"][t])[None, :]
        H = H + outer(x["w"][t] * x["v"][t] - H @ (x["b"][t] * k), k)
        ys.append(H @ x["q"][t])
    return {"y": ys}, {"H": H}


def ref_gated_oja(x, p, s):
    """The gated Oja rule: decay each value channel, then correct the key by the state read with
    v (Oja's rule, on the value side), then write."""
    H, ys = s["H"], []
    for t in range(len(x["q"])):
        v = x["v"][t] / (x["v"][t].square().sum() + 1e-6).sqrt()  # l2norm, its eps
        H = torch.exp(x["gv"][t])[:, None] * H
        H = H + outer(v, x["beta"][t] * (x["k"][t] - H.T @ v))
        ys.append(H @ x["q"][t])
    return {"y": ys}, {"H": H}


def ref_rwkv7(x, p, s):
    """RWKV-7's form: S (diag(w) - kk^T (a * kk)) + v k^T, in the spec's H layout."""
    H, ys = s["H"], []
    for t in range(len(x["q"])):
        w = torch.exp(-math.exp(-0.5) * torch.sigmoid(x["d"][t]))
        kappa = x["kappa"][t]
        kk = kappa / torch.sqrt((kappa * kappa).sum() + 1e-6)
        a = torch.sigmoid(x["alpha"][t])
        H = H * w[None, :] - outer(H @ kk, a * kk) + outer(x["v"][t], x["k"][t])
        ys.append(H @ x["q"][t])
    return {"y": ys}, {"H": H}


def ref_mamba2(x, p, s):
    H, ys = s["H"], []
    for t in range(len(x["x"])):
        dt = x["dt"][t]
        H = torch.exp(dt * p["A"]) * H + outer(dt * x["x"][t], x["B"][t])
        ys.append(H @ x["C"][t] + p["D"] * x["x"][t])
    return {"y": ys}, {"H": H}


def ref_mamba3_trapezoid(x, p, s):
    """The trapezoid rule between the previous token's input and this one's (Mamba-3's eq. for
    h_t with alpha = exp(dt A), beta = (1 - lam) dt alpha, gamma = lam dt), nothing before the
    first token."""
    H, ys, alphas, lams = s["H"], [], [], []
    before = torch.zeros_like(outer(x["x"][0], x["B"][0]))
    for t in range(len(x["x"])):
        dt, lam = x["dt"][t], torch.sigmoid(x["l"][t])
        alpha = torch.exp(dt * p["A"])
        now = outer(x["x"][t], x["B"][t])
        H = alpha * H + (1 - lam) * dt * alpha * before + lam * dt * now
        before = now
        ys.append(H @ x["C"][t] + p["D"] * x["x"][t])
        alphas.append(alpha)
        lams.append(lam)
    last = {"x_{t-1}": x["x"][-1], "B_{t-1}": x["B"][-1]}  # what a step carries to the next
    return {"y": ys, "a": alphas, "lam": lams}, {"H": H, **last}


def ref_mamba3(x, p, s):
    """Mamba-3 SISO (mamba3_siso_step_ref in state-spaces/mamba's tests): angles summed as
    pi dt tanh(w) per pair, B + B_bias and C + C_bias turned by them on pairs (2i, 2i + 1), the
    trapezoid's previous key turned by its own token's angles, D x added before silu(z)."""
    R = len(x["w"][0])
    first, second = [2 * i for i in range(R)], [2 * i + 1 for i in range(R)]
    H, theta, ys, alphas, lams = s["H"], s["Th"], [], [], []
    before = torch.zeros_like(H)
    for t in range(len(x["x"])):
        dt, lam = x["dt"][t], torch.sigmoid(x["l"][t])
        theta = theta + math.pi * dt * torch.tanh(x["w"][t])
        key = turn_pairs(x["B"][t] + p["B_bias"], theta.tolist(), first, second)
        query = turn_pairs(x["C"][t] + p["C_bias"], theta.tolist(), first, second)
        alpha = torch.exp(-dt * x["A"][t])
        now = outer(x["x"][t], key)
        H = alpha * H + (1 - lam) * dt * alpha * before + lam * dt * now
        before = now
        z = x["z"][t]
        ys.append((H @ query + p["D"] * x["x"][t]) * z * torch.sigmoid(z))
        alphas.append(alpha)
        lams.append(lam)
    last = {"x_{t-1}": x["x"][-1], "B_{t-1}": x["B"][-1]}
    return {"y": ys, "a": alphas, "lam": lams}, {"Th": theta, "H": H, **last}


def ref_mamba3_mimo(x, p, s):
    """Mamba-3 MIMO at rank 2 (mamba3_MIMO_step_ref in state-spaces/mamba's tests, with its
    kernels' pairing): rank r's value mimo_x_r x, key B_r + B_r_bias and query C_r + C_r_bias,
    both turned by the summed angles on pairs (i, i + N/2); the trapezoid's previous keys turned
    by their own token's angles; y = sum_r mimo_o_r (H q_r + D v_r) silu(mimo_z_r z)."""
    R, N = len(x["w"][0]), len(x["B1"][0])
    first, second = list(range(R)), [N // 2 + i for i in range(R)]
    H, theta, ys, alphas, lams = s["H"], s["Th"], [], [], []
    before = torch.zeros_like(H)
    for t in range(len(x["x"])):
        dt, lam = x["dt"][t], torch.sigmoid(x["l"][t])
        theta = theta + math.pi * dt * torch.tanh(x["w"][t])
        values = [p[f"mimo_x{r}"] * x["x"][t] for r in (1, 2)]
        keys = [
            turn_pairs(x[f"B{r}"][t] + p[f"B{r}_bias"], theta.tolist(), first, second)
            for r in (1, 2)
        ]
        now = outer(values[0], keys[0]) + outer(values[1], keys[1])
        alpha = torch.exp(-dt * x["A"][t])
        H = alpha * H + (1 - lam) * dt * alpha * before + lam * dt * now
        before = now
        y = 0
        for r in (1, 2):
            query = turn_pairs(x[f"C{r}"][t] + p[f"C{r}_bias"], theta.tolist(), first, second)
            gate = p[f"mimo_z{r}"] * x["z"][t]
            out = H @ query + p["D"] * values[r - 1]
            y = y + p[f"mimo_o{r}"] * out * gate * torch.sigmoid(gate)
        ys.append(y)
        alphas.append(alpha)
        lams.append(lam)
    last = {"x_{t-1}": x["x"][-1], "B1_{t-1}": x["B1"][-1], "B2_{t-1}": x["B2"][-1]}
    return {"y": ys, "a": alphas, "lam": lams}, {"Th": theta, "H": H, **last}


def ref_gla_rank2(x, p, s):
    H, ys = s["H"], []
    for t in range(len(x["q"])):
        write = outer(x["v1"][t], x["k1"][t]) + outer(x["v2"][t], x["k2"][t])
        H = H * torch.exp(x["g"][t])[None, :] + write
        ys.append(H @ x["q"][t])
    return {"y": ys}, {"H": H}


def _backward(x, s, update):
    """A backward state (updated from the next token) from its initial state after the last
    token: its value at every token t and, last, at T (its initial state)."""
    G, values = s["G"], [s["G"]]
    for t in reversed(range(len(next(iter(x.values()))))):
        G = update(G, t)
        values.append(G)
    return values[::-1]


def ref_hydra(x, p, s):
    """y_t = H_{t-1} C_t + G_{t+1} Cb_t + D x_t, H forward and G backward (Mamba-2 each)."""
    G = _backward(
        x,
        s,
        lambda G, t: (
            torch.exp(x["dtb"][t] * p["A"]) * G + outer(x["dtb"][t] * x["x"][t], x["Bb"][t])
        ),
    )
    H, ys = s["H"], []
    for t in range(len(x["x"])):
        ys.append(H @ x["C"][t] + G[t + 1] @ x["Cb"][t] + p["D"] * x["x"][t])
        H = torch.exp(x["dt"][t] * p["A"]) * H + outer(x["dt"][t] * x["x"][t], x["B"][t])
    return {"y": ys}, {"H": H, "G": G[0]}


def ref_bidirectional_gla(x, p, s):
    G = _backward(
        x, s, lambda G, t: G * torch.exp(x["gb"][t])[None, :] + outer(x["v"][t], x["k"][t])
    )
    H, ys = s["H"], []
    for t in range(len(x["q"])):
        H = H * torch.exp(x["g"][t])[None, :] + outer(x["v"][t], x["k"][t])
        ys.append(H @ x["q"][t] + G[t + 1] @ x["q"][t])
    return {"y": ys}, {"H": H, "G": G[0]}


def ref_mamba1(x, p, s):
    H, ys = s["H"], []
    for t in range(len(x["x"])):
        dt = x["dt"][t]
        H = torch.exp(dt[:, None] * p["A"]) * H + outer(dt * x["x"][t], x["B"][t])
        ys.append(H @ x["C"][t] + p["D"] * x["x"][t])
    return {"y": ys}, {"H": H}


def ref_hgrn(x, p, s):
    c, ys = s["c"], []
    for t in range(len(x["i"])):
        f = torch.sigmoid(x["f"][t])
        c = f * c + (1 - f) * x["i"][t]
        ys.append(x["o"][t] * c)
    return {"y": ys}, {"c": c}


def ref_ema(x, p, s):
    m, ys = s["m"], []
    for t in range(len(x["x"])):
        m = 0.9 * m + 0.1 * x["x"][t]
        ys.append(m)
    return {"y": ys}, {"m": m}


# --- inputs: names, shapes and ranges that keep each recurrence stable ---


def turn_pairs(u, angles, first, second):
    """u with each pair (first[i], second[i]) of entries turned by angles[i]."""
    out = u.clone()
    for i, (a, b) in enumerate(zip(first, second, strict=True)):
        c, s = math.cos(angles[i]), math.sin(angles[i])
        out[a], out[b] = c * u[a] - s * u[b], s * u[a] + c * u[b]
    return out


def roformer(u, t):
    """RoFormer's rotation (arXiv 2104.09864, eq. 34): pairs (2i, 2i + 1), angle t 10000^(-2i/d)."""
    d = len(u)
    pairs = range(d // 2)
    angles = [t * 10000 ** (-2 * i / d) for i in pairs]
    return turn_pairs(u, angles, [2 * i for i in pairs], [2 * i + 1 for i in pairs])


def ref_linear_attention_rope(x, p, s):
    H, ys = s["H"], []
    for t in range(len(x["q"])):
        H = H + outer(x["v"][t], roformer(x["k"][t], t))
        ys.append(H @ roformer(x["q"][t], t))
    return {"y": ys}, {"H": H, "pos": torch.tensor(float(len(ys)), dtype=f64)}


def ref_retnet_xpos(x, p, s):
    """Retention with xPos as its paper writes it: the query scaled by zeta^(t/512), the key by
    zeta^(-t/512) (per pair), after their rotations; S_t = gamma S_{t-1} + v_t k~_t^T,
    y_t = S_t q~_t. The spec's state is S_t diag(zeta^(t/512)), so S starts from H diag(zeta^(1/512))."""
    d = len(x["q"][0])
    gamma = 1 - 2 ** (-5 - p["h"])
    zeta = torch.tensor([(2 * (c // 2) + 0.4 * d) / (1.4 * d) for c in range(d)], dtype=f64)
    S, ys = s["H"] * zeta ** (1 / 512), []
    for t in range(len(x["q"])):
        key = zeta ** (-t / 512) * roformer(x["k"][t] / math.sqrt(d), t)
        S = gamma * S + outer(x["v"][t], key)
        ys.append(S @ (zeta ** (t / 512) * roformer(x["q"][t], t)))
    final = {"H": S * zeta ** (t / 512), "pos": torch.tensor(float(t + 1), dtype=f64)}
    return {"y": ys}, final


def ref_transformer_vq(x, p, s):
    """Each key replaced by its nearest code (Lingle 2023, arXiv 2309.16354); softmax attention
    over the quantised keys kept as sums of values and counts per code."""
    C, d = p["C"], len(x["q"][0])
    H, n, out = s["H"], s["n"], {"z": [], "p": [], "y": []}
    for t in range(len(x["q"])):
        code = int(((x["k"][t][None, :] - C) ** 2).sum(-1).argmin())
        H, n = H.clone(), n.clone()
        H[:, code] += x["v"][t]
        n[code] += 1
        weights = torch.exp(C @ x["q"][t] / math.sqrt(d))
        out["z"].append(torch.eye(len(C), dtype=f64)[code])
        out["p"].append(weights / weights.sum())
        out["y"].append(H @ weights / (n @ weights))
    return out, {"H": H, "n": n}


def l2n(x):
    """mixc's l2norm: x / sqrt(sum(x^2) + 1e-6)."""
    return x / torch.sqrt((x * x).sum() + 1e-6)


def ref_gsa(x, p, s):
    """Gated Slot Attention as the paper writes it: two slot memories, a softmax over slots."""
    Ks, Vs, out = s["Ks"], s["Vs"], {"s": [], "p": [], "y": []}
    for t in range(len(x["q"])):
        a, k, q = torch.sigmoid(x["a"][t]), l2n(x["k"][t]), l2n(x["q"][t])
        Ks = a[:, None] * Ks + outer(1 - a, k)
        Vs = Vs * a[None, :] + outer(x["v"][t], 1 - a)
        out["s"].append(Ks @ q)
        out["p"].append(torch.softmax(Ks @ q, 0))
        out["y"].append(Vs @ out["p"][-1])
    return out, {"Ks": Ks, "Vs": Vs}


def ref_precond_gdn(x, p, s):
    """fla's preconditioned gated delta rule: a diagonal energy state rescales the write key."""
    A, H, out = s["A"], s["H"], {n: [] for n in ("r", "s", "kp", "y")}
    for t in range(len(x["q"])):
        k, v, beta = l2n(x["k"][t]), x["v"][t], x["beta"][t]
        A = torch.sigmoid(x["a"][t]) * A + torch.sigmoid(x["b"][t]) * k * k
        r = torch.log(A.abs() + 1e-6) - p["center"]
        kp = k * torch.exp(-torch.log(p["x"]) * r / (1 + r.abs()))
        H = torch.exp(x["g"][t]) * H
        H = H + beta * outer(v - H @ k, kp)
        out["r"].append(r)
        out["s"].append(r / (1 + r.abs()))
        out["kp"].append(kp)
        out["y"].append(H @ l2n(x["q"][t]))
    return out, {"A": A, "H": H}


def ref_stacked(x, p, s):
    H1, H2, os, ys = s["H1"], s["H2"], [], []
    for t in range(len(x["q"])):
        H1 = torch.exp(x["g"][t]) * H1 + outer(x["v"][t], x["k"][t])
        os.append(H1 @ x["q"][t])
        H2 = H2 + outer(os[-1], x["u"][t])
        ys.append(H2 @ x["q2"][t])
    return {"o": os, "y": ys}, {"H1": H1, "H2": H2}


def randn(g, *shape):
    return torch.randn(*shape, generator=g, dtype=f64)


def rand(g, *shape):
    return torch.rand(*shape, generator=g, dtype=f64)


def qkv(g):
    lead = (BATCH, STEPS, HEADS)
    return {"q": randn(g, *lead, DK), "k": randn(g, *lead, DK), "v": randn(g, *lead, DV)}


def unit_keys(ins):
    ins["k"] = ins["k"] / ins["k"].norm(dim=-1, keepdim=True)
    return ins


LEAD = (BATCH, STEPS, HEADS)
CASES = {
    "linear_attention": (ref_linear_attention, lambda g: (qkv(g), {})),
    "linear_attention_normalized": (ref_linear_attention_normalized, lambda g: (qkv(g), {})),
    "retnet": (
        ref_retnet,
        lambda g: (qkv(g), {"gamma": 0.5 + 0.5 * rand(g, HEADS)}),
    ),
    "gated_retention": (
        ref_gated_retention,
        lambda g: ({**qkv(g), "a": 2 * randn(g, *LEAD)}, {}),
    ),
    "gla": (
        ref_gla,
        lambda g: ({**qkv(g), "g": F.logsigmoid(randn(g, *LEAD, DK))}, {}),
    ),
    "mlstm": (
        ref_mlstm,
        lambda g: ({**qkv(g), "i": 3 * randn(g, *LEAD), "f": 2 * randn(g, *LEAD)}, {}),
    ),
    "rwkv6": (
        ref_rwkv6,
        lambda g: (
            {
                "r": randn(g, *LEAD, DK),
                "k": randn(g, *LEAD, DK),
                "v": randn(g, *LEAD, DV),
                "w": -torch.exp(randn(g, *LEAD, DK)),
            },
            {"u": randn(g, HEADS, DK)},
        ),
    ),
    "gated_general": (
        ref_gated_general,
        lambda g: ({**qkv(g), "G": rand(g, *LEAD, DV, DK)}, {}),
    ),
    "deltanet": (
        ref_deltanet,
        lambda g: (unit_keys({**qkv(g), "beta": rand(g, *LEAD)}), {}),
    ),
    "deltanet_negeig": (
        ref_deltanet_negeig,
        lambda g: (unit_keys({**qkv(g), "beta": rand(g, *LEAD)}), {}),
    ),
    "deltaproduct": (
        ref_deltaproduct,
        lambda g: (
            {
                "q": randn(g, *LEAD, DK),
                **{f"k{n}": randn(g, *LEAD, DK) for n in (1, 2)},
                **{f"v{n}": randn(g, *LEAD, DV) for n in (1, 2)},
                **{f"b{n}": rand(g, *LEAD) for n in (1, 2)},
            },
            {},
        ),
    ),
    "gated_deltanet": (
        ref_gated_deltanet,
        lambda g: (
            unit_keys({**qkv(g), "beta": rand(g, *LEAD), "g": F.logsigmoid(randn(g, *LEAD))}),
            {},
        ),
    ),
    "kda": (
        ref_kda,
        lambda g: (
            unit_keys({**qkv(g), "beta": rand(g, *LEAD), "g": F.logsigmoid(randn(g, *LEAD, DK))}),
            {},
        ),
    ),
    "comba": (
        ref_comba,
        lambda g: (
            {
                **unit_keys(qkv(g)),
                "d": 2 * randn(g, *LEAD, DK),
                "beta": rand(g, *LEAD),
                "g": F.logsigmoid(randn(g, *LEAD)),
            },
            {},
        ),
    ),
    "gdn2": (
        ref_gdn2,
        lambda g: (
            {
                **unit_keys(qkv(g)),
                "g": F.logsigmoid(randn(g, *LEAD, DK)),
                "b": rand(g, *LEAD, DK),
                "w": rand(g, *LEAD, DV),
            },
            {},
        ),
    ),
    "gated_oja": (
        ref_gated_oja,
        lambda g: (
            {
                **qkv(g),
                "v": F.normalize(randn(g, *LEAD, DV), dim=-1),
                "gv": F.logsigmoid(randn(g, *LEAD, DV)),
                "beta": rand(g, *LEAD),
            },
            {},
        ),
    ),
    "rwkv7": (
        ref_rwkv7,
        lambda g: (
            {
                **qkv(g),
                "d": randn(g, *LEAD, DK),
                "kappa": randn(g, *LEAD, DK),
                "alpha": randn(g, *LEAD, DK),
            },
            {},
        ),
    ),
    "mamba2": (
        ref_mamba2,
        lambda g: (
            {
                "x": randn(g, *LEAD, DV),
                "dt": F.softplus(randn(g, *LEAD)),
                "B": randn(g, *LEAD, DK),
                "C": randn(g, *LEAD, DK),
            },
            {"A": -0.2 - rand(g, HEADS), "D": randn(g, HEADS)},
        ),
    ),
    "mamba3_trapezoid": (
        ref_mamba3_trapezoid,
        lambda g: (
            {
                "x": randn(g, *LEAD, DV),
                "dt": F.softplus(randn(g, *LEAD)),
                "B": randn(g, *LEAD, DK),
                "C": randn(g, *LEAD, DK),
                "l": randn(g, *LEAD),
            },
            {"A": -0.2 - rand(g, HEADS), "D": randn(g, HEADS)},
        ),
    ),
    "mamba3": (
        ref_mamba3,
        lambda g: (
            {
                "x": randn(g, *LEAD, DV),
                "z": randn(g, *LEAD, DV),
                "dt": F.softplus(randn(g, *LEAD)),
                "A": rand(g, *LEAD),
                "B": randn(g, *LEAD, DK),
                "C": randn(g, *LEAD, DK),
                "l": randn(g, *LEAD),
                "w": randn(g, *LEAD, SIZES["R"]),
            },
            {"D": randn(g, HEADS), "B_bias": randn(g, HEADS, DK), "C_bias": randn(g, HEADS, DK)},
        ),
    ),
    "mamba3_mimo": (
        ref_mamba3_mimo,
        lambda g: (
            {
                "x": randn(g, *LEAD, DV),
                "z": randn(g, *LEAD, DV),
                "dt": F.softplus(randn(g, *LEAD)),
                "A": rand(g, *LEAD),
                **{f"{b}{r}": randn(g, *LEAD, DK) for b in "BC" for r in (1, 2)},
                "l": randn(g, *LEAD),
                "w": randn(g, *LEAD, SIZES["R"]),
            },
            {
                "D": randn(g, HEADS),
                **{f"{b}{r}_bias": randn(g, HEADS, DK) for b in "BC" for r in (1, 2)},
                **{f"mimo_{m}{r}": randn(g, HEADS, DV) for m in "xzo" for r in (1, 2)},
            },
        ),
    ),
    "gla_rank2": (
        ref_gla_rank2,
        lambda g: (
            {
                "q": randn(g, *LEAD, DK),
                "k1": randn(g, *LEAD, DK),
                "v1": randn(g, *LEAD, DV),
                "k2": randn(g, *LEAD, DK),
                "v2": randn(g, *LEAD, DV),
                "g": -rand(g, *LEAD, DK),
            },
            {},
        ),
    ),
    "mamba1": (
        ref_mamba1,
        lambda g: (
            {
                "x": randn(g, *LEAD, DV),
                "dt": F.softplus(randn(g, *LEAD, DV)),
                "B": randn(g, *LEAD, DK),
                "C": randn(g, *LEAD, DK),
            },
            {"A": -0.2 - rand(g, HEADS, DV, DK), "D": randn(g, HEADS, DV)},
        ),
    ),
    "hgrn": (
        ref_hgrn,
        lambda g: (
            {"i": randn(g, *LEAD, DV), "f": randn(g, *LEAD, DV), "o": randn(g, *LEAD, DV)},
            {},
        ),
    ),
    "ema": (ref_ema, lambda g: ({"x": randn(g, *LEAD, DV)}, {})),
    "linear_attention_rope": (ref_linear_attention_rope, lambda g: (qkv(g), {})),
    "retnet_xpos": (ref_retnet_xpos, lambda g: (qkv(g), {})),
    "transformer_vq": (ref_transformer_vq, lambda g: (qkv(g), {"C": randn(g, HEADS, CODES, DK)})),
    "gsa": (ref_gsa, lambda g: ({**qkv(g), "a": randn(g, *LEAD, DM)}, {})),
    "precond_gdn": (
        ref_precond_gdn,
        lambda g: (
            {
                **qkv(g),
                "a": randn(g, *LEAD),
                "g": F.logsigmoid(randn(g, *LEAD)),
                "b": randn(g, *LEAD),
                "beta": rand(g, *LEAD),
            },
            {"center": -0.5 * rand(g, HEADS), "x": 1 + rand(g, HEADS)},
        ),
    ),
    "stacked": (
        ref_stacked,
        lambda g: (
            {
                **qkv(g),
                "g": F.logsigmoid(randn(g, *LEAD)),
                "u": randn(g, *LEAD, DK),
                "q2": randn(g, *LEAD, DK),
            },
            {},
        ),
    ),
    "hydra": (
        ref_hydra,
        lambda g: (
            {
                "x": randn(g, *LEAD, DV),
                "dt": F.softplus(randn(g, *LEAD)),
                "B": randn(g, *LEAD, DK),
                "C": randn(g, *LEAD, DK),
                "dtb": F.softplus(randn(g, *LEAD)),
                "Bb": randn(g, *LEAD, DK),
                "Cb": randn(g, *LEAD, DK),
            },
            {"A": -0.2 - rand(g, HEADS), "D": randn(g, HEADS)},
        ),
    ),
    "bidirectional_gla": (
        ref_bidirectional_gla,
        lambda g: (
            {
                **qkv(g),
                "g": F.logsigmoid(randn(g, *LEAD, DK)),
                "gb": F.logsigmoid(randn(g, *LEAD, DK)),
            },
            {},
        ),
    ),
}
SIZES = {
    "K": DK,
    "V": DV,
    "P": DV,
    "N": DK,
    "S": CODES,
    "M": DM,
    "R": DK // 4,
}  # R < N / 2: the pairings differ


def initial_states(spec, g):
    """Random states; vectors (normalisers) positive so a ratio's denominator stays away from 0."""
    out = {}
    for s in spec.mixer.states:
        shape = [SIZES[d] for d in s.shape]
        out[s.name] = (
            randn(g, BATCH, HEADS, *shape)
            if len(shape) != 1
            else 0.5 + rand(g, BATCH, HEADS, *shape)
        )
    return out


def run_reference(ref, inputs, params, state0, spec):
    """Run `ref` on every (batch, head) and stack back to the interpreter's layout."""
    batch, _, heads = next(iter(inputs.values())).shape[:3]
    outs, finals = {}, {}
    for b in range(batch):
        for h in range(heads):
            x = {n: v[b, :, h] for n, v in inputs.items()}
            p = {"h": h} | {n: v[h] for n, v in params.items()}
            s = {}
            for d in spec.mixer.states:
                shape = [SIZES[n] for n in d.shape]
                s[d.name] = (
                    state0[d.name][b, h] if d.name in state0 else torch.zeros(shape, dtype=f64)
                )
            o, f = ref(x, p, s)
            for n, ys in o.items():
                outs.setdefault(n, {})[b, h] = torch.stack(ys)
            for n, v in f.items():
                finals.setdefault(n, {})[b, h] = v

    def gather(table, time_axis):
        rows = [
            torch.stack([table[b, h] for h in range(heads)], dim=time_axis) for b in range(batch)
        ]
        return torch.stack(rows)

    return (
        {n: gather(t, 1) for n, t in outs.items()},
        {n: gather(t, 0) for n, t in finals.items()},
    )


def assert_same(got: dict, want: dict):
    assert got.keys() == want.keys()
    for name in want:
        assert got[name].dtype == f64, name
        torch.testing.assert_close(got[name], want[name], **TOL, msg=lambda m, n=name: f"{n}: {m}")


# --- every shipped spec against its reference ---


def test_every_shipped_spec_has_a_reference():
    assert {p.stem for p in SPECS} == set(CASES)
    assert {load_spec(p).mixer.name for p in SPECS} == set(CASES)


@pytest.mark.parametrize("with_state", [False, True], ids=["zero_state", "initial_state"])
@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_spec_matches_reference(path, with_state):
    spec = load_spec(path)
    ref, make = CASES[spec.mixer.name]
    g = torch.Generator().manual_seed(sum(map(ord, spec.mixer.name)))
    inputs, params = make(g)
    state0 = initial_states(spec, g) if with_state else {}
    got_out, got_state = interpret(spec, inputs, params, state0 or None)
    want_out, want_state = run_reference(ref, inputs, params, state0, spec)
    assert_same(got_out, want_out)
    assert_same(got_state, want_state)
    assert got_out["y"].shape[:3] == (BATCH, STEPS, HEADS)
    assert all(v.shape[:2] == (BATCH, HEADS) for v in got_state.values())


def test_inputs_are_converted_to_float64():
    spec = load_spec(SPECS[0])
    inputs, params = CASES[spec.mixer.name][1](torch.Generator().manual_seed(0))
    low = {n: v.float() for n, v in inputs.items()}
    out, _ = interpret(spec, low, {n: v.float() for n, v in params.items()})
    want, _ = interpret(spec, {n: v.double() for n, v in low.items()}, params)
    assert out["y"].dtype == f64
    torch.testing.assert_close(out["y"], want["y"], rtol=0, atol=0)


def test_empty_sequence_returns_the_initial_state():
    spec = load_spec("specs/linear_attention.mix")
    g = torch.Generator().manual_seed(1)
    ins = {n: v[:, :0] for n, v in qkv(g).items()}
    H0 = randn(g, BATCH, HEADS, DV, DK)
    out, st = interpret(spec, ins, initial_state={"H": H0})
    assert out["y"].shape == (BATCH, 0, HEADS, DV)
    torch.testing.assert_close(st["H"], H0, rtol=0, atol=0)


# --- heads: broadcast and grouped sharing ---


def test_one_head_input_broadcasts_across_heads():
    spec = load_spec("specs/deltanet.mix")
    inputs, _ = CASES["deltanet"][1](torch.Generator().manual_seed(2))
    shared = {**inputs, "k": inputs["k"][:, :, :1], "beta": inputs["beta"][:, :, :1]}
    repeated = {
        **inputs,
        "k": shared["k"].expand(-1, -1, HEADS, -1),
        "beta": shared["beta"].expand(-1, -1, HEADS),
    }
    got, got_s = interpret(spec, shared)
    want, want_s = interpret(spec, repeated)
    assert_same(got, want)
    assert_same(got_s, want_s)
    ref_out, _ = run_reference(ref_deltanet, repeated, {}, {}, spec)
    assert_same(got, ref_out)


def test_grouped_heads_are_shared_by_consecutive_heads():
    spec = load_spec("specs/linear_attention.mix")
    g = torch.Generator().manual_seed(3)
    heads = 6
    q = randn(g, BATCH, STEPS, heads, DK)
    k = randn(g, BATCH, STEPS, 2, DK)  # groups of 3
    v = randn(g, BATCH, STEPS, 3, DV)  # groups of 2
    got, _ = interpret(spec, {"q": q, "k": k, "v": v})
    full = {"q": q, "k": k[:, :, [0, 0, 0, 1, 1, 1]], "v": v[:, :, [0, 0, 1, 1, 2, 2]]}
    want, _ = interpret(spec, full)
    assert_same(got, want)
    ref_out, _ = run_reference(ref_linear_attention, full, {}, {}, spec)
    assert_same(got, ref_out)


def test_head_count_must_divide():
    spec = load_spec("specs/linear_attention.mix")
    ins = qkv(torch.Generator().manual_seed(4))
    ins["q"] = torch.zeros(BATCH, STEPS, 2, DK, dtype=f64)  # 2 does not divide 3
    with pytest.raises(MixcError, match="does not divide"):
        interpret(spec, ins)


# --- parameters ---


def test_retnet_default_gamma_is_per_head():
    spec = load_spec("specs/retnet.mix")
    ins = qkv(torch.Generator().manual_seed(5))
    gamma = torch.tensor([1 - 2 ** (-5 - h) for h in range(HEADS)], dtype=f64)
    assert gamma.tolist() == [1 - 1 / 32, 1 - 1 / 64, 1 - 1 / 128]
    got, got_s = interpret(spec, ins)  # gamma omitted: its default
    explicit, _ = interpret(spec, ins, {"gamma": gamma})
    want, want_s = run_reference(ref_retnet, ins, {"gamma": gamma}, {}, spec)
    assert_same(got, explicit)
    assert_same(got, want)
    assert_same(got_s, want_s)


def test_mamba2_matches_the_ssd_quadratic_form():
    """y = (C B^T ⊙ L)(dt x) + D x, L_ij = exp(sum_{j<r<=i} dt_r A): Mamba-2's dual form."""
    spec = load_spec("specs/mamba2.mix")
    ins, params = CASES["mamba2"][1](torch.Generator().manual_seed(6))
    assert (params["A"] < 0).all() and (params["D"] != 0).all()
    got, _ = interpret(spec, ins, params)
    for b in range(BATCH):
        for h in range(HEADS):
            dt, x = ins["dt"][b, :, h], ins["x"][b, :, h]
            Bm, Cm = ins["B"][b, :, h], ins["C"][b, :, h]
            cum = torch.cumsum(dt * params["A"][h], 0)
            L = torch.tril(torch.exp(cum[:, None] - cum[None, :]))
            y = ((Cm @ Bm.T) * L) @ (dt[:, None] * x) + params["D"][h] * x
            torch.testing.assert_close(got["y"][b, :, h], y, **TOL)


def test_mamba2_needs_its_params():
    spec = load_spec("specs/mamba2.mix")
    ins, params = CASES["mamba2"][1](torch.Generator().manual_seed(7))
    with pytest.raises(MixcError, match="param A"):
        interpret(spec, ins, {"D": params["D"]})
    with pytest.raises(MixcError, match="param D should be"):
        interpret(spec, ins, {"A": params["A"], "D": params["D"][:, None]})
    with pytest.raises(MixcError, match="heads"):
        interpret(spec, ins, {"A": params["A"][:2], "D": params["D"][:2]})


# --- normalised linear attention is a ratio of attention sums ---


def test_normalized_linear_attention_is_a_ratio():
    """y_t = sum_s w_ts v_s / sum_s w_ts with w_ts = phi(q_t) . phi(k_s), s <= t."""
    spec = load_spec("specs/linear_attention_normalized.mix")
    ins = qkv(torch.Generator().manual_seed(8))
    got, _ = interpret(spec, ins)
    phi_q, phi_k = F.elu(ins["q"]) + 1, F.elu(ins["k"]) + 1
    w = torch.einsum("bthd,bshd->bhts", phi_q, phi_k).tril()
    y = torch.einsum("bhts,bshv->bthv", w, ins["v"]) / w.sum(-1).transpose(1, 2)[..., None]
    torch.testing.assert_close(got["y"], y, **TOL)


# --- the language: built-ins, I from context, ordering of values within a step ---

FUNCTIONS_SPEC = """mixer fns
in    x[K], p, M[K, K]
param w[K] = 0.5, c = 2^h
state S[K, K], n
S_t = (2 I - I) S_{t-1} + M_t - I * M_t
n_t = n_{t-1} + p_t
yexp_t = exp(x_t)
ylog_t = log(p_t)
ysig_t = sigmoid(x_t)
ylsig_t = logsigmoid(x_t)
ysp_t = softplus(x_t)
ysilu_t = silu(x_t)
yelu_t = elu(x_t)
yrelu_t = relu(x_t)
ytanh_t = tanh(x_t)
ysqrt_t = sqrt(p_t)
yabs_t = abs(x_t)
ymax_t = max(x_t, p_t)
ymin_t = min(1, x_t)
ysum_t = sum(x_t) + sum(M_t)
ynorm_t = l2norm(x_t)
ydiag_t = diag(x_t)
yrow_t = x_t^T M_t
ydot_t = x_t . w
ypow_t = p_t^c
ydiv_t = -x_t / p_t
yid_t = (I - x_t x_t^T) x_t
"""


def test_builtins_and_identity():
    assert set(FUNCTIONS) == set(IR_FUNCTIONS)
    spec = load_spec(text=FUNCTIONS_SPEC)
    g = torch.Generator().manual_seed(9)
    x = 3 * randn(g, *LEAD, DK)
    p = 0.1 + rand(g, *LEAD)
    M = randn(g, *LEAD, DK, DK)
    out, st = interpret(spec, {"x": x, "p": p, "M": M})
    c = torch.tensor([2.0**h for h in range(HEADS)], dtype=f64)
    want = {
        "yexp": torch.exp(x),
        "ylog": torch.log(p),
        "ysig": torch.sigmoid(x),
        "ylsig": torch.log(torch.sigmoid(x)),
        "ysp": torch.log1p(torch.exp(x)),
        "ysilu": F.silu(x),
        "yelu": F.elu(x),
        "yrelu": F.relu(x),
        "ytanh": torch.tanh(x),
        "ysqrt": torch.sqrt(p),
        "yabs": x.abs(),
        "ymax": torch.maximum(x, p[..., None]),
        "ymin": x.clamp(max=1),
        "ysum": x.sum(-1) + M.sum((-2, -1)),
        "ynorm": x / torch.sqrt((x**2).sum(-1, keepdim=True) + 1e-6),
        "ydiag": torch.diag_embed(x),
        "yrow": torch.einsum("bthi,bthij->bthj", x, M),
        "ydot": 0.5 * x.sum(-1),
        "ypow": p ** c[None, None, :],
        "ydiv": -x / p[..., None],
        "yid": x - x * (x**2).sum(-1, keepdim=True),
    }
    assert_same(out, want)
    S = M.sum(1) - torch.diagonal(M, dim1=-2, dim2=-1).sum(1).diag_embed()
    assert_same(st, {"S": S, "n": p.sum(1)})


def test_l2norm_of_zero_is_zero():
    spec = load_spec(text="mixer z\nin x[K]\nstate s\ns_t = s_{t-1}\ny_t = l2norm(x_t)\n")
    out, _ = interpret(spec, {"x": torch.zeros(1, 2, 1, 3)})
    assert torch.equal(out["y"], torch.zeros(1, 2, 1, 3, dtype=f64))


ORDER_SPEC = """mixer order
in    q[K], k[K], v[V]
state H[V, K], n
y_t = H_t u_t + n_t w_t
w_t = v_t * sigmoid(n_t)
H_t = H_{t-1} + n_t v_t k_t^T
n_t = n_{t-1} + k_t . u_t
u_t = l2norm(q_t)
"""


def test_values_and_states_are_evaluated_in_dependency_order():
    spec = load_spec(text=ORDER_SPEC)
    ins = qkv(torch.Generator().manual_seed(10))

    def ref(x, p, s):
        H, n, ys, ws, us = s["H"], s["n"], [], [], []
        for t in range(STEPS):
            q, k, v = x["q"][t], x["k"][t], x["v"][t]
            u = q / torch.sqrt(q @ q + 1e-6)
            n = n + k @ u
            H = H + n * outer(v, k)
            w = v * torch.sigmoid(n)
            ys.append(H @ u + n * w)
            ws.append(w)
            us.append(u)
        return {"y": ys, "w": ws, "u": us}, {"H": H, "n": n}

    got, got_s = interpret(spec, ins)
    want, want_s = run_reference(ref, ins, {}, {}, spec)
    assert_same(got, want)
    assert_same(got_s, want_s)


def test_let_functions_are_inlined_with_their_arguments():
    spec = load_spec(
        text="mixer lets\nin x[K], y[K]\nstate s\nlet f(a, b) = a . b + 2 b . b\n"
        "s_t = s_{t-1} + f(y_t, x_t)\no_t = f(x_t, y_t) s_t\n"
    )
    g = torch.Generator().manual_seed(11)
    x, y = randn(g, *LEAD, DK), randn(g, *LEAD, DK)
    out, st = interpret(spec, {"x": x, "y": y})
    dot = (x * y).sum(-1)
    s = torch.cumsum(dot + 2 * (x * x).sum(-1), 1)
    torch.testing.assert_close(out["o"], (dot + 2 * (y * y).sum(-1)) * s, **TOL)
    torch.testing.assert_close(st["s"], s[:, -1], **TOL)


def test_deeply_nested_expression():
    body = "(I - " * 190 + "I" + ")" * 190  # f(0) = I, f(n) = I - f(n-1): I for even n
    spec = load_spec(text=f"mixer deep\nin x[K]\nstate s\ns_t = s_{{t-1}}\ny_t = {body} x_t\n")
    x = randn(torch.Generator().manual_seed(12), 1, 3, 2, DK)
    out, _ = interpret(spec, {"x": x})
    torch.testing.assert_close(out["y"], x.double(), **TOL)


# --- errors ---


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda i, s: i.pop("q"), "missing input q"),
        (lambda i, s: i.update(q=i["q"][..., 0]), r"input q should be \[B, T, NH, K\]"),
        (lambda i, s: i.update(k=i["k"][..., :3]), "size K is 4 from input q but 3 from input k"),
        (lambda i, s: i.update(v=i["v"][:, :4]), r"\[B, T\]"),
        (lambda i, s: i.update(r=i["q"]), "unknown input"),
        (lambda i, s: i.update(q=i["q"].tolist()), "must be a torch.Tensor"),
        (lambda i, s: s.update(H=torch.zeros(BATCH, HEADS, DV)), "initial state H should be"),
        (lambda i, s: s.update(H=torch.zeros(BATCH, HEADS, DV, DK + 1)), "size K"),
        (lambda i, s: s.update(Z=torch.zeros(1)), "unknown state"),
    ],
)
def test_bad_arguments_raise_mixc_errors(change, message):
    spec = load_spec("specs/deltanet.mix")
    ins, _ = CASES["deltanet"][1](torch.Generator().manual_seed(13))
    state = {}
    change(ins, state)
    with pytest.raises(MixcError, match=message):
        interpret(spec, ins, initial_state=state)


def test_accepts_a_path_and_a_long_sequence():
    g = torch.Generator().manual_seed(14)
    lead = (1, 256, 2)
    ins = {"q": randn(g, *lead, DK), "k": randn(g, *lead, DK), "v": randn(g, *lead, DV)}
    out, _ = interpret(str(SPECS[0].parent / "retnet.mix"), ins)
    assert out["y"].shape == (1, 256, 2, DV)


def test_is_differentiable():
    """Gradients flow through the oracle, so backward passes can be checked against it too."""
    spec = load_spec("specs/gated_deltanet.mix")
    ins, _ = CASES["gated_deltanet"][1](torch.Generator().manual_seed(15))
    names = list(ins)
    small = tuple(ins[n][:1, :4, :2, ...].clone().requires_grad_() for n in names)

    def run(*xs):
        out, state = interpret(spec, dict(zip(names, xs, strict=True)))
        return out["y"], state["H"]

    assert torch.autograd.gradcheck(run, small)
