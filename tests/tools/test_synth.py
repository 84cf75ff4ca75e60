"""`mixc synth`: the tasks' targets against plain loops, and a few-step run of the command with
its table, JSON and plot."""

from __future__ import annotations

import io
import itertools
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import torch

import mixc
from mixc.cli import main
from mixc.tools.tasks import IGNORE, MQAR, Parity, Permutations, make_task

ROOT = Path(__file__).parent.parent.parent


def test_mqar_queries_ask_for_the_values_stored_with_their_keys():
    task = MQAR(seq_len=40, pairs=6, vocab=32)
    inputs, targets = task.batch(50, torch.Generator().manual_seed(0))
    for x, y in zip(inputs.tolist(), targets.tolist(), strict=True):
        stored = {x[2 * i]: x[2 * i + 1] for i in range(6)}
        assert len(stored) == 6 and all(1 <= k < 16 <= v < 32 for k, v in stored.items())
        asked = [(t, x[t], y[t]) for t in range(40) if y[t] != IGNORE]
        assert sorted(k for _, k, _ in asked) == sorted(stored)  # every key asked once
        assert all(t >= 12 and stored[k] == v for t, k, v in asked)
    assert task.chance == 1 / 16


def test_parity_and_permutation_targets():
    bits, parity = Parity(seq_len=17).batch(8, torch.Generator().manual_seed(1))
    for x, y in zip(bits.tolist(), parity.tolist(), strict=True):
        assert y == [sum(x[: t + 1]) % 2 for t in range(17)]
    s3 = Permutations(3, seq_len=9)
    elements = list(itertools.permutations(range(3)))
    words, products = s3.batch(8, torch.Generator().manual_seed(2))
    for x, y in zip(words.tolist(), products.tolist(), strict=True):
        p = tuple(range(3))
        for t, g in enumerate(x):
            p = tuple(elements[g][p[i]] for i in range(3))  # g after the product so far
            assert elements[y[t]] == p
    assert Permutations(5).vocab_size == 120


def test_bad_task_options_are_refused():
    with pytest.raises(mixc.MixcError, match="need a sequence of at least 30 tokens"):
        make_task("mqar", seq_len=20, pairs=10)
    with pytest.raises(mixc.MixcError, match="apply to mqar only"):
        make_task("parity", pairs=4)


def _synth(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["synth", *argv])
    return code, out.getvalue(), err.getvalue()


def test_synth_runs_a_few_steps_and_writes_a_table_json_and_plot(tmp_path):
    spec = str(ROOT / "specs/gated_deltanet.mix")
    code, out, err = _synth(
        spec,
        "--task", "mqar", "--seq-len", "16", "--pairs", "2,3", "--vocab", "16",
        "--hidden", "16", "--heads", "2", "--layers", "1", "--steps", "3", "--batch", "4",
        "--eval-examples", "8", "--json", str(tmp_path / "r.json"),
        "--plot", str(tmp_path / "r.png"),
    )  # fmt: skip
    assert code == 0, err
    assert "step 3/3" in err  # progress on stderr
    lines = out.splitlines()
    assert lines[0].startswith("mixc synth --task mqar: 1 layers") and "accuracy" in lines[1]
    assert len(lines) == 2 + 4  # two settings of pairs, the baseline and the spec
    data = json.loads((tmp_path / "r.json").read_text())
    rows = data["results"]
    assert [r["model"] for r in rows] == ["attention", spec] * 2
    assert [r["pairs"] for r in rows] == [2, 2, 3, 3]
    assert all(0 <= r["accuracy"] <= 1 and r["steps"] == 3 for r in rows)
    assert rows[1]["state_per_layer"] == 2 * 8 * 8  # NH * V * K of gated DeltaNet's H
    assert rows[0]["state_per_layer"] == 2 * 16 * 16  # keys and values of 16 tokens
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


def test_synth_state_tracking_and_errors(tmp_path):
    code, out, _ = _synth(
        "--task", "s3", "--seq-len", "6", "--hidden", "16", "--heads", "2", "--layers", "1",
        "--steps", "2", "--batch", "2", "--eval-examples", "4",
    )  # fmt: skip
    assert code == 0 and "attention" in out
    code, _, err = _synth("--task", "mqar", "--seq-len", "8", "--pairs", "4")
    assert code == 1 and "need a sequence of at least 12 tokens" in err
    code, _, err = _synth("--task", "copy")
    assert code == 1 and "unknown 'copy'; choose from mqar, parity, s3, s5" in err
    code, _, err = _synth("--no-baseline", "--task", "parity", "--steps", "1")
    assert code == 1 and "no spec to train" in err


def test_synth_scores_at_a_second_length(monkeypatch, tmp_path):
    import mixc.tools.synth as synth

    lengths, evaluate = [], synth._evaluate
    monkeypatch.setattr(
        synth,
        "_evaluate",
        lambda model, task, *a: lengths.append(task.seq_len) or evaluate(model, task, *a),
    )
    code, out, err = _synth(
        "--task", "parity", "--seq-len", "8", "--eval-seq-len", "24", "--hidden", "16",
        "--heads", "2", "--layers", "1", "--steps", "2", "--batch", "2", "--eval-examples", "4",
        "--json", str(tmp_path / "r.json"),
    )  # fmt: skip
    assert code == 0, err
    assert lengths == [8, 24]  # the trained length, then the longer one
    assert "at 24" in out.splitlines()[1]
    (row,) = json.loads((tmp_path / "r.json").read_text())["results"]
    assert row["eval_seq_len"] == 24 and 0 <= row["eval_accuracy"] <= 1
    code, _, err = _synth("--task", "mqar", "--pairs", "8", "--eval-seq-len", "10")
    assert code == 1 and "need a sequence of at least" in err  # refused before training


@pytest.mark.parametrize(
    "options,refused",
    [
        (["--hidden", "100000000"], "--hidden: 100000000 would need "),
        (["--hidden", "64,1000000"], "--hidden: 64,1000000 would need "),
        (["--batch", "100000000"], "--batch: 100000000 would need "),
        (["--seq-len", "1000000000"], "--seq-len: 1000000000 would need "),
        (["--vocab", "1000000000"], "--vocab: 1000000000 would need "),
        (["--layers", "100000000"], "--layers: 100000000 would need "),
        (["--eval-seq-len", "100000000"], "--eval-seq-len: 100000000 would need "),
        (["--seq-len", "100000", "--batch", "1000"], "--seq-len: 100000 would need "),
    ],
    ids=["hidden", "hidden list", "batch", "seq-len", "vocab", "layers", "eval", "two"],
)
def test_absurd_sizes_are_refused_before_any_model_is_built(options, refused, monkeypatch, capsys):
    """--hidden 100000000 was refused by the model as hidden_size (and --batch, --seq-len died
    allocating): the run's memory is estimated first and refused naming the option."""
    from mixc.tools import synth

    def build(*args, **kwargs):
        raise AssertionError("a model was built before refusing")

    monkeypatch.setattr(synth, "LanguageModel", build)
    assert main(["synth", "specs/gla.mix", "--steps", "1", *options]) == 1
    err = capsys.readouterr().err
    assert err.startswith(refused) and len(err.strip().splitlines()) == 1
    assert "hidden_size" not in err and "Traceback" not in err


def test_the_default_run_passes_the_memory_check():
    from mixc.tools import synth

    synth.check_memory(synth.Settings())
    synth.check_memory(synth.Settings(seq_len=(512,), hidden=(256,), batch=64))
