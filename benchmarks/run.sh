#!/usr/bin/env bash
# Regenerate benchmarks/RESULTS.md, benchmarks/results.json and benchmarks/bench.png:
# mixc against flash-linear-attention's pure-PyTorch references, and mixc's own targets;
# then benchmarks/issue15.py (RWKV-6, mLSTM), benchmarks/elementwise.py (Mamba-1's elementwise
# gate), benchmarks/dplr.py (KDA and RWKV-7, the diagonal-plus-low-rank class) and
# benchmarks/writes.py (several writes a token: rank 2 against rank 1), benchmarks/noncausal.py
# (Hydra, a non-causal mixer) and benchmarks/compile.py (torch.compile of every shipped spec's
# layer: the slowest, about 15 minutes on a quiet 2-core machine, a fresh process and an empty
# inductor cache per spec), each in its own section of RESULTS.md (peers.py rewrites the file;
# each then adds its section again).
# Needs, in this environment only: pip install --no-deps fla-core einops (see README.md here).
# Extra arguments go to benchmarks/peers.py (e.g. --max-busy 0.1 on a shared machine).
set -euo pipefail
cd "$(dirname "$0")/.."
python benchmarks/peers.py --threads 2 "$@"
python benchmarks/issue15.py
python benchmarks/elementwise.py --threads 2
python benchmarks/dplr.py --threads 2 --write
python benchmarks/writes.py --threads 2 --write
python benchmarks/noncausal.py --threads 2
python benchmarks/compile.py --threads 1 --write
