"""The wheel with the train extra runs `zerobubble up` from an empty folder: the demo config it reads ships inside
the wheel, not beside a source tree.

Installing torch, transformers and the rest into a fresh environment takes minutes, so this environment holds only the
wheel and reaches this checkout's environment (whose versions are constraints.txt's) through a .pth line for its
dependencies. The light install's test (test_light_install.py) does install every dependency of its own."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig

import pytest
from venvs import build_wheel, clean_env

# The demo made small: no warm start, a short task, two training steps of four groups of four.
SMALL_RUN = {
    "tiny_model.warm_start_steps": 0, "task.train_size": 32, "task.eval_size": 4, "buffer.prompts.epochs": 1,
    "run.num_generations": 4, "run.max_new_tokens": 8, "trainer.batch.groups_per_step": 4,
    "trainer.batch.micro_batch_samples": 16, "rollout.generation.prompts_per_batch": 4,
    "rollout.eval.interval": 1000, "rollout.eval.samples_per_prompt": 2, "final_eval": False, "trainer.max_steps": 2,
}


@pytest.fixture(scope="module")
def train_env(tmp_path_factory):
    wheel = build_wheel(tmp_path_factory.mktemp("wheel"))
    venv = tmp_path_factory.mktemp("venv") / "train"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                    str(wheel)], check=True, timeout=300)
    # Added only after the install, so pip never sees (or touches) the editable install of this checkout; a .pth line
    # puts a folder on the path without running that folder's own .pth files, so that editable install stays off.
    own = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    with open(f"{own}/zz-dependencies.pth", "w") as pth:
        pth.write(sysconfig.get_paths()["purelib"] + "\n")
    return venv / "bin"


def test_the_wheel_not_the_checkout_is_imported(train_env, tmp_path):
    code = "import zerobubble, zerobubble.tooling.configs as c; print(zerobubble.__file__); print(c.DEMO.read_text())"
    reply = subprocess.run([str(train_env / "python"), "-c", code], capture_output=True, text=True, timeout=60,
                           cwd=tmp_path, env=clean_env(), check=True)
    assert reply.stdout.startswith(str(train_env.parent)), reply.stdout
    assert "run_dir: runs/demo" in reply.stdout


def test_up_runs_the_shipped_demo_from_an_empty_folder(train_env, tmp_path):
    command = [str(train_env / "zerobubble"), "up", *(f"--set={key}={value}" for key, value in SMALL_RUN.items())]
    reply = subprocess.run(command, cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=300)
    assert reply.returncode == 0, reply.stdout[-3000:] + reply.stderr[-3000:]
    # The demo's own run_dir (runs/demo, relative to where `up` runs): the shipped demo.yaml was read.
    metrics = tmp_path / "runs" / "demo" / "trainer" / "metrics.jsonl"
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines() if '"step"' in line]
    assert max(steps) == 2


def test_a_missing_config_is_an_error(train_env, tmp_path):
    reply = subprocess.run([str(train_env / "zerobubble"), "up", "--config", "nowhere.yaml"], cwd=tmp_path,
                           env=clean_env(), capture_output=True, text=True, timeout=120)
    assert reply.returncode == 2
    assert "--config nowhere.yaml: no such file, and no shipped config of that name" in reply.stderr
    assert not (tmp_path / "runs").exists()
