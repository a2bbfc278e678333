"""`zerobubble bench in-flight` at a tiny budget: every weight-update mode runs the real pipeline (every service
its own process) on the same prompts, each gives its figures and held-out pass@1 beside between_batches."""

from __future__ import annotations

import argparse

from zerobubble.tooling.bench.in_flight import BASELINE, MODES, register_bench

PROMPTS = 12
GROUPS_PER_STEP = 2


def test_bench_in_flight_runs_every_mode_beside_between_batches(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    parser = argparse.ArgumentParser()
    register_bench(parser.add_subparsers(dest="what"))
    args = parser.parse_args(["in-flight", "--prompts", str(PROMPTS), "--max-new-tokens", "24", "--filler", "16",
                              "--groups-per-step", str(GROUPS_PER_STEP), "--warm-start-steps", "0",
                              "--eval-samples", "1", "--cache", str(tmp_path / "cache")])
    figures = args.measure(args)

    assert 0 <= figures["held_out_pass@1_at_start"] <= 1
    for mode in MODES:
        run = figures[mode]
        assert run["weight_updates"] == mode and run["max_staleness"] == 2
        assert run["samples_per_s"] > 0 and 0 <= run["trainer_idle_fraction"] < 1
        assert run["groups_delivered"] + run["stale_dropped"] + run["filtered"] == PROMPTS
        assert 0 <= run["held_out_pass@1"] <= 1 and "learning_per_minute" in run
        # No token is older than the oldest token of the stalest sample.
        assert 0 <= run["staleness_token_mean"] <= run["staleness_max"]
        if mode != BASELINE:
            versus = figures[f"{mode}_vs_{BASELINE}"]
            assert versus["samples_per_s"] == round(run["samples_per_s"] / figures[BASELINE]["samples_per_s"], 3)
            assert versus["stale_dropped"] == [run["stale_dropped"], figures[BASELINE]["stale_dropped"]]
    assert not (tmp_path / "eval").exists(), "the evaluations are written into the runs' folders"
