#!/bin/bash
# MQAR at equal state (1024 numbers per layer for every recurrent spec) with the shipped specs
# and a softmax-attention baseline, one model per `mixc synth` process (each result is saved as
# soon as it is trained), then one table and one plot:
#   benchmarks/synth_mqar.sh [STEPS [WIDTH [HEADS]]]      (defaults 1000, 64 and 4)
# Settings (fixed before any result was seen, the same for every model): 16 key-value pairs in
# 64 tokens, vocabulary 64 (chance 1/32), 2 blocks of width 64 with 4 heads of 16, batch 32,
# the command's optimiser defaults. Writes benchmarks/synth/mqar/*.json,
# benchmarks/synth_mqar.txt and benchmarks/synth_mqar.png. A WIDTH other than 64 (4 heads of
# WIDTH/4, a state of 4 (WIDTH/4)^2 per layer) writes benchmarks/synth/mqar-wWIDTH/ and
# benchmarks/synth_mqar_wWIDTH.{txt,png}, HEADS other than 4 add -hHEADS and _hHEADS, and
# STEPS other than 1000 add -sSTEPS and _sSTEPS to those names. Extra arguments after WIDTH go to every `mixc synth`
# (e.g. --device cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-1000}
width=${2:-64}
heads=${3:-4}
shift 3 || shift 2 || shift || true
out=benchmarks/synth/mqar
name=synth_mqar
if [ "$width" != 64 ]; then
  out=benchmarks/synth/mqar-w$width
  name=synth_mqar_w$width
fi
if [ "$heads" != 4 ]; then
  out=$out-h$heads
  name=${name}_h$heads
fi
if [ "$steps" != 1000 ]; then
  out=$out-s$steps
  name=${name}_s$steps
fi
mkdir -p "$out"
common=(--task mqar --seq-len 64 --pairs 16 --vocab 64 --hidden "$width" --heads "$heads" --steps "$steps" "$@")
models=(deltanet gated_deltanet gla mamba2 linear_attention retnet)
python -m mixc synth "${common[@]}" --json "$out/attention.json"
for s in "${models[@]}"; do
  python -m mixc synth "specs/$s.mix" --no-baseline "${common[@]}" --json "$out/$s.json"
done
python benchmarks/synth_combine.py "benchmarks/$name.txt" "benchmarks/$name.png" \
  "$out/attention.json" $(printf "$out/%s.json " "${models[@]}")
