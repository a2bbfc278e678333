#!/usr/bin/env bash
# Builds the tinker-cookbook virtual environment: the cookbook and the official client, without the project (the
# cookbook only talks to a Tinker front over HTTP). Its torch is the main environment's (`make install`), linked
# into this one's site-packages: the cookbook needs torch only to build tensors, and a second copy is 750 MB.
# Usage: deploy/tinker-cookbook/build-env.sh [VENV_DIR] [MAIN_VENV_DIR]  (defaults .venv-cookbook, .venv)
set -euo pipefail
cd "$(dirname "$0")/../.."
venv="${1:-.venv-cookbook}"
main="${2:-.venv}"
torch_dir=$("$main/bin/python" -c "import pathlib, torch; print(pathlib.Path(torch.__file__).parent.parent)") || {
	echo "build-env: no torch in $main (make install first)" >&2; exit 1; }
torch_version=$("$main/bin/python" -c "import torch; print(torch.__version__)")
python3 -m venv "$venv"
site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
for entry in "$torch_dir"/torch "$torch_dir"/torchgen "$torch_dir"/functorch "$torch_dir"/torch-*.dist-info; do
	ln -sfn "$(realpath "$entry")" "$site/$(basename "$entry")"
done
"$venv/bin/python" -m pip install --quiet --upgrade pip
# Pinning torch to the linked version keeps pip from replacing it (and deleting through the links).
"$venv/bin/python" -m pip install --quiet -r deploy/tinker-cookbook/requirements.txt \
	-c <(echo "torch==$torch_version")
"$venv/bin/python" -c "import tinker_cookbook.rl.train, tinker_cookbook.supervised.train, torch
print('tinker-cookbook', tinker_cookbook.__version__, 'torch', torch.__version__)"
touch "$venv/.installed-stamp"
