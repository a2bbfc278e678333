"""`up`'s progress when output is not a terminal (a log file, CI, tee): each new step shows, the last one always,
and a resumed run's rate counts only the steps made since it resumed."""

from __future__ import annotations

import json
from pathlib import Path

from zerobubble.rollout.evaluation import write_progress
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
