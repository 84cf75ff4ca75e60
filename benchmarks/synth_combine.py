"""Combine `mixc synth --json` files (one model each) into one table, one plot of accuracy
and one of the training loss (OUT_loss.png beside OUT.png):
    python benchmarks/synth_combine.py OUT.txt OUT.png FILE.json...
The models keep the order of the files given; every file must hold the same settings but for
`baseline` (only one process trains the attention baseline)."""

import dataclasses
import json
import pathlib
import sys

from mixc.tools.bench_report import matplotlib_figure
from mixc.tools.synth import Settings, SynthResult, plot, render


def plot_losses(results, settings, path: pathlib.Path) -> None:
    """Each model's training loss (as `mixc synth` keeps it: about 100 points) against the step."""
    fig = matplotlib_figure()(figsize=(8, 4.2), layout="constrained")
    ax = fig.subplots()
    for i, r in enumerate(results):
        every = max(1, r.steps // 100)
        steps = range(1, every * len(r.losses) + 1, every)
        ax.plot(steps, r.losses, label=r.model.rsplit("/", 1)[-1], color=f"C{i % 10}")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title(f"mixc synth --task {settings.task}: training loss")
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=120)


def main(txt: str, png: str, *files: str) -> None:
    data = [json.loads(pathlib.Path(f).read_text()) for f in files]
    defaults = dataclasses.asdict(Settings())  # files written before a setting existed
    for d in data:
        d["settings"] = {**defaults, **d["settings"]}
    shared = [{k: v for k, v in d["settings"].items() if k != "baseline"} for d in data]
    if any(s != shared[0] for s in shared):
        sys.exit("synth_combine: the files were trained with different settings")
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in data[0]["settings"].items()}
    settings = Settings(**fields)
    results = [SynthResult(**r) for d in data for r in d["results"]]
    with open(txt, "w") as out:
        render(results, settings, out=out)
    plot(results, settings, png)
    png = pathlib.Path(png)
    plot_losses(results, settings, png.with_name(f"{png.stem}_loss{png.suffix}"))
    print(pathlib.Path(txt).read_text(), end="")


if __name__ == "__main__":
    main(*sys.argv[1:])
