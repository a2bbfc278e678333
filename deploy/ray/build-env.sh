#!/usr/bin/env bash
# Builds the Ray virtual environment: ray with the project installed beside it, so `zerobubble bench transport` can
# measure the reference design's actor-queue hand-off live. Usage: deploy/ray/build-env.sh [VENV_DIR]  (default .venv-ray)
set -euo pipefail
cd "$(dirname "$0")/../.."
venv="${1:-.venv-ray}"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -r deploy/ray/requirements.txt -e .
"$venv/bin/python" -c "import ray, torch, zerobubble.tooling.bench.transport_ray; print('ray', ray.__version__)"
touch "$venv/.installed-stamp"
