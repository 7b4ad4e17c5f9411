#!/usr/bin/env bash
# Install NVIDIA Dynamo 1.6.1 (what pbkv's Dynamo worker and `pbkv cluster` run on) and
# nats-server (its event plane, on 127.0.0.1), into the current Python environment.
# `pip install ai-dynamo` fails here: its aisimulate dependency is a stub whose build
# fetches the real wheel from NVIDIA's own index, and only Dynamo's planner imports it.
# So the two wheels go in with --no-deps and their other listed dependencies by name
# (the list is ai-dynamo's and ai-dynamo-runtime's Requires-Dist, less aisimulate).
# etcd is not needed: the workers and the frontend discover each other through files
# (DYN_DISCOVERY_BACKEND=file).
set -euo pipefail
cd "$(dirname "$0")/.."
pip_install() { python -m pip install --quiet --disable-pip-version-check "$@"; }
pip_install --no-deps "ai-dynamo==1.6.1" "ai-dynamo-runtime==1.6.1"
echo "setup_dynamo.sh: ai-dynamo goes in without aisimulate (only its planner needs it);" \
    "pip's 'requires aisimulate' ERROR line that may follow is expected" >&2
pip_install "aiohttp>=3.14.3,<4.0" "certifi>=2026.10.19" "kubernetes>=32.0.1,<33.0.0" \
    "msgspec>=0.19.0" "prometheus-client>=0.23.1,<1.0" "pyzmq>=26.0.0" "redis>=6.2.0,<9.0.0" \
    "tqdm>=4.0.0" "transformers>=4.56.0" "typing-extensions>=4.10.0" \
    "zstandard>=0.23.0,<1.0" "pydantic>=2.10.6,<=2.13.5" "uvloop>=0.21.0"
if ! command -v nats-server >/dev/null; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && apt-get install -y -qq nats-server >/dev/null
    else
        echo "setup_dynamo.sh: nats-server is missing; install it (apt-get install nats-server)" >&2
        exit 1
    fi
fi
