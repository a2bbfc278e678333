#!/usr/bin/env bash
# Builds the ColossalAI virtual environment: the project, then colossalai and what it needs here without
# dependency resolution (its own pins would replace torch). Usage: deploy/colossalai/build-env.sh [VENV_DIR]
# (default .venv-colossalai)
set -euo pipefail
cd "$(dirname "$0")/../.."
venv="${1:-.venv-colossalai}"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -e '.[dev]'
"$venv/bin/python" -m pip install --quiet --no-deps -r deploy/colossalai/requirements.txt
"$venv/bin/python" -W ignore -c "
import colossalai
from zerobubble.trainer.strategies.colossalai import _import_colossalai
_import_colossalai()
print('colossalai', colossalai.__version__)"
touch "$venv/.installed-stamp"
