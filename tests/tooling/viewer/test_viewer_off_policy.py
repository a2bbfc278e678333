"""The viewer's off-policy panel, in headless chromium: a run that records the rollout-trainer gap, the behaviour
weights and the teacher's reverse KL shows each as a curve; a run that records none of them has no such panel."""

from __future__ import annotations

import json
from pathlib import Path

from viewer_helpers import NEEDS_CHROMIUM, chromium, viewer

OFF_POLICY = {"rollout_gap_kl": 0.002, "rollout_gap_abs": 0.04, "behaviour_weight_mean": 1.01,
              "behaviour_weight_max": 1.3, "mismatch_masked_fraction": 0.05, "teacher_reverse_kl": 0.6}


def run_with(run_dir: Path, figures: dict) -> None:
    (run_dir / "trainer").mkdir(parents=True)
    (run_dir / "trainer" / "metrics.jsonl").write_text("".join(
        json.dumps({"step": step, "policy_version": step, "reward_mean": 0.5, **figures}) + "\n" for step in (1, 2, 3)))


@NEEDS_CHROMIUM
def test_a_run_recording_the_gap_and_the_teacher_shows_them_in_the_off_policy_panel(tmp_path):
    run_with(tmp_path / "run", OFF_POLICY)
    with viewer(tmp_path / "run") as base:
        curves, console = chromium(f"{base}/#curves")
    assert console == [] and 'id="charts-off-policy"' in curves, curves[-3000:]
    for title in ("rollout-trainer gap", "behaviour weight", "corrected tokens", "reverse KL to the teacher"):
        assert f'data-title="{title}"' in curves, title
    for key in OFF_POLICY:
        assert f'data-key="{key}"' in curves, key


@NEEDS_CHROMIUM
def test_a_run_without_them_has_no_off_policy_panel(tmp_path):
    run_with(tmp_path / "run", {})
    with viewer(tmp_path / "run") as base:
        curves, console = chromium(f"{base}/#curves")
    assert console == [] and 'id="charts-learning"' in curves and 'id="charts-off-policy"' not in curves
