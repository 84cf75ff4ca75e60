"""`mixc synth`: train the same small language model around each spec on a synthetic task.

Every model has the same blocks (`mixc.model.LanguageModel`: `layers` copies of one mixer, each
with an MLP), sees the same batches in the same order and is scored on the same held-out
examples; a softmax-attention model is the baseline. Results are rows of a table (accuracy on
the scored positions, the recurrent state per layer, parameters, time), optionally JSON and a
plot. Sweeps over sequence length, pairs (MQAR) and width run every combination.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace

import torch
import torch.nn.functional as F

from mixc.errors import MixcError
from mixc.model import LanguageModel
from mixc.tools.tasks import IGNORE, make_task

__all__ = ["Settings", "SynthResult", "check_memory", "plot", "render", "run", "write_json"]


@dataclass(frozen=True)
class Settings:
    """What every model of a run shares (the swept options are lists)."""

    task: str = "mqar"
    seq_len: tuple[int | None, ...] = (None,)
    pairs: tuple[int | None, ...] = (None,)
    vocab: int | None = None
    hidden: tuple[int, ...] = (64,)
    heads: int = 4
    layers: int = 2
    steps: int = 300
    batch: int = 32
    lr: float = 3e-3
    weight_decay: float = 0.1
    eval_examples: int = 256
    eval_seq_len: int | None = None  # also score at this length (length generalisation)
    chunk_size: int = 16  # at a small model's head sizes the smallest chunks run fastest
    seed: int = 0
    device: str = "cpu"
    baseline: bool = True


@dataclass
class SynthResult:
    """One trained model: what it was, how well it did and what it cost."""

    model: str
    task: str
    seq_len: int
    pairs: int | None
    hidden: int
    accuracy: float
    chance: float
    state_per_layer: int
    params: int
    seconds: float
    final_loss: float
    steps: int
    losses: list[float] = field(default_factory=list)
    eval_seq_len: int | None = None
    eval_accuracy: float | None = None  # at eval_seq_len, when one was asked for


def _label(entry) -> str:
    return entry if isinstance(entry, str) else str(getattr(entry, "name", entry))


def run(
    specs: Sequence,
    settings: Settings,
    progress: Callable[[str, int, int, float], None] | None = None,
) -> list[SynthResult]:
    """Train and score one model per spec (and the baseline) for every swept setting."""
    entries = ["attention", *specs] if settings.baseline else list(specs)
    if not entries:
        raise MixcError("synth: no spec to train (give SPEC..., or keep the attention baseline)")
    check_memory(settings)
    results = []
    for seq_len, pairs, hidden in itertools.product(
        settings.seq_len, settings.pairs, settings.hidden
    ):
        task = make_task(settings.task, seq_len, pairs, settings.vocab)
        for entry in entries:
            results.append(_train_one(entry, task, hidden, settings, progress))
    return results


#: Bytes of a number (fp32); numbers a block keeps per token and unit of width while training
#: (the mixer's projections and states, the MLP at 4x, norms, and their gradients).
_BYTES, _PER_WIDTH = 4, 40


def _bytes(s: Settings, seq_len: int, vocab: int, hidden: int, eval_seq_len: int | None) -> int:
    """Rough peak bytes of training one model of `s`: its parameters with their gradients and
    AdamW's two moments, and the activations of a batch (logits, every block, attention's
    T x T scores, the chunked form's state per chunk); scoring at eval_seq_len, without
    gradients, where it is longer."""
    params = vocab * hidden + s.layers * 12 * hidden**2  # embedding; MLP (8 h^2) + at most 4 h^2

    def activations(length: int) -> int:
        head = max(1, hidden // s.heads)
        blocks = s.layers * (
            _PER_WIDTH * hidden * length
            + 2 * s.heads * length * length * s.baseline
            + 2 * s.heads * -(-length // s.chunk_size) * head * head
        )
        return s.batch * (blocks + 3 * length * vocab)

    train = 4 * params + activations(seq_len)
    longer = params + activations(eval_seq_len) // 3 if eval_seq_len else 0
    return _BYTES * max(train, longer)


def check_memory(settings: Settings) -> None:
    """Every model of the run fits in the device's memory: checked before any is built. A run
    that does not is refused naming the option (--seq-len, --batch, --hidden, --vocab,
    --layers, --heads, --eval-seq-len) that, set back to its default, shrinks it most."""
    from mixc.resources import check_bytes, device_memory

    def peak(s: Settings) -> int:
        need = 0
        for seq_len, pairs, hidden in itertools.product(s.seq_len, s.pairs, s.hidden):
            task = make_task(s.task, seq_len, pairs, s.vocab)
            need = max(need, _bytes(s, task.seq_len, task.vocab_size, hidden, s.eval_seq_len))
        return need

    need, limit = peak(settings), device_memory(settings.device)
    if need <= limit:
        return
    default = Settings()
    options = {
        "--seq-len": ("seq_len", (None,)),
        "--batch": ("batch", default.batch),
        "--hidden": ("hidden", default.hidden),
        "--vocab": ("vocab", None),
        "--layers": ("layers", default.layers),
        "--heads": ("heads", default.heads),
        "--eval-seq-len": ("eval_seq_len", None),
    }
    shrunk = {}
    for option, (name, value) in options.items():
        if getattr(settings, name) != value:
            try:
                shrunk[option] = peak(replace(settings, **{name: value}))
            except MixcError:  # a default the other options do not admit (mqar's pairs)
                continue
    if not shrunk:
        shrunk = {"--hidden": 0}
    option = min(shrunk, key=shrunk.get)
    value = getattr(settings, options[option][0])
    if isinstance(value, tuple):
        value = ",".join(str(v) for v in value)
    check_bytes(option, value, need, "training and scoring a model", limit)


def _train_one(entry, task, hidden: int, s: Settings, progress) -> SynthResult:
    torch.manual_seed(s.seed)
    device = torch.device(s.device)
    model = LanguageModel(
        [entry] * s.layers,
        task.vocab_size,
        hidden,
        s.heads,
        chunk_size=s.chunk_size,
    ).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=s.weight_decay)
    warmup = max(1, s.steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda i: (
            min(1.0, (i + 1) / warmup)
            * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(i, s.steps) / s.steps)))
        ),
    )
    data = torch.Generator().manual_seed(s.seed)
    label, losses, start = _label(entry), [], time.perf_counter()
    model.train()
    for step in range(1, s.steps + 1):
        inputs, targets = (x.to(device) for x in task.batch(s.batch, data))
        logits, _ = model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE)
        if not torch.isfinite(loss):
            raise MixcError(f"synth: {label}: the loss is {loss.item()} at step {step}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        schedule.step()
        losses.append(loss.item())
        if progress is not None:
            progress(label, step, s.steps, loss.item())
    accuracy = _evaluate(model, task, s, device)
    longer = None
    if s.eval_seq_len is not None:
        longer = _evaluate(model, _at_length(task, s), s, device)
    return SynthResult(
        model=label,
        task=task.name,
        seq_len=task.seq_len,
        pairs=getattr(task, "pairs", None),
        hidden=hidden,
        accuracy=accuracy,
        chance=task.chance,
        state_per_layer=model.blocks[0].mixer.state_size(task.seq_len),
        params=sum(p.numel() for p in model.parameters()),
        seconds=time.perf_counter() - start,
        final_loss=sum(losses[-20:]) / len(losses[-20:]),
        steps=s.steps,
        losses=losses[:: max(1, s.steps // 100)],
        eval_seq_len=s.eval_seq_len,
        eval_accuracy=longer,
    )


def _at_length(task, s: Settings):
    """The task the model was trained on, its sequences `eval_seq_len` long."""
    return make_task(s.task, s.eval_seq_len, getattr(task, "pairs", None), s.vocab)


@torch.no_grad()
def _evaluate(model, task, s: Settings, device) -> float:
    """Accuracy on the scored positions of `eval_examples` held-out sequences (another seed)."""
    model.eval()
    gen = torch.Generator().manual_seed(s.seed + 1_000_003)
    right = total = 0
    for first in range(0, s.eval_examples, s.batch):
        n = min(s.batch, s.eval_examples - first)
        inputs, targets = (x.to(device) for x in task.batch(n, gen))
        logits, _ = model(inputs)
        scored = targets != IGNORE
        right += (logits.argmax(-1) == targets)[scored].sum().item()
        total += scored.sum().item()
    return right / total


# ----------------------------------------------------------------------------- reporting


def render(results: Sequence[SynthResult], settings: Settings, out=None) -> None:
    """The results as a table, one row per model and setting."""
    out = out or sys.stdout
    first = results[0]
    print(
        f"mixc synth --task {settings.task}: {settings.layers} layers, {settings.heads} heads, "
        f"{settings.steps} steps of batch {settings.batch}, AdamW lr {settings.lr:g}, "
        f"{settings.eval_examples} held-out examples, {settings.device} "
        f"(chance {first.chance:.3f})",
        file=out,
    )
    longer = first.eval_seq_len
    rows = [
        ("model", "seq_len", "pairs", "hidden", "accuracy")
        + ((f"at {longer}",) if longer else ())
        + ("state/layer", "params", "time")
    ]
    for r in results:
        state = f"{r.state_per_layer}" + (" (KV)" if r.model.startswith("attention") else "")
        rows.append(
            (
                r.model,
                str(r.seq_len),
                "-" if r.pairs is None else str(r.pairs),
                str(r.hidden),
                f"{r.accuracy:.3f}",
            )
            + ((f"{r.eval_accuracy:.3f}",) if longer else ())
            + (state, f"{r.params}", f"{r.seconds:.0f}s")
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        print("  ".join(cells).rstrip(), file=out)


def write_json(results: Sequence[SynthResult], settings: Settings, path) -> None:
    from mixc.driver import write_atomically

    data = {"settings": asdict(settings), "results": [asdict(r) for r in results]}
    write_atomically(path, json.dumps(data, indent=2) + "\n")


def plot(results: Sequence[SynthResult], settings: Settings, path) -> None:
    """Accuracy per model: bars, or lines over the swept option when one was swept."""
    from mixc.driver import write_atomically
    from mixc.tools.bench_report import matplotlib_figure

    Figure = matplotlib_figure()
    fig = Figure(figsize=(8, 4.2), layout="constrained")
    ax = fig.subplots()
    swept = [
        (name, key)
        for name, key in (("seq_len", "seq_len"), ("pairs", "pairs"), ("hidden", "hidden"))
        if len(getattr(settings, name)) > 1
    ]
    models = list(dict.fromkeys(r.model for r in results))
    if swept:
        name, key = swept[0]
        for i, m in enumerate(models):
            rows = [r for r in results if r.model == m]
            ax.plot(
                [getattr(r, key) for r in rows],
                [r.accuracy for r in rows],
                "o-",
                label=m,
                color=f"C{i % 10}",
            )
        ax.set_xlabel(name)
        ax.legend(fontsize=8)
    else:
        ax.bar(
            range(len(models)),
            [r.accuracy for r in results],
            color=[f"C{i % 10}" for i in range(len(models))],
        )
        ax.set_xticks(
            range(len(models)), [m.rsplit("/", 1)[-1] for m in models], rotation=30, ha="right"
        )
    ax.axhline(results[0].chance, color="grey", linestyle=":", label="chance")
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("accuracy")
    ax.set_title(
        f"mixc synth --task {settings.task}: {settings.layers} layers, {settings.steps} steps"
    )
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format=str(path).rsplit(".", 1)[-1].lower(), dpi=120)
    write_atomically(path, buffer.getvalue())


def progress_printer(models: int, steps: int, out=None):
    """A progress callback for `run`: a rich bar on a terminal (over every model's steps), else
    a line every 10% of each model's steps (plain text on stderr). Returns (callback, context
    manager)."""
    from mixc.check.command import progress_bar

    out = out or sys.stderr
    bar_update, bar = progress_bar(f"training {models} models", models * steps)
    seen: list[str] = []
    start = [time.perf_counter()]

    def update(model: str, step: int, total: int, loss: float) -> None:
        if step == 1:
            seen.append(model)
            start[0] = time.perf_counter()
        label = f"[{len(seen)}/{models}] {model}"
        if bar_update is not None:
            bar_update((len(seen) - 1) * total + step, models * total, f"{label}, loss {loss:.3f}")
        elif step == total or step % max(1, total // 10) == 0:
            elapsed = time.perf_counter() - start[0]
            print(
                f"{label}: step {step}/{total}  loss {loss:.3f}  {elapsed:.0f}s",
                file=out,
                flush=True,
            )

    return update, bar
