#!/usr/bin/env bash
# mixc on a CUDA GPU against flash-linear-attention's Triton kernels (chunk_simple_gla,
# chunk_gla, chunk_gated_delta_rule, chunk_delta_rule, chunk_kda): forward and forward+backward of mixc's
# PyTorch backend, the same under torch.compile, mixc's Triton backend, and fla, at fla's
# benchmark shapes in bf16. Writes benchmarks/RESULTS-gpu.md. Without a CUDA device it reports
# "no CUDA device", checks its own set-up on CPU (the Triton backend in triton's interpreter)
# and exits 0 without writing anything. Extra arguments go to benchmarks/gpu.py (--repeats N,
# --only SPEC, --dry).
set -euo pipefail
cd "$(dirname "$0")/.."
# A machine without a network (this workplace's GPU machines) takes its missing packages from
# wheels carried in .whl/ (lark for mixc, fla-core and einops for the comparison; --no-deps,
# so that the installed torch and triton stay as they are), installed into /tmp/site.
if compgen -G ".whl/*.whl" >/dev/null; then
    python -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
# what it needs, installed only where missing: mixc with its Triton extra, and fla
python -c "import mixc, triton" 2>/dev/null || python -m pip install -q -e ".[triton]"
python -c "import fla, einops" 2>/dev/null || python -m pip install -q --no-deps fla-core einops
exec python benchmarks/gpu.py "$@"
