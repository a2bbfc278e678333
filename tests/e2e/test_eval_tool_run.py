"""`zerobubble eval --run` on a finished short tool-demo run, its services gone and no token of the user's set: the
run's calculator environment is started again, the checkpoint's episodes are played with their tool calls, and
pass@1 is printed with the episodes' transcripts (the calculator's answers between the model's turns)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from e2e_helpers import service_env

from zerobubble.common.config import TOKEN_ENV

REPO = Path(__file__).resolve().parents[2]
STEPS = 2
SHORT_TOOL_DEMO = {
    # A short warm start whose every example calls the calculator: the model's samples start with a call (which
    # counts, and is answered, however its argument came out).
    "tiny_model.warm_start_steps": 300, "tiny_model.warm_start_tool_use.fraction": 1.0,
    "task.train_size": 16, "task.eval_size": 4, "run.num_generations": 4,
    "trainer.batch.groups_per_step": 4, "trainer.batch.micro_batch_samples": 16, "trainer.max_steps": STEPS,
    "trainer.strategy.optim.warmup_steps": 0, "rollout.generation.prompts_per_batch": 4,
    "rollout.eval.interval": 1000, "rollout.eval.samples_per_prompt": 2, "final_eval": False,
}


def test_eval_of_a_finished_tool_demo_run_prints_pass_at_1_with_tool_transcripts(tmp_path):
    run_dir = tmp_path / "run"
    environment = {k: v for k, v in service_env().items() if k != TOKEN_ENV}
    up = subprocess.run([sys.executable, "-m", "zerobubble", "up", "--config", "tool-demo",
                         *(f"--set={k}={v}" for k, v in {"run_dir": run_dir, **SHORT_TOOL_DEMO}.items())],
                        cwd=REPO, env=environment, capture_output=True, text=True, timeout=1800)
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    held_out = next((tmp_path / ".assets").glob("*/eval.jsonl"))
    checkpoint = run_dir / "trainer" / "checkpoints" / f"step-{STEPS:06d}"
    scored = subprocess.run([sys.executable, "-m", "zerobubble", "eval", str(checkpoint), "--data", str(held_out),
                             "--run", str(run_dir), "--samples", "4", "--version", str(STEPS), "--transcripts", "16",
                             "--out", str(tmp_path / "scored")],
                            cwd=REPO, env=environment, capture_output=True, text=True, timeout=600)
    assert scored.returncode == 0, scored.stdout[-3000:] + scored.stderr[-3000:]
    assert "auth_token_env" not in scored.stderr
    summary = json.loads(scored.stdout.strip().splitlines()[-1])
    assert summary["n"] == 4 and summary["prompts"] == 4 and 0.0 <= summary["pass@1"] <= 1.0
    results = [json.loads(line) for line in Path(summary["samples"]).read_text().splitlines()]
    # Played in the calculator the eval started: no episode lost to a dead service.
    assert all(r["episode"]["ended"] not in ("unavailable", "reset_failed") for r in results), results
    called = [r for r in results if r["episode"]["tool_calls"] > 0 and r["episode"]["turns"] >= 2]
    assert called, [r["episode"] for r in results]
    # The transcripts printed hold the calculator's answers as the model saw them.
    assert scored.stdout.count("--- ") == 16
    assert "<|im_start|>tool\n" in scored.stdout and "tool calls, ended " in scored.stdout
