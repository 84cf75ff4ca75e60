#!/bin/bash
# MQAR with the shipped specs and a softmax-attention baseline, one model per `mixc synth`
# process (each result is saved as soon as it is trained), then one table and one plot:
#   benchmarks/synth_mqar.sh [STEPS]      (default 100; the command's own default is 300)
# Writes benchmarks/synth/*.json, benchmarks/synth_mqar.txt and benchmarks/synth_mqar.png.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-100}
out=benchmarks/synth
mkdir -p "$out"
common=(--task mqar --steps "$steps")
python -m mixc synth "${common[@]}" --json "$out/attention.json"
for s in gated_deltanet gla deltanet mamba2 linear_attention retnet; do
  python -m mixc synth "specs/$s.mix" --no-baseline "${common[@]}" --json "$out/$s.json"
done
python - "$out" <<'PY'
import json, pathlib, sys
from mixc.tools.synth import Settings, SynthResult, plot, render
files = sorted(pathlib.Path(sys.argv[1]).glob("*.json"), key=lambda p: p.stem != "attention")
data = [json.loads(p.read_text()) for p in files]
settings = Settings(**{k: tuple(v) if isinstance(v, list) else v for k, v in data[0]["settings"].items()})
results = [SynthResult(**r) for d in data for r in d["results"]]
with open("benchmarks/synth_mqar.txt", "w") as f:
    render(results, settings, out=f)
plot(results, settings, "benchmarks/synth_mqar.png")
print(open("benchmarks/synth_mqar.txt").read())
PY
