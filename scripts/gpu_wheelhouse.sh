#!/usr/bin/env bash
# Build what scripts/gpu_check.sh carries to a bare GPU machine (python3 with torch,
# transformers and torch-geometric, no package index): wheels of the pbkv dependencies
# such a machine lacks, for every Python it may run, and SmolLM2's tokenizer.json.
#
#   scripts/gpu_wheelhouse.sh [PYTHON_VERSION ...]     (default: 3.11 3.12 3.13 3.14)
#
# Writes build/gpu/wheelhouse/*.whl, build/gpu/wheelhouse/requirements.txt (the pins,
# taken from this environment, which the tests ran in) and build/gpu/tokenizer.json.
# build/ is git-ignored: carry it with the device call (carry=["build/gpu"], about 6 MB).
# Pure-Python wheels serve every version; msgspec has one wheel per version
# (manylinux x86_64), charset-normalizer too. scripts/gpu_env.py picks the right one on the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(3.11 3.12 3.13 3.14)
out=build/gpu
wheels=$out/wheelhouse
rm -rf "$wheels"
mkdir -p "$wheels"
# pbkv's runtime dependencies that do not come with torch + transformers (trio and its
# own, msgspec, rich and its own, gguf and its own), pinned to what this environment has;
# with them `pip install --no-index --find-links build/gpu/wheelhouse -r
# build/gpu/wheelhouse/requirements.txt` resolves in a venv holding only torch and
# transformers.
python - "$wheels/requirements.txt" <<'PY'
import importlib.metadata as md
import sys

names = ["trio", "attrs", "sortedcontainers", "idna", "outcome", "sniffio", "msgspec",
         "rich", "markdown-it-py", "mdurl", "pygments",
         "gguf", "requests", "urllib3", "certifi", "charset-normalizer"]
with open(sys.argv[1], "w") as f:
    for name in names:
        f.write(f"{name}=={md.version(name)}\n")
PY
for v in "${versions[@]}"; do
  if ! python -m pip download --quiet --no-deps --only-binary=:all: --dest "$wheels" \
      --python-version "$v" --implementation cp --abi "cp${v/./}" --abi abi3 --abi none \
      --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux_2_28_x86_64 --platform any \
      -r "$wheels/requirements.txt"; then
    echo "gpu_wheelhouse: no complete set of wheels for Python $v (skipped)" >&2
  fi
done
python - "$out/tokenizer.json" <<'PY'
import sys

from pbkv.assets import load_tokenizer

load_tokenizer().save(sys.argv[1])
PY
ls "$wheels" >&2
du -sh "$out" >&2
