"""The viewer on a run with episodes, in headless chromium: the Evaluations page shows an episode's whole transcript
(the tool's answers between the model's turns) with its turns and tool calls, and the curves have a panel of the
episodes that failed in their environment, by reason, only when the run has them."""

from __future__ import annotations

import json
from pathlib import Path

from viewer_helpers import NEEDS_CHROMIUM, chromium, viewer

TRANSCRIPT = "@calculator(23+45)<|im_end|>\n<|im_start|>tool\n68<|im_end|>\n<|im_start|>assistant\n\\boxed{68}"


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def episode_run(run_dir: Path, *, failures: bool) -> None:
    endings = {"episodes": 8, "episodes_failed": 3, "episodes_failed_timeout": 3} if failures else {}
    write_jsonl(run_dir / "trainer" / "metrics.jsonl", [
        {"step": step, "policy_version": step, "reward_mean": 0.5, **endings} for step in (1, 2)])
    write_jsonl(run_dir / "eval" / "summary.jsonl", [
        {"version": v, "dataset": "heldout", "prompts": 1, "n": 1, "pass@1": 1.0} for v in (0, 2)])
    for version in (0, 2):
        write_jsonl(run_dir / "eval" / "heldout" / f"version-{version:06d}.jsonl", [
            {"prompt_id": "7", "sample": 0, "text": "\\boxed{68}", "reward": 1.0, "answer_ok": True,
             "finish_reason": "stop", "question": "23+45=", "gt_answer": "68",
             "episode": {"transcript": TRANSCRIPT, "turns": 2, "tool_calls": 1, "ended": "done"}}])


@NEEDS_CHROMIUM
def test_the_evaluations_show_an_episodes_transcript_and_the_curves_its_failures(tmp_path):
    episode_run(tmp_path / "run", failures=True)
    with viewer(tmp_path / "run") as base:
        evals, console = chromium(f"{base}/#evals/heldout/0/2")
        curves, more = chromium(f"{base}/#curves")
    assert console == [] and more == [], console + more
    # At both versions, the whole episode rather than its last turn alone.
    assert evals.count("@calculator(23+45)&lt;|im_end|&gt;\n&lt;|im_start|&gt;tool\n68") == 2, evals[-3000:]
    assert evals.count("2 turns · 1 tool calls · ended: done") == 2
    assert 'id="charts-episodes"' in curves and 'data-title="episodes failed in their environment"' in curves
    assert 'data-key="episodes_failed_timeout"' in curves


@NEEDS_CHROMIUM
def test_a_run_without_failures_has_no_episodes_panel(tmp_path):
    episode_run(tmp_path / "run", failures=False)
    with viewer(tmp_path / "run") as base:
        curves, console = chromium(f"{base}/#curves")
    assert console == [] and 'id="charts-learning"' in curves and 'id="charts-episodes"' not in curves
