#!/bin/bash
# Running parity, then scored on sequences 4 times longer than those trained on (the length
# generalisation Grazzi et al. 2024, arXiv 2411.12537, measure): DeltaNet (erase in (0, 1))
# against specs/deltanet_negeig.mix (erase in (0, 2)), the two trainings side by side:
#   benchmarks/synth_parity_longer.sh [STEPS]    (default 2000)
# The settings of synth_parity.sh, seed 0, plus --eval-seq-len 256. Writes
# benchmarks/synth/parity-longer/*.json and benchmarks/synth_parity_longer.{txt,png}. Extra
# arguments after STEPS go to every `mixc synth` (e.g. --device cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-2000}
shift || true
out=benchmarks/synth/parity-longer
mkdir -p "$out"
common=(--task parity --seq-len 64 --eval-seq-len 256 --steps "$steps" --seed 0 --no-baseline "$@")
for s in deltanet deltanet_negeig; do
  python -m mixc synth "specs/$s.mix" "${common[@]}" --json "$out/$s.json" &
done
wait
python benchmarks/synth_combine.py benchmarks/synth_parity_longer.txt benchmarks/synth_parity_longer.png \
  "$out/deltanet.json" "$out/deltanet_negeig.json"
