"""Generated code keeps the digits a spec's formula would lose in float32 when evaluated as
written: `1 - sigmoid(x)` is emitted as `sigmoid(-x)` (equal; exact where sigmoid(x) is near 1)."""

from __future__ import annotations

import torch

import mixc

ROOT = __import__("pathlib").Path(__file__).parent.parent.parent


def _hgrn_float64(i, f, o):
    c = torch.zeros_like(i[:, 0])
    ys = []
    for t in range(i.shape[1]):
        g = torch.sigmoid(f[:, t])
        c = g * c + (1 - g) * i[:, t]
        ys.append(o[:, t] * c)
    return torch.stack(ys, 1), c


def test_one_minus_sigmoid_keeps_its_digits_in_float32():
    spec = mixc.load_spec(ROOT / "specs/hgrn.mix")
    module = mixc.load(spec)
    gen = torch.Generator().manual_seed(0)
    B, T, NH, V = 2, 200, 2, 8
    i, o = (torch.randn(B, T, NH, V, generator=gen) for _ in range(2))
    f = torch.randn(B, T, NH, V, generator=gen) + 6  # sigmoid(f) near 1: 1 - sigmoid(f) ~ 2e-3
    y_ref, c_ref = _hgrn_float64(i.double(), f.double(), o.double())
    for form in (module.recurrent, module.chunk):
        y, c = form(i, f, o, output_final_state=True)
        for got, ref in ((y, y_ref), (c, c_ref)):
            err = ((got.double() - ref).norm() / ref.norm()).item()
            assert err < 2e-6, (form.__name__, err)  # 1 - sigmoid(f) as written: about 1e-5
    assert "_torch.sigmoid(-f)" in mixc.compile_source(spec)
