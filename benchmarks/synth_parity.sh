#!/bin/bash
# Running parity: DeltaNet (erase beta_t in (0, 1): eigenvalues of the transition in [0, 1])
# against the same spec with the erase in (0, 2) (specs/deltanet_negeig.mix: eigenvalues in
# [-1, 1]; Grazzi et al. 2024, arXiv 2411.12537), and softmax attention, one model per
# `mixc synth` process, for two seeds, then one table and one plot per seed:
#   benchmarks/synth_parity.sh [STEPS]    (default 2000)
# Settings (fixed before any result was seen, the same for every model): sequences of 64 random
# bits, the running parity scored at every position (chance 1/2), 2 blocks of width 64 with
# 4 heads, batch 32, the command's optimiser defaults. Writes benchmarks/synth/parity/*.json,
# benchmarks/synth_parity[_seed1].txt and .png. Extra arguments after STEPS go to every
# `mixc synth` (e.g. --device cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-2000}
shift || true
out=benchmarks/synth/parity
mkdir -p "$out"
for seed in 0 1; do
  common=(--task parity --seq-len 64 --steps "$steps" --seed "$seed" "$@")
  python -m mixc synth "${common[@]}" --json "$out/attention_seed$seed.json"
  for s in deltanet deltanet_negeig; do
    python -m mixc synth "specs/$s.mix" --no-baseline "${common[@]}" --json "$out/${s}_seed$seed.json"
  done
  name=benchmarks/synth_parity$([ "$seed" = 0 ] || echo "_seed$seed")
  python benchmarks/synth_combine.py "$name.txt" "$name.png" \
    $(printf "$out/%s_seed$seed.json " attention deltanet deltanet_negeig)
done
