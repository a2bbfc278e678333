"""The run's summary.json: the "after" is an evaluation of trained weights, never the start's again (a run with
final_eval: false whose only evaluation was before training)."""

from __future__ import annotations

import json

from zerobubble.tooling.launcher.run import finish
from zerobubble.tooling.launcher.run_folder import SUMMARY_FILE


def evaluated(run_dir, *versions_and_scores):
    (run_dir / "eval").mkdir(parents=True)
    (run_dir / "eval" / "summary.jsonl").write_text(
        "".join(json.dumps({"version": v, "pass@1": s}) + "\n" for v, s in versions_and_scores))


def test_without_an_evaluation_after_training_the_summary_has_no_after(tmp_path):
    evaluated(tmp_path, (0, 0.25))
    summary = finish(tmp_path, 12.0)
    assert summary["eval_before"] == 0.25 and summary["version_before"] == 0
    assert "eval_after" not in summary and "version_after" not in summary
    assert json.loads((tmp_path / SUMMARY_FILE).read_text()) == summary


def test_the_after_is_the_last_evaluation_with_its_version(tmp_path):
    evaluated(tmp_path, (0, 0.25), (3, 0.5), (2, 0.4))
    summary = finish(tmp_path, 12.0)
    assert (summary["eval_before"], summary["version_before"]) == (0.25, 0)
    assert (summary["eval_after"], summary["version_after"]) == (0.5, 3)
