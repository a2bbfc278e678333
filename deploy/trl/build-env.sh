#!/usr/bin/env bash
# Builds the TRL virtual environment: trl with the project installed beside it, so a GRPOTrainer can take the
# project's TRL reward adapter. Usage: deploy/trl/build-env.sh [VENV_DIR]  (default .venv-trl)
set -euo pipefail
cd "$(dirname "$0")/../.."
venv="${1:-.venv-trl}"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -r deploy/trl/requirements.txt -e '.[dev]'
"$venv/bin/python" -c "import trl, zerobubble.reward.adapters.trl; print('trl', trl.__version__)"
touch "$venv/.installed-stamp"
