"""The shipped template for a real small model (Qwen2.5-0.5B-Instruct on GSM8K) runs under `zerobubble up` as a user
copies it, with the tiny model and task standing in for the model and data it names: its settings reach the
services and it trains."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from e2e_helpers import metrics_rows, service_env
from stack import tiny_assets

from zerobubble.buffer.config import BufferServiceConfig
from zerobubble.common.config import load_config
from zerobubble.trainer.config import TrainerServiceConfig

STEPS = 2


def test_the_qwen_gsm8k_template_trains_with_a_tiny_stand_in(tmp_path):
    model, train, held_out = tiny_assets(tmp_path / "assets", train_size=16, eval_size=4)
    run_dir = tmp_path / "run"
    # What a user changes in their copy: the folders; and, for this machine, sizes a 1M model can take.
    sets = {"model": model, "train_data": train, "eval_data": held_out, "run_dir": run_dir,
            "run.max_new_tokens": 8, "run.max_prompt_tokens": 200, "run.num_generations": 4, "trainer.max_steps": STEPS,
            "trainer.batch.groups_per_step": 4, "trainer.strategy.optim.warmup_steps": 1,
            "rollout.generation.prompts_per_batch": 4, "rollout.eval.samples_per_prompt": 2, "final_eval": False,
            "pipeline.torch_threads": 1}
    command = [sys.executable, "-m", "zerobubble", "up", "--config", "qwen2.5-0.5b-instruct-gsm8k",
               *(f"--set={key}={value}" for key, value in sets.items())]
    process = subprocess.Popen(command, cwd=tmp_path, env=service_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=600)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 0, output[-4000:]
    assert "qwen2.5-0.5b-instruct-gsm8k.yaml" in output, "the effective run names the template"
    assert [row["step"] for row in metrics_rows(run_dir)] == list(range(1, STEPS + 1))
    spec = load_config(BufferServiceConfig, run_dir / "configs" / "buffer.yaml").run_spec
    assert (spec.algorithm, spec.verifier) == ("GRPO", "boxed")
    optim = load_config(TrainerServiceConfig, run_dir / "configs" / "trainer.yaml").strategy.optim
    assert (optim.lr, optim.schedule, optim.min_lr_ratio) == (1e-6, "cosine", 0.1)
    assert optim.total_steps == STEPS, "the cosine spans the run's steps, derived"
