"""The evaluation after a run: skipped when the worker's periodic evaluation already had the last weights."""

from __future__ import annotations

import json

import pytest

from zerobubble.common.config import ConfigError
from zerobubble.tooling.launcher.final_eval import evaluate_checkpoint
from zerobubble.trainer.checkpoints import STATE_FILE


def run_with_checkpoint(tmp_path, version: int, evaluated: list[int]):
    checkpoint = tmp_path / "trainer" / "checkpoints" / f"step-{version:06d}"
    checkpoint.mkdir(parents=True)
    (checkpoint / STATE_FILE).write_text(json.dumps({"step": version, "policy_version": version}))
    (tmp_path / "eval").mkdir()
    rows = [{"version": v, "dataset": "heldout", "pass@1": 0.1} for v in evaluated]
    (tmp_path / "eval" / "summary.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return tmp_path


def test_weights_the_worker_already_evaluated_are_not_evaluated_again(tmp_path):
    run_dir = run_with_checkpoint(tmp_path, 50, evaluated=[0, 25, 50])
    # Nothing listens at the reward address and the checkpoint holds no model: evaluating would fail.
    assert evaluate_checkpoint(run_dir, tmp_path / "eval.jsonl", "127.0.0.1:1") is None
    assert len((run_dir / "eval" / "summary.jsonl").read_text().splitlines()) == 3


def test_new_weights_are_evaluated(tmp_path):
    run_dir = run_with_checkpoint(tmp_path, 60, evaluated=[0, 25, 50])
    # It goes on to read the worker's sampling settings, which this bare run folder does not have.
    with pytest.raises(ConfigError, match="rollout-0.yaml"):
        evaluate_checkpoint(run_dir, tmp_path / "eval.jsonl", "127.0.0.1:1")
