"""`zerobubble bench in-flight` at a tiny budget: every weight-update mode runs the real pipeline (every service
its own process) on the same prompts for the same wall time, and gives its figures and the held-out pass@1 of the
checkpoint taken at that time beside between_batches; repeats alternate the order of the modes."""

from __future__ import annotations

import argparse
import json

from zerobubble.tooling.bench.in_flight import BASELINE, register_bench
from zerobubble.tooling.bench.pipeline import metrics_rows

PROMPTS = 12
GROUPS_PER_STEP = 2
TRAIN_SECONDS = 8.0
MODES = (BASELINE, "in_flight")


def test_bench_in_flight_trains_every_mode_for_the_same_time_beside_between_batches(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    parser = argparse.ArgumentParser()
    register_bench(parser.add_subparsers(dest="what"))
    # Epochs enough that the data outlasts the time: each run ends at its time.
    args = parser.parse_args(["in-flight", "--prompts", str(PROMPTS), "--epochs", "200", "--max-new-tokens", "24",
                              "--filler", "16", "--groups-per-step", str(GROUPS_PER_STEP), "--warm-start-steps", "0",
                              "--train-seconds", str(TRAIN_SECONDS), "--repeats", "2", "--modes", ",".join(MODES),
                              "--eval-samples", "1", "--cache", str(tmp_path / "cache"),
                              "--workdir", str(tmp_path / "runs")])
    figures = args.measure(args)

    assert 0 <= figures["held_out_pass@1_at_start"] <= 1
    assert figures["orders"] == [list(MODES), list(reversed(MODES))]
    for mode in MODES:
        assert [run["repeat"] for run in figures["runs"][mode]] == [0, 1]
        for run in figures["runs"][mode]:
            assert run["weight_updates"] == mode and run["max_staleness"] == 2 and run["ended_by"] == "time"
            # Trained for the time, give or take the step under way then (or the wait for its groups).
            rows = metrics_rows(tmp_path / "runs" / f"{mode}-{run['repeat']}" / "trainer" / "metrics.jsonl")
            scored = rows[:run["steps"]]
            longest_step = max(row["step_seconds"] + row["pull_wait_seconds"] for row in scored)
            assert TRAIN_SECONDS - longest_step - 3 <= run["training_seconds"] <= TRAIN_SECONDS + longest_step + 3
            # The scored checkpoint is the one of the last counted step, not a later one.
            assert run["held_out_version"] == rows[run["steps"] - 1]["policy_version"]
            assert 0 <= run["held_out_pass@1"] <= 1
            assert run["samples_per_s"] > 0 and 0 <= run["trainer_idle_fraction"] < 1
            assert 0 <= run["staleness_token_mean"] <= run["staleness_max"]
        summary = figures[mode]
        assert summary["repeats"] == 2
        pass_at_1 = [run["held_out_pass@1"] for run in figures["runs"][mode]]
        assert summary["held_out_pass@1_spread"] == [min(pass_at_1), max(pass_at_1)]
    versus = figures[f"in_flight_vs_{BASELINE}"]
    assert versus["held_out_pass@1_difference"] == [
        round(mine["held_out_pass@1"] - base["held_out_pass@1"], 4)
        for mine, base in zip(figures["runs"]["in_flight"], figures["runs"][BASELINE], strict=True)]
    json.dumps(figures)  # printed as JSON by the CLI
    assert not (tmp_path / "eval").exists(), "the evaluations are written into the runs' folders"


def test_with_episodes_every_mode_plays_the_tool_demos_episodes_in_the_environment_service(tmp_path, monkeypatch):
    import yaml

    monkeypatch.chdir(tmp_path)
    parser = argparse.ArgumentParser()
    register_bench(parser.add_subparsers(dest="what"))
    modes = (BASELINE, "between_turns")
    args = parser.parse_args(["in-flight", "--episodes", "--prompts", str(PROMPTS), "--epochs", "200",
                              "--groups-per-step", str(GROUPS_PER_STEP), "--warm-start-steps", "0",
                              "--train-seconds", str(TRAIN_SECONDS), "--modes", ",".join(modes), "--eval-samples",
                              "1", "--cache", str(tmp_path / "cache"), "--workdir", str(tmp_path / "runs")])
    figures = args.measure(args)

    assert figures["task"] == "tool-demo episodes" and figures["max_new_tokens"] == 64
    assert 0 <= figures["held_out_pass@1_at_start"] <= 1
    for mode in modes:
        run_dir = tmp_path / "runs" / f"{mode}-0"
        spec = yaml.safe_load((run_dir / "configs" / "buffer.yaml").read_text())["run_spec"]
        assert spec["weight_updates"] == mode and spec["episodes"]["default"]["environment"] == "calculator"
        assert (run_dir / "logs" / "environment.log").exists()
        (run,) = figures["runs"][mode]
        assert run["ended_by"] == "time" and run["steps"] > 0 and 0 <= run["held_out_pass@1"] <= 1
    assert "staleness_token_mean" in figures[f"between_turns_vs_{BASELINE}"]
