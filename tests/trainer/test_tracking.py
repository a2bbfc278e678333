"""The trainer's dashboards, read back with their own libraries: TensorBoard's EventAccumulator, and wandb's own
reader of an offline run (`wandb leet inspect --json`); the rollout log as JSONL; nothing without configuration."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from zerobubble.common.config import ConfigError, load_config
from zerobubble.trainer.config import RolloutLogConfig, TrainerServiceConfig
from zerobubble.trainer.tracking import ROLLOUT_LOG, TENSORBOARD_DIR, WANDB_ID_FILE, Tracker, log_new_evaluations
from zerobubble.v1 import common_pb2


def config(run_dir: Path, **tracking) -> TrainerServiceConfig:
    return TrainerServiceConfig(model="m", run_dir=run_dir, tracking=tracking)


def group(step: int, index: int) -> common_pb2.ExperienceGroup:
    prompt = common_pb2.Prompt(prompt_id=f"p{step}-{index}", epoch=0, gt_answer=str(step + index),
                               messages_json=json.dumps([{"role": "user", "content": f"{step}+{index}="}]))
    trajectories = [common_pb2.Trajectory(response_text=f"\\boxed{{{step + index + k}}}", reward=float(k == 0),
                                          answer_ok=k == 0, format_ok=True, policy_version=step - 1,
                                          finish_reason=common_pb2.FINISH_REASON_STOP) for k in range(2)]
    return common_pb2.ExperienceGroup(prompt=prompt, trajectories=trajectories)


def step_row(step: int) -> dict:
    return {"step": step, "policy_version": step, "time": 1.0e9 + step, "loss": 0.5 / step, "reward_mean": 0.1 * step,
            "trainer_idle_fraction": 0.25, "staleness_mean": 1.0, "weight_sync_seconds": 0.01 * step}


def train(tracker: Tracker, steps: range, summary: Path) -> None:
    for step in steps:
        if step % 2 == 0:
            with open(summary, "a") as out:
                out.write(json.dumps({"version": step, "dataset": "heldout", "prompts": 4, "n": 2, "pass@1": 0.1 * step,
                                      "pass@2": 0.2, "pass@1_by_source": {"gsm8k": 0.05 * step}}) + "\n")
        tracker.log_step(step_row(step), [group(step, i) for i in range(3)])
    tracker.close()


def scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    """TensorBoard's view of one tag: the evaluations are a run of their own beside the training's."""
    events = EventAccumulator(str(run_dir / TENSORBOARD_DIR / ("eval" if tag.startswith("eval/") else "train")))
    events.Reload()
    return [(event.step, round(event.value, 6)) for event in events.Scalars(tag)]


def wandb_records(run_dir: Path) -> list[dict]:
    """Every record of every offline run file there, through wandb's own reader."""
    records = []
    for path in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        done = subprocess.run([str(Path(sys.executable).parent / "wandb"), "leet", "inspect", "--json", str(path)],
                              capture_output=True, text=True, timeout=120, check=True)
        records += [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return records


def test_tensorboard_wandb_and_the_rollout_log_hold_the_steps_the_evaluations_and_the_timing(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir, summary = tmp_path / "trainer", tmp_path / "eval" / "summary.jsonl"
    summary.parent.mkdir()
    tracker = Tracker(config(run_dir, tensorboard=True, wandb={"project": "test", "mode": "offline"},
                             rollout_log={"interval_steps": 2, "groups": 2, "tokens": False}, eval_summary=summary))
    train(tracker, range(1, 5), summary)

    assert scalars(run_dir, "train/loss") == [(s, round(0.5 / s, 6)) for s in range(1, 5)]
    assert scalars(run_dir, "pipeline/trainer_idle_fraction") == [(s, 0.25) for s in range(1, 5)]
    assert scalars(run_dir, "pipeline/weight_sync_seconds") == [(s, round(0.01 * s, 6)) for s in range(1, 5)]
    assert scalars(run_dir, "eval/heldout/pass@1") == [(2, 0.2), (4, 0.4)]
    assert scalars(run_dir, "eval/heldout/gsm8k/pass@1") == [(2, 0.1), (4, 0.2)]

    history = [r["history"]["item"] for r in wandb_records(run_dir) if r["type"] == "history"]
    steps = [(item["trainer/step"], item["train/loss"]) for item in history if "train/loss" in item]
    assert steps == [(s, pytest.approx(0.5 / s)) for s in range(1, 5)]
    assert [item["pipeline/staleness_mean"] for item in history if "pipeline/staleness_mean" in item] == [1.0] * 4
    evals = [(item["eval/policy_version"], item["eval/heldout/pass@1"]) for item in history
             if "eval/policy_version" in item]
    assert evals == [(2, pytest.approx(0.2)), (4, pytest.approx(0.4))]
    tables = [item for item in history if "rollouts/samples._type" in item]
    assert [t["trainer/step"] for t in tables] == [2, 4]
    table_file = next(run_dir.glob("wandb/offline-run-*")) / "files" / tables[0]["rollouts/samples.path"]
    table = json.loads(table_file.read_text())
    assert len(table["data"]) == 4 and table["columns"][:3] == ["step", "prompt_id", "prompt"]

    logged = [json.loads(line) for line in (run_dir / ROLLOUT_LOG).read_text().splitlines()]
    assert [row["step"] for row in logged] == [2, 2, 4, 4]
    first = logged[0]
    assert first["messages"][0]["role"] == "user" and first["gt_answer"] == str(2 + int(first["prompt_id"][-1]))
    assert [(r["reward"], r["answer_ok"], r["policy_version"]) for r in first["responses"]] == [
        (1.0, True, 1), (0.0, False, 1)]


def test_a_resumed_trainer_continues_the_same_dashboards_without_repeating_steps(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir, summary = tmp_path / "trainer", tmp_path / "summary.jsonl"
    settings = {"tensorboard": True, "wandb": {"mode": "offline"}, "eval_summary": summary}
    train(Tracker(config(run_dir, **settings)), range(1, 5), summary)
    run_id = (run_dir / WANDB_ID_FILE).read_text()
    # Stopped after step 4 with its checkpoint at step 2: steps 3 and 4 are trained again, and the new weights of
    # version 4 evaluated again.
    train(Tracker(config(run_dir, **settings)), range(3, 6), summary)

    assert [step for step, _ in scalars(run_dir, "train/loss")] == [1, 2, 3, 4, 5]
    assert scalars(run_dir, "eval/heldout/pass@1") == [(2, 0.2), (4, 0.4), (4, 0.4)]
    run_files = sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(run_files) == 2 and {path.name for path in run_files} == {f"run-{run_id}.wandb"}


def test_evaluations_written_after_the_trainer_stopped_reach_its_dashboards(tmp_path):
    run_dir, summary = tmp_path / "trainer", tmp_path / "summary.jsonl"
    settings = {"tensorboard": True, "eval_summary": summary}
    train(Tracker(config(run_dir, **settings)), range(1, 3), summary)
    with open(summary, "a") as out:
        out.write(json.dumps({"version": 2, "dataset": "final", "prompts": 4, "n": 2, "pass@1": 0.5}) + "\n")
    log_new_evaluations(config(run_dir, **settings))
    assert scalars(run_dir, "eval/heldout/pass@1") == [(2, 0.2)]
    assert scalars(run_dir, "eval/final/pass@1") == [(2, 0.5)]


def test_without_tracking_the_run_writes_what_it_wrote_before(tmp_path):
    run_dir, summary = tmp_path / "trainer", tmp_path / "summary.jsonl"
    run_dir.mkdir()
    train(Tracker(config(run_dir, eval_summary=summary)), range(1, 3), summary)
    assert sorted(p.name for p in run_dir.iterdir()) == []


def test_tracking_only_on_the_first_data_parallel_rank(tmp_path):
    run_dir, summary = tmp_path / "trainer", tmp_path / "summary.jsonl"
    run_dir.mkdir()
    tracker = Tracker(config(run_dir, tensorboard=True, rollout_log={"interval_steps": 1}), active=False)
    train(tracker, range(1, 3), summary)
    assert sorted(p.name for p in run_dir.iterdir()) == []


def test_bad_tracking_settings_are_refused_naming_the_field(tmp_path):
    with pytest.raises(ConfigError, match="tracking.wandb.mode"):
        load_config(TrainerServiceConfig, None, {"model": "m", "tracking.wandb.mode": "cloud"})
    with pytest.raises(ConfigError, match="tracking.rollout_log.interval_steps"):
        load_config(TrainerServiceConfig, None, {"model": "m", "tracking.rollout_log.interval_steps": 0})


def test_the_rollout_log_shows_an_episodes_turns_and_how_it_ended():
    from zerobubble.trainer.tracking import rollout_sample
    from zerobubble.v1 import common_pb2

    group = common_pb2.ExperienceGroup(prompt=common_pb2.Prompt(prompt_id="p", messages_json="[]", gt_answer="3"))
    group.trajectories.add(response_text="@calculator(1+2)\ntool\n3\n\\boxed{3}", reward=1.0).episode.CopyFrom(
        common_pb2.EpisodeInfo(environment="calculator", turns=2, tool_calls=1, step_rewards=[0.0, 1.0],
                               ended_reason="done"))
    group.trajectories.add(response_text="\\boxed{4}")
    config = RolloutLogConfig(groups=1, tokens=False)
    episode, single = rollout_sample([group], step=1, policy_version=1, config=config)[0]["responses"]
    assert episode["episode"] == {"environment": "calculator", "turns": 2, "tool_calls": 1,
                                  "step_rewards": [0.0, 1.0], "ended_reason": "done"}
    assert episode["text"].startswith("@calculator(1+2)") and "episode" not in single
