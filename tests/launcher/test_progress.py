"""`up`'s progress when output is not a terminal (a log file, CI, tee): each new step shows, the last one always,
and a resumed run's rate counts only the steps made since it resumed."""

from __future__ import annotations

import json
from pathlib import Path

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
