"""The launcher's tests pass after `make demo`: they run beside a finished demo run (conftest.py) and in caches of
their own, never the user's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from zerobubble.tooling.cli import main
from zerobubble.tooling.launcher.run_folder import holds_run

ROW = {"prompt": "What is 1+1?", "gt_answer": "2"}


def test_the_tests_run_beside_the_demos_run_so_the_default_folder_is_taken(after_the_demo, capsys):
    """A test that leaves run_dir at its default meets the demo's run here, as on the machine of a user who ran
    `make demo` first (the clean clone of CI would hide it)."""
    assert Path.cwd() == after_the_demo != Path(__file__).resolve().parents[3]
    assert holds_run(Path("runs/demo"))
    assert main(["up", "--dry-run"]) == 2
    assert "run_dir: runs/demo holds a run already" in capsys.readouterr().err


def test_hugging_face_caches_are_the_sessions_own(tmp_path):
    pytest.importorskip("datasets")
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "train.jsonl").write_text(json.dumps(ROW) + "\n")
    # In a fresh interpreter, as a service reads it: `datasets` places its cache under the session's HF_HOME.
    code = ("import datasets, json, sys; d = datasets.load_dataset(sys.argv[1]); "
            "print(json.dumps([datasets.config.HF_DATASETS_CACHE.as_posix(), d['train'].cache_files[0]['filename']]))")
    out = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    cache, arrow_file = json.loads(out.stdout.splitlines()[-1])
    home = Path(os.environ["HF_HOME"])
    assert Path(cache).is_relative_to(home) and Path(arrow_file).is_relative_to(home)
    assert not home.is_relative_to(Path.home() / ".cache")
