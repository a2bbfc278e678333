"""A short `zerobubble up` on a user's verl parquet files (training and held-out, given by path alone) with
TensorBoard, offline wandb and the rollout log on: it trains, evaluates per data source, and leaves logs that
TensorBoard's and wandb's own readers read back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from e2e_helpers import metrics_rows, run_up, service_env
from stack import tiny_assets
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from zerobubble.tooling.tiny.task import read_task

STEPS = 3


def verl_parquet(task_jsonl: Path, path: Path, source: str) -> Path:
    """The task's rows as verl's preprocessing writes them."""
    rows = [{"data_source": source, "prompt": row.messages, "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": row.gt_answer}, "extra_info": {"index": i}}
            for i, row in enumerate(read_task(task_jsonl))]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_up_trains_on_verl_parquet_and_leaves_tensorboard_wandb_and_rollout_logs(tmp_path):
    model, train, held_out = tiny_assets(tmp_path / "assets", train_size=16, eval_size=4)
    run_dir = tmp_path / "run"
    config = {
        "run_dir": str(run_dir), "model": str(model),
        "train_data": str(verl_parquet(train, tmp_path / "train.parquet", "arithmetic")),
        "eval_data": str(verl_parquet(held_out, tmp_path / "test.parquet", "arithmetic-heldout")),
        "run": {"num_generations": 4, "max_new_tokens": 8},
        "buffer": {"prompts": {"epochs": 2}},
        "trainer": {"max_steps": STEPS, "batch": {"groups_per_step": 4, "micro_batch_samples": 16},
                    "server": {"grace_seconds": 1.0},
                    "tracking": {"tensorboard": True, "wandb": {"project": "e2e", "mode": "offline"},
                                 "rollout_log": {"interval_steps": 1, "groups": 1}}},
        "rollout": {"generation": {"prompts_per_batch": 4}, "eval": {"samples_per_prompt": 2},
                    "server": {"grace_seconds": 1.0}},
    }
    (tmp_path / "up.yaml").write_text(yaml.safe_dump(config))
    run_up(["--config", str(tmp_path / "up.yaml")], env={**service_env(), "WANDB_SILENT": "true"})

    assert [row["step"] for row in metrics_rows(run_dir)] == list(range(1, STEPS + 1))
    evals = [json.loads(line) for line in (run_dir / "eval" / "summary.jsonl").read_text().splitlines()]
    assert evals[0]["version"] == 0 and evals[-1]["version"] == STEPS
    assert all(set(e["pass@1_by_source"]) == {"arithmetic-heldout"} for e in evals)

    trained = {row["prompt_id"] for row in map(json.loads, (run_dir / "trainer" / "rollouts.jsonl").read_text()
                                                   .splitlines())}
    assert trained and trained <= {str(i) for i in range(16)}

    events = EventAccumulator(str(run_dir / "trainer" / "tensorboard" / "train"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/reward_mean")] == list(range(1, STEPS + 1))
    assert [e.step for e in events.Scalars("pipeline/staleness_mean")] == list(range(1, STEPS + 1))
    evals = EventAccumulator(str(run_dir / "trainer" / "tensorboard" / "eval"))
    evals.Reload()
    # The evaluation before training, and the one after it (logged once the trainer has stopped).
    assert [e.step for e in evals.Scalars("eval/heldout/pass@1")] == [0, STEPS]

    history = []
    for wandb_file in sorted(run_dir.glob("trainer/wandb/offline-run-*/run-*.wandb")):
        inspected = subprocess.run([str(Path(sys.executable).parent / "wandb"), "leet", "inspect", "--json",
                                    str(wandb_file)], capture_output=True, text=True, timeout=120, check=True)
        history += [record["history"]["item"] for record in map(json.loads, inspected.stdout.splitlines())
                    if record["type"] == "history"]
    assert [item["trainer/step"] for item in history if "train/loss" in item] == list(range(1, STEPS + 1))
    assert [item["eval/policy_version"] for item in history if "eval/heldout/pass@1" in item] == [0, STEPS]
    assert any("rollouts/samples._type" in item for item in history)
