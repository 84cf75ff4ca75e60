"""Combine `mixc synth --json` files (one model each) into one table and one plot:
    python benchmarks/synth_combine.py OUT.txt OUT.png FILE.json...
The models keep the order of the files given; every file must hold the same settings but for
`baseline` (only one process trains the attention baseline)."""

import json
import pathlib
import sys

from mixc.tools.synth import Settings, SynthResult, plot, render


def main(txt: str, png: str, *files: str) -> None:
    data = [json.loads(pathlib.Path(f).read_text()) for f in files]
    shared = [{k: v for k, v in d["settings"].items() if k != "baseline"} for d in data]
    if any(s != shared[0] for s in shared):
        sys.exit("synth_combine: the files were trained with different settings")
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in data[0]["settings"].items()}
    settings = Settings(**fields)
    results = [SynthResult(**r) for d in data for r in d["results"]]
    with open(txt, "w") as out:
        render(results, settings, out=out)
    plot(results, settings, png)
    print(pathlib.Path(txt).read_text(), end="")


if __name__ == "__main__":
    main(*sys.argv[1:])
