"""`up`'s progress when output is not a terminal (a log file, CI, tee): each new step shows, the last one always,
and a resumed run's rate counts only the steps made since it resumed; environments failing show on the console."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zerobubble.common.trajectory import EpisodeRecord, Trajectory
from zerobubble.rollout.episodes.failures import EnvironmentsFailing, FailureWatch
from zerobubble.rollout.evaluation import write_progress
from zerobubble.tooling.launcher.failures import FAILURE_LOG, EnvironmentsFailed, FailureFollower
from zerobubble.tooling.launcher.progress import ProgressLine


def add_step(metrics: Path, step: int, samples: int = 8) -> None:
    with open(metrics, "a") as f:
        f.write(json.dumps({"step": step, "policy_version": step, "samples": samples, "reward_mean": 0.5}) + "\n")


def rate(line: str) -> float:
    return float(line.split()[-2])


def test_without_a_terminal_a_short_run_prints_its_steps_and_always_the_last(tmp_path, capsys):
    metrics = tmp_path / "trainer" / "metrics.jsonl"
    metrics.parent.mkdir()
    progress = ProgressLine(tmp_path, interval=3600)
    progress.start()
    progress.refresh()
    assert capsys.readouterr().out == ""
    add_step(metrics, 1)
    progress.last_print -= 2
    progress.refresh()
    assert "step 1 " in capsys.readouterr().out
    add_step(metrics, 2)
    add_step(metrics, 3)
    progress.refresh()  # within a second of the last line: held back
    assert capsys.readouterr().out == ""
    progress.close()
    out = capsys.readouterr().out
    assert "step 3 " in out and out.count("\n") == 1


def test_a_resumed_run_counts_only_its_own_steps(tmp_path, capsys):
    metrics = tmp_path / "trainer" / "metrics.jsonl"
    metrics.parent.mkdir()
    for step in range(1, 21):
        add_step(metrics, step, samples=1000)
    progress = ProgressLine(tmp_path, interval=3600)
    progress.start()
    progress.started -= 10  # ten seconds into the resumed run
    add_step(metrics, 21, samples=8)
    progress.close()
    line = capsys.readouterr().out
    assert "step 21 " in line
    assert 0.5 < rate(line) < 1.0, line  # 8 samples in about 10 s, not 20 old steps' 20,000


def test_before_the_first_step_the_line_says_the_starting_weights_are_evaluated_then_their_result(tmp_path, capsys):
    (tmp_path / "trainer").mkdir()
    progress = ProgressLine(tmp_path, interval=0, evaluation="3 prompts x 2 samples")
    progress.start()
    progress.refresh()
    assert "evaluating the starting weights first: 3 prompts x 2 samples)" in capsys.readouterr().out
    write_progress(tmp_path / "eval", {"dataset": "heldout", "version": 0, "prompts_done": 2, "prompts": 3,
                                       "samples_per_prompt": 2, "seconds": 10.0, "seconds_left": 5.0})
    progress.refresh()
    assert "evaluating the starting weights first: 3 prompts x 2 samples, 2/3 prompts done, about 5 s left)" in \
        capsys.readouterr().out
    (tmp_path / "eval" / "summary.jsonl").write_text(json.dumps({"version": 0, "prompts": 3, "pass@1": 0.25}) + "\n")
    progress.refresh()
    assert "waiting for the first training step (before training: pass@1 0.250 on 3 prompts)" in \
        capsys.readouterr().out


def test_the_evaluation_size_is_read_from_the_first_workers_config(tmp_path):
    from zerobubble.tooling.launcher.config import UpConfig, write_yaml
    from zerobubble.tooling.launcher.run import Run

    held_out = tmp_path / "test.jsonl"
    held_out.write_text("".join(json.dumps({"problem": f"{i}+1", "solution": str(i + 1)}) + "\n" for i in range(5)))
    run = Run(UpConfig(run_dir=tmp_path))
    assert run.evaluation_size(at_start=True) is None
    eval_section = {"datasets": {"heldout": {"path": str(held_out)}}, "samples_per_prompt": 2, "max_prompts": 3}
    write_yaml(tmp_path / "configs" / "rollout-0.yaml", {"model": {"path": str(tmp_path)}, "eval": eval_section})
    assert run.evaluation_size(at_start=True) == "3 prompts x 2 samples"
    periodic = {**eval_section, "at_start": False, "interval": 5, "max_prompts": None}
    write_yaml(tmp_path / "configs" / "rollout-0.yaml", {"model": {"path": str(tmp_path)}, "eval": periodic})
    assert run.evaluation_size(at_start=True) is None
    assert run.evaluation_size(at_start=False) == "5 prompts x 2 samples"


def test_a_step_whose_episodes_all_failed_is_a_warning_and_the_line_counts_failures_by_reason(tmp_path, capsys):
    metrics = tmp_path / "trainer" / "metrics.jsonl"
    metrics.parent.mkdir()
    progress = ProgressLine(tmp_path, interval=0)
    progress.start()
    with open(metrics, "a") as f:
        f.write(json.dumps({"step": 1, "policy_version": 1, "samples": 8, "episodes": 8, "episodes_failed": 3,
                            "episodes_failed_timeout": 3}) + "\n")
    progress.refresh()
    out = capsys.readouterr().out
    assert "env failures 3/8 (timeout 3)" in out and "WARNING" not in out
    with open(metrics, "a") as f:   # two steps between two looks: each gets its warning
        for step in (2, 3):
            f.write(json.dumps({"step": step, "policy_version": step, "samples": 8, "episodes": 8,
                                "episodes_failed": 8, "episodes_failed_error": 6,
                                "episodes_failed_bad_reply": 2}) + "\n")
    progress.refresh()
    out = capsys.readouterr().out
    for step in (2, 3):
        assert f"WARNING: step {step} trained on nothing: all 8 of its episodes ended with their environment " \
               "failing (error 6, bad_reply 2)" in out
    assert "env failures 8/8 (error 6, bad_reply 2)" in out


def failed(environment: str, reason: str, error: str) -> Trajectory:
    return Trajectory(prompt_ids=[3], response_ids=[0], logprobs=[0.0], loss_mask=[1], versions=[0],
                      finish_reason="stop", temperature=1.0,
                      episode=EpisodeRecord(environment, turns=1, ended_reason=reason, error=error))


def test_the_console_shows_each_first_error_and_a_workers_stop_ends_the_run_naming_it(tmp_path):
    said = []
    follower = FailureFollower(tmp_path / FAILURE_LOG, said.append)
    follower.poll()   # nothing yet
    watch = FailureWatch("rollout-0", 2, tmp_path / FAILURE_LOG)
    batch = [[failed("broken", "error", "step raised KeyError: 'x'\nTraceback (innermost frames):\n  File "
                     "\"broken_env.py\", line 7, in step"), failed("broken", "timeout", "no answer within 5 s")]]
    watch.observe(batch)
    follower.poll()
    assert len(said) == 2 and "rollout-0: environment 'broken' ended an episode with error" in said[0]
    assert "broken_env.py\", line 7" in said[0] and "no answer within 5 s" in said[1]
    with pytest.raises(EnvironmentsFailing):
        watch.observe(batch)
    with pytest.raises(EnvironmentsFailed) as stopped:
        follower.poll()
    assert "rollout-0 stopped the run: environment 'broken' failed every episode for 2 batches" in str(stopped.value)
    assert "step raised KeyError" in str(stopped.value) and len(said) == 2
    # A resumed run does not show again what the last one showed.
    again = []
    FailureFollower(tmp_path / FAILURE_LOG, again.append).poll()
    assert again == []
