"""The shipped template for a real small model (Qwen2.5-0.5B-Instruct on GSM8K) runs under `zerobubble up` as a user
copies it, with the tiny model and task standing in for the model and data it names: its settings reach the
services and it trains."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from e2e_helpers import metrics_rows, run_up, service_env
from stack import tiny_assets
from transformers import AutoModelForCausalLM

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
    output = run_up(["--config", "qwen2.5-0.5b-instruct-gsm8k", *(f"--set={k}={v}" for k, v in sets.items())],
                    cwd=tmp_path)
    assert "qwen2.5-0.5b-instruct-gsm8k.yaml" in output, "the effective run names the template"
    assert [row["step"] for row in metrics_rows(run_dir)] == list(range(1, STEPS + 1))
    spec = load_config(BufferServiceConfig, run_dir / "configs" / "buffer.yaml").run_spec
    assert (spec.algorithm, spec.verifier) == ("GRPO", "boxed")
    optim = load_config(TrainerServiceConfig, run_dir / "configs" / "trainer.yaml").strategy.optim
    assert (optim.lr, optim.schedule, optim.min_lr_ratio) == (1e-6, "cosine", 0.1)
    assert optim.total_steps == STEPS, "the cosine spans the run's steps, derived"

    # What users of the peers do next: export the final policy as a plain HF folder, and evaluate it.
    exported = tmp_path / "exported"
    done = subprocess.run([sys.executable, "-m", "zerobubble", "export", str(run_dir), str(exported)],
                          capture_output=True, text=True, timeout=300, env=service_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["step"] == STEPS
    assert {path.name for path in exported.iterdir()} & {"optimizer.pt", "scheduler.pt", "rng.pt"} == set()
    final = AutoModelForCausalLM.from_pretrained(run_dir / "trainer" / "checkpoints" / f"step-{STEPS:06d}")
    again = AutoModelForCausalLM.from_pretrained(exported)
    assert all(torch.equal(a, b) for a, b in zip(final.state_dict().values(), again.state_dict().values(),
                                                   strict=True))
    done = subprocess.run([sys.executable, "-m", "zerobubble", "eval", str(exported), "--data", str(held_out),
                           "--run", str(run_dir), "--samples", "2", "--out", str(tmp_path / "eval")],
                          capture_output=True, text=True, timeout=300, env=service_env())
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["prompts"] == 4 and summary["n"] == 2 and 0.0 <= summary["pass@1"] <= summary["pass@2"] <= 1.0
    results = [json.loads(line) for line in Path(summary["samples"]).read_text().splitlines()]
    assert len(results) == 8 and sum(r["answer_ok"] for r in results) / 8 == pytest.approx(summary["pass@1"])
    # How far it got, after each engine call: what `up` shows while the starting weights are evaluated.
    progress = json.loads((tmp_path / "eval" / "progress.json").read_text())
    assert (progress["prompts_done"], progress["prompts"], progress["seconds_left"]) == (4, 4, 0)


def test_a_run_launched_from_python_is_followed_step_by_step(tmp_path):
    import zerobubble

    model, train, held_out = tiny_assets(tmp_path / "assets", train_size=16, eval_size=4)
    run = zerobubble.launch(None, run_dir=tmp_path / "run", model=model, train_data=train, eval_data=held_out,
                            **{"run.num_generations": 4, "run.max_new_tokens": 8, "trainer.max_steps": 2,
                               "trainer.batch.groups_per_step": 4, "rollout.generation.prompts_per_batch": 4,
                               "rollout.eval.samples_per_prompt": 2, "trainer.strategy.optim.warmup_steps": 0})
    try:
        steps = [row["step"] for row in run.steps(poll_seconds=0.2)]
        summary = run.wait(timeout=60)
    finally:
        if run.running:
            run.stop()
    assert steps == [1, 2]
    assert summary["run_dir"] == str(tmp_path / "run") and "eval_after" in summary
