"""Mixers with no state (a gate, a skip, a token shift): valid specs, compiled to modules whose
every form (chunk, parallel, recurrent, step, packed sequences) computes what the float64
oracle does, on both backends, in a layer and under context parallelism. An output that reads
no input and no state is refused at check time, located."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import mixc
from mixc.check import fuzz
from mixc.errors import SpecAnalysisError
from mixc.nn import MixerLayer
from tests.backends.test_varlen import check_packed
from tests.test_agreement import _run

STATELESS = {
    "identity": "mixer m\nin x\ny_t = x_t\n",
    "gated_skip": "mixer gate\nin x[K], g\nparam D\ny_t = sigmoid(g_t) * x_t + D * x_{t-1}\n",
    "per_token_values": "mixer v\nin q[K], k[K]\nparam p = 1 + h\n"
    "a_t = q_t . k_t\ny_t = p * a_t * silu(q_t)\n",
}
IDS = sorted(STATELESS)


@pytest.mark.parametrize("backend", ["pytorch", "triton"])
@pytest.mark.parametrize("name", IDS)
def test_a_stateless_mixer_compiles_to_python(name: str, backend: str, tmp_path: Path) -> None:
    spec = tmp_path / f"{name}.mix"
    spec.write_text(STATELESS[name], encoding="utf-8")
    out = tmp_path / f"{name}.py"
    assert _run("check", "-q", str(spec))[0] == 0
    code, _, err = _run("compile", str(spec), "--backend", backend, "-o", str(out))
    assert code == 0, err
    ast.parse(out.read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", IDS)
def test_every_form_agrees_with_the_oracle(name: str) -> None:
    report = fuzz(mixc.load_spec(text=STATELESS[name]), examples=6, seed=3, max_T=20)
    assert report.ok, report.failure.summary()
    assert set(report.worst) == {"chunk", "packed", "parallel", "recurrent", "step"}


@pytest.mark.parametrize("form", ["chunk", "recurrent"])
@pytest.mark.parametrize("name", IDS)
def test_packed_sequences_equal_each_sequence_alone(name: str, form: str) -> None:
    check_packed(mixc.Source(STATELESS[name]), "pytorch", form)


def test_the_module_says_what_it_has() -> None:
    module = mixc.load(text=STATELESS["identity"])
    assert module.FORMS == ("chunk", "parallel", "recurrent", "step")
    assert module.STATES == ()
    x = torch.randn(2, 5, 3)
    y, final = module.chunk(x, output_final_state=True)
    assert torch.equal(y, x) and final == ()
    y, state = module.step(x[:, 0], state=())
    assert torch.equal(y, x[:, 0]) and state == ()
    with pytest.raises(mixc.MixcError, match="expected 0 tensors"):
        module.recurrent(x, initial_state=torch.zeros(2, 3))
    with pytest.raises(mixc.MixcError, match="the mixer has no state"):
        module.summary(x)


@pytest.mark.parametrize("name", ["identity", "gated_skip"])
def test_a_layer_prefills_then_decodes(name: str) -> None:
    torch.manual_seed(0)
    layer = MixerLayer(mixc.Source(STATELESS[name]), hidden_size=16, num_heads=2)
    x = torch.randn(2, 6, 16)
    whole, _ = layer(x)
    y, cache = layer(x[:, :3], use_cache=True)
    pieces = [y]
    for t in range(3, 6):
        y, cache = layer(x[:, t : t + 1], state=cache, use_cache=True)
        pieces.append(y)
    torch.testing.assert_close(torch.cat(pieces, 1), whole)


def test_context_parallel_runs_each_slice_alone(tmp_path: Path) -> None:
    import torch.distributed as dist

    from mixc.distributed import context_parallel

    module = mixc.load(text=STATELESS["per_token_values"])
    q, k = torch.randn(2, 2, 7, 2, 3).unbind(0)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        y, final = context_parallel(module)(q, k, output_final_state=True)
    finally:
        dist.destroy_process_group()
    torch.testing.assert_close(y, module.recurrent(q, k)[0])
    assert final == ()


@pytest.mark.parametrize(
    "output, at",
    [("y_t = p", 7), ("y_t = 3 p + 1", 7), ("a_t = 2 p\ny_t = a_t", 7), ("y_t = exp(0)", 7)],
)
def test_an_output_that_reads_no_token_is_refused(output: str, at: int) -> None:
    text = f"mixer m\nin x\nparam p\n{output}\n"
    with pytest.raises(SpecAnalysisError) as info:
        mixc.load_spec(text=text)
    message = str(info.value)
    line = text.count("\n")
    assert message.startswith(f"<string>:{line}:{at}: error: the output y_t reads no input")
    assert "^" in message and "hint:" in message
