#!/bin/bash
# Running parity, then scored on sequences 4 times longer than those trained on (the length
# generalisation Grazzi et al. 2024, arXiv 2411.12537, measure): DeltaNet (erase in (0, 1))
# against specs/deltanet_negeig.mix (erase in (0, 2)), the two trainings side by side, for two
# seeds:
#   benchmarks/synth_parity_longer.sh [STEPS]    (default 2000)
# The settings of synth_parity.sh plus --eval-seq-len 256. Writes
# benchmarks/synth/parity-longer/*_seed{0,1}.json and
# benchmarks/synth_parity_longer[_seed1].{txt,png}. Extra arguments after STEPS go to every
# `mixc synth` (e.g. --device cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-2000}
shift || true
out=benchmarks/synth/parity-longer
mkdir -p "$out"
for seed in 0 1; do
  common=(--task parity --seq-len 64 --eval-seq-len 256 --steps "$steps" --seed "$seed" --no-baseline "$@")
  for s in deltanet deltanet_negeig; do
    python -m mixc synth "specs/$s.mix" "${common[@]}" --json "$out/${s}_seed$seed.json" &
  done
  wait
  name=benchmarks/synth_parity_longer$([ "$seed" = 0 ] || echo "_seed$seed")
  python benchmarks/synth_combine.py "$name.txt" "$name.png" \
    "$out/deltanet_seed$seed.json" "$out/deltanet_negeig_seed$seed.json"
done
