"""Hugging Face compatibility (mixc.hf): a tiny hybrid of two transition classes (a delta rule
and a scalar decay) and softmax attention saves and loads through transformers' Auto classes
without the spec files, with identical logits; `generate` is the greedy continuation that full
passes predict, cached or not; a bad config is a located MixcError. Skipped, with the reason,
where transformers is not installed (`pip install 'mixc[hf]'`), except the test of that error."""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

from mixc.errors import MixcError, SpecError
from tests.mixers import ROOT

try:
    import transformers  # noqa: F401
except ImportError:
    HAVE_HF = False
else:
    HAVE_HF = True
needs_hf = pytest.mark.skipif(not HAVE_HF, reason="transformers is not installed (mixc[hf])")

SPECS = ["gated_deltanet", "mamba2"]  # the delta rule, and a scalar data-dependent decay
VOCAB = 40


def test_without_transformers_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` now fails
    monkeypatch.delitem(sys.modules, "mixc.hf", raising=False)  # restored after the test
    with pytest.raises(MixcError, match=r"pip install 'mixc\[hf\]'"):
        importlib.import_module("mixc.hf")


def test_import_mixc_does_not_import_transformers():
    code = "import sys, mixc, mixc.model, mixc.nn; print('transformers' in sys.modules)"
    run = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "False"


@pytest.fixture
def spec_copies(tmp_path):
    """The two specs copied to a folder the test deletes before loading, so that a load that
    read them from disk would fail."""
    folder = tmp_path / "specs"
    folder.mkdir()
    for name in SPECS:
        shutil.copy(ROOT / "specs" / f"{name}.mix", folder)
    return folder


def _config(folder):
    from mixc.hf import MixcConfig

    pattern = [folder / "gated_deltanet.mix", "attention", folder / "mamba2.mix", "attention:3"]
    return MixcConfig.from_pattern(
        pattern, vocab_size=VOCAB, hidden_size=16, num_heads=2, mlp_ratio=2, chunk_size=8
    )


def _model(folder):
    from mixc.hf import MixcForCausalLM

    torch.manual_seed(0)
    return MixcForCausalLM(_config(folder)).double().eval()


@needs_hf
def test_config_round_trip_carries_the_spec_text(spec_copies, tmp_path):
    from transformers import AutoConfig

    from mixc.hf import MixcConfig

    config = _config(spec_copies)
    config.save_pretrained(tmp_path / "saved")
    loaded = AutoConfig.from_pretrained(tmp_path / "saved")
    assert type(loaded) is MixcConfig
    assert loaded.pattern == ["gated_deltanet", "attention", "mamba2", "attention:3"]
    assert loaded.specs == {n: (ROOT / "specs" / f"{n}.mix").read_text() for n in SPECS}
    assert loaded.layer_kwargs == {"chunk_size": 8}
    assert (loaded.vocab_size, loaded.hidden_size, loaded.num_heads, loaded.mlp_ratio) == (
        VOCAB,
        16,
        2,
        2,
    )


@needs_hf
def test_save_and_load_give_identical_logits_without_the_spec_files(spec_copies, tmp_path):
    from transformers import AutoModelForCausalLM

    model = _model(spec_copies)
    model.save_pretrained(tmp_path / "saved")
    shutil.rmtree(spec_copies)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved").eval()
    assert type(loaded) is type(model) and loaded.dtype == torch.float64
    assert [type(b.mixer).__name__ for b in loaded.model.blocks] == [
        "MixerLayer",
        "Attention",
        "MixerLayer",
        "Attention",
    ]
    assert loaded.model.blocks[3].mixer.window == 3
    state, again = model.state_dict(), loaded.state_dict()
    assert state.keys() == again.keys()
    assert all(torch.equal(state[k], again[k]) for k in state)
    tokens = torch.randint(0, VOCAB, (2, 21))
    with torch.no_grad():
        got, want = loaded(tokens).logits, model(tokens).logits
    # the same float64 weights, but not always the same bits out: a BLAS may take another path
    # for tensors at other addresses. A few hundred float64 roundings (2^-53 each) stay far below
    # 1e-12; a weight lost or misplaced in saving moves the logits by their own size.
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@needs_hf
def test_generate_is_the_greedy_continuation_of_full_passes(spec_copies):
    model = _model(spec_copies)
    prompt = torch.randint(0, VOCAB, (3, 6))
    out = model.generate(prompt, max_new_tokens=8, do_sample=False)
    assert out.shape == (3, 14) and torch.equal(out[:, :6], prompt)
    with torch.no_grad():
        for t in range(6, 14):  # each new token is the argmax of a full pass, no cache
            logits, _ = model.model(out[:, :t])
            assert torch.equal(logits[:, -1].argmax(-1), out[:, t])
    assert torch.equal(model.model.generate(prompt, 8), out)  # mixc's own cached decoding
    uncached = model.generate(prompt, max_new_tokens=8, do_sample=False, use_cache=False)
    assert torch.equal(uncached, out)
    beams = model.generate(prompt, max_new_tokens=5, do_sample=False, num_beams=3)
    beams_uncached = model.generate(
        prompt, max_new_tokens=5, do_sample=False, num_beams=3, use_cache=False
    )
    assert torch.equal(beams, beams_uncached)  # the cache follows beam search's reordering


@needs_hf
def test_the_loss_is_next_token_cross_entropy(spec_copies):
    model = _model(spec_copies)
    tokens = torch.randint(0, VOCAB, (2, 9))
    labels = tokens.clone()
    labels[0, 4] = -100
    with torch.no_grad():
        out = model(tokens, labels=labels)
    logp = out.logits.log_softmax(-1)
    terms = [
        -logp[b, t, labels[b, t + 1]] for b in range(2) for t in range(8) if labels[b, t + 1] >= 0
    ]
    assert len(terms) == 15
    assert torch.allclose(out.loss.double(), torch.stack(terms).mean(), rtol=1e-6)
    model(tokens, labels=labels).loss.backward()  # trains as a torch module
    assert all(p.grad is not None for p in model.parameters())


def _edit_config(folder, **changes) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


@needs_hf
def test_a_bad_config_is_a_located_mixc_error(spec_copies, tmp_path):
    from transformers import AutoModelForCausalLM

    saved = tmp_path / "saved"
    _model(spec_copies).save_pretrained(saved)
    specs = json.loads((saved / "config.json").read_text())["specs"]
    hostile = {
        "gated_deltanet": 'mixer x"); __import__("os").system("echo hi"); ("\nin q[K]\n',
        "mamba2": specs["mamba2"].replace("H_t = ", "H_t = __import__(os) "),
    }
    for name, text in hostile.items():
        _edit_config(saved, specs={**specs, name: text})
        with pytest.raises(SpecError) as caught:
            AutoModelForCausalLM.from_pretrained(saved)
        message = str(caught.value)
        assert message.startswith(f"<config specs[{name!r}]>:") and "^" in message
    _edit_config(saved, specs=specs, pattern=["gated_deltanet", "nope"])
    with pytest.raises(MixcError, match="'nope' is neither 'attention'"):
        AutoModelForCausalLM.from_pretrained(saved)
    _edit_config(saved, pattern=["gated_deltanet"], layer_kwargs={"chunk": 8})
    with pytest.raises(MixcError, match="layer_kwargs: 'chunk' unknown"):
        AutoModelForCausalLM.from_pretrained(saved)


@needs_hf
def test_from_pattern_refuses_what_a_config_cannot_hold(spec_copies):
    from mixc.errors import Source
    from mixc.hf import MixcConfig

    text = (spec_copies / "mamba2.mix").read_text()
    other = Source(text.replace("+ dt_t x_t B_t^T", "+ x_t B_t^T"))  # another mamba2
    with pytest.raises(MixcError, match="two different specs name their mixer 'mamba2'"):
        MixcConfig.from_pattern([spec_copies / "mamba2.mix", other], vocab_size=VOCAB)
    with pytest.raises(MixcError, match="'chunk' unknown"):
        MixcConfig.from_pattern([spec_copies / "mamba2.mix"], vocab_size=VOCAB, chunk=8)
    with pytest.raises(MixcError, match="no such spec file"):
        MixcConfig.from_pattern([spec_copies / "missing.mix"], vocab_size=VOCAB)


@needs_hf
def test_foreign_caches_and_positions_are_refused(spec_copies):
    model = _model(spec_copies)
    tokens = torch.randint(0, VOCAB, (2, 5))
    mask = torch.ones_like(tokens)
    assert model(tokens, attention_mask=mask).logits.shape == (2, 5, VOCAB)
    with pytest.raises(MixcError, match=r"attention_mask: expected \[B, T\] = \[2, 5\], got"):
        model(tokens, attention_mask=mask[:, :3])
    with pytest.raises(MixcError, match="position_ids: expected 0 to 4"):
        model(tokens, position_ids=torch.arange(1, 6)[None])
    with pytest.raises(MixcError, match="cache: expected the MixcCache"):
        model(tokens, cache=[None] * 4)


@needs_hf
@pytest.mark.parametrize("side", ["left", "right"])
def test_a_padded_batch_is_each_sequence_alone(spec_copies, side):
    """The forward pass of a padded batch equals each row run alone at its tokens; generate
    with left padding (as transformers pads prompts) continues each row as it alone would."""
    model = _model(spec_copies)
    lengths = (7, 4, 1)
    rows = [torch.randint(1, VOCAB, (n,)) for n in lengths]
    tokens = torch.zeros(3, 7, dtype=torch.long)  # padding: token 0
    mask = torch.zeros(3, 7, dtype=torch.long)
    for b, row in enumerate(rows):
        where = slice(7 - len(row), 7) if side == "left" else slice(0, len(row))
        tokens[b, where], mask[b, where] = row, 1
    logits = model(tokens, attention_mask=mask).logits
    for b, row in enumerate(rows):
        alone = model(row[None]).logits[0]
        torch.testing.assert_close(logits[b][mask[b].bool()], alone, rtol=1e-12, atol=1e-12)
    if side == "left":
        out = model.generate(tokens, attention_mask=mask, max_new_tokens=5, do_sample=False)
        for b, row in enumerate(rows):
            alone = model.generate(row[None], max_new_tokens=5, do_sample=False)
            assert torch.equal(out[b, -5:], alone[0, -5:])


@needs_hf
def test_the_docs_example_runs(tmp_path, monkeypatch):
    docs = (ROOT / "docs" / "layers.md").read_text(encoding="utf-8")
    section = docs[docs.index("## Saving, loading and generating with Hugging Face") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    shutil.copytree(ROOT / "specs", tmp_path / "specs")
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, "docs/layers.md", "exec"), scope)
    assert scope["out"].shape == (1, 24)


@needs_hf
def test_value_heads_and_mode_go_through_the_config(tmp_path):
    from transformers import AutoModelForCausalLM

    from mixc.hf import MixcConfig, MixcForCausalLM

    config = MixcConfig.from_pattern(
        [ROOT / "specs/gated_deltanet.mix"],
        vocab_size=VOCAB,
        hidden_size=16,
        num_heads=2,
        num_v_heads=4,
        expand_v=2,
        mode="recurrent",
    )
    torch.manual_seed(0)
    model = MixcForCausalLM(config).double().eval()
    layer = model.model.blocks[0].mixer
    assert (layer.num_v_heads, layer.sizes["V"], layer.mode) == (4, 16, "recurrent")
    model.save_pretrained(tmp_path / "saved")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved").double().eval()
    assert loaded.model.blocks[0].mixer.mode == "recurrent"
    tokens = torch.randint(0, VOCAB, (2, 6))
    torch.testing.assert_close(loaded(tokens).logits, model(tokens).logits, rtol=1e-12, atol=1e-12)
