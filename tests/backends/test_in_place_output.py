"""The output written over a kernel's fresh readout where nothing records the form
(mixc.backends.pytorch.epilogue, issue 31): without autograd, the chunked and quadratic forms
agree with the float64 oracle (the fuzzer's values taken without autograd, its gradients
with it), write in place where the readout is read once and elementwise, and nowhere else."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mixc
from mixc.check import fuzz
from tests.mixers import no_grad_values

ROOT = Path(__file__).resolve().parents[2]


def _variant(out: str) -> str:
    return (
        "mixer variant\nin    q[K], k[K], v[V], z[V], g\nstate H[V, K]\n"
        f"H_t = exp(g_t) H_{{t-1}} + v_t k_t^T\n{out}\n"
    )


#: Outputs whose readout is read once, elementwise, by operations of its shape: written over.
WRITTEN_OVER = {
    "a gate after a skip": _variant("y_t = (H_t q_t + 0.5 v_t) * sigmoid(z_t)"),
    "a difference, the readout second": _variant("y_t = z_t - H_t q_t"),
    "a difference with a product": _variant("y_t = H_t q_t - z_t * v_t"),
    "a quotient by a positive gate": _variant("y_t = (H_t q_t) / (1 + exp(g_t))"),
    "a scalar factor": _variant("y_t = g_t H_t q_t + z_t"),
}

#: Outputs whose readout must stay as it is: read twice, or the operation's result is larger
#: than the readout.
KEPT = {
    "read twice": _variant("y_t = (H_t q_t + z_t) * (H_t q_t)"),
    "an outer product": _variant("y_t = (H_t q_t) z_t^T"),
}


def _fuzz_without_autograd(path: Path, examples: int, dtype: str = "float32"):
    """Fuzz the spec at `path`: its chunked and quadratic forms' values taken without
    autograd. Returns the report and what each `_spare` answered (None: a fresh result); a
    module that writes nothing over a result copies no `_spare` (none answered)."""
    module = mixc.load(path)
    spared = []
    spare = getattr(module, "_spare", None)
    if spare is not None:
        module._spare = lambda x, own: spared.append(spare(x, own)) or spared[-1]
    try:
        proxy = no_grad_values(module, ("chunk", "parallel"))
        report = fuzz(path, proxy, examples=examples, dtype=dtype, shrink=False)
    finally:
        if spare is not None:
            module._spare = spare
    return report, spared


def _slow_but(first: str, names) -> list:
    """`names` as parameters, all but `first` slow (the default suite runs one of a kind)."""
    slow = pytest.mark.slow
    return [pytest.param(n, marks=() if n == first else slow) for n in sorted(names)]


@pytest.mark.parametrize("dtype", _slow_but("float32", ["float32", "float64", "bfloat16"]))
def test_mamba3_without_autograd_agrees_with_the_oracle(dtype):
    """The folded correction and the gate, both written over the kernel's output."""
    report, spared = _fuzz_without_autograd(ROOT / "specs/mamba3.mix", 2, dtype)
    assert report.ok, report.failure.summary()
    assert any(x is not None for x in spared)


@pytest.mark.parametrize("name", _slow_but("a gate after a skip", WRITTEN_OVER))
def test_an_output_written_over_its_readout_agrees_with_the_oracle(tmp_path, name):
    path = tmp_path / "variant.mix"
    path.write_text(WRITTEN_OVER[name])
    assert "out=_spare(_read_H, _own)" in mixc.compile_source(path)
    report, spared = _fuzz_without_autograd(path, 4)
    assert report.ok, report.failure.summary()
    assert any(x is not None for x in spared)


@pytest.mark.parametrize("name", _slow_but("read twice", KEPT))
def test_a_readout_read_twice_or_broadcast_is_kept(tmp_path, name):
    path = tmp_path / "variant.mix"
    path.write_text(KEPT[name])
    assert "_spare(" not in mixc.compile_source(path).split("def chunk(")[1]
    report, _ = _fuzz_without_autograd(path, 3)
    assert report.ok, report.failure.summary()


def test_nothing_is_written_in_place_under_autograd_or_into_the_arguments(monkeypatch):
    """Under autograd every result is fresh (the gradients need the operands); without it the
    arguments (and the states passed in) come back as they went in. The values are the same
    to the bit where the same sums are taken: the kernel's k_t . q_t (its scores' diagonal,
    without autograd only; test_ordered_kernel) is switched off here, as under autograd."""
    module = mixc.load(ROOT / "specs/mamba3.mix")
    kernel = module._chunk_scalar_decay

    def without_diagonal(*args, diagonal=False, **kwargs):
        return (*kernel(*args, **kwargs), None) if diagonal else kernel(*args, **kwargs)

    monkeypatch.setattr(module, "_chunk_scalar_decay", without_diagonal)
    g = torch.Generator().manual_seed(0)
    B, T, NH, P, N, R = 1, 70, 2, 4, 8, 2
    shapes = dict(x=(P,), z=(P,), dt=(), A=(), B=(N,), C=(N,), l=(), w=(R,))
    args = [torch.randn(B, T, NH, *s, generator=g) for s in shapes.values()]
    args[2], args[3] = args[2].sigmoid(), args[3].exp()  # dt > 0, A > 0
    params = [torch.randn(NH, generator=g), torch.randn(NH, N, generator=g)]
    params.append(torch.randn(NH, N, generator=g))
    _, state = module.chunk(*args, *params, output_final_state=True)
    before = [x.clone() for x in (*args, *params, *state)]
    with torch.no_grad():
        y, _ = module.chunk(*args, *params, initial_state=state)
    for x, kept in zip((*args, *params, *state), before):
        assert torch.equal(x, kept)
    tracked = [x.clone().requires_grad_() for x in args]
    y_tracked, _ = module.chunk(*tracked, *params, initial_state=state)
    assert torch.equal(y, y_tracked.detach())  # the same values, to the bit
    assert module._unrecorded(*tracked) is None
