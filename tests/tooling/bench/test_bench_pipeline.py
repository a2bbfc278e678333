"""`zerobubble bench pipeline` at a tiny budget: every mode runs the real pipeline (every service its own
process) to the end and gives its figures; on-policy mode trains only on samples of the current policy; the
trainer's time is split into its parts, and the prefetching run has its baseline without prefetch."""

from __future__ import annotations

import argparse

import pytest

from zerobubble.tooling.bench.pipeline import register_bench

PROMPTS = 12
GROUPS_PER_STEP = 2


def test_bench_pipeline_compares_on_policy_and_async_runs(tmp_path):
    parser = argparse.ArgumentParser()
    register_bench(parser.add_subparsers(dest="what"))
    args = parser.parse_args(["pipeline", "--prompts", str(PROMPTS), "--workers", "1", "--max-new-tokens", "4",
                              "--groups-per-step", str(GROUPS_PER_STEP), "--async-staleness", "2",
                              "--warm-start-steps", "0", "--cache", str(tmp_path / "cache")])
    figures = args.measure(args)

    assert figures["groups_per_step"] == GROUPS_PER_STEP and figures["async_vs_on_policy_samples_per_s"] > 0
    assert figures["prefetch_vs_without_samples_per_s"] == round(
        figures["async_with_prefetch"]["samples_per_s"] / figures["async"]["samples_per_s"], 3)
    samples_per_step = GROUPS_PER_STEP * figures["num_generations"]
    for mode, bound, prefetch in (("on_policy", 0, False), ("async", 2, False), ("async_with_prefetch", 2, True)):
        run = figures[mode]
        assert run["max_staleness"] == bound and run["prefetch"] is prefetch
        # The parts of the trainer's time are measured, not derived: together they cannot pass the whole.
        split = run["trainer_time"]
        assert set(split) == {"waiting", "collate", "update", "publish", "other"}
        assert split["update"] > 0 and min(split.values()) >= -0.01
        assert sum(split.values()) == pytest.approx(1.0, abs=0.01)
        assert run["cpu_cores_used"]["trainer"] > 0 and run["cpu_cores_used"]["rollout-0"] > 0
        assert run["cpu_cores_used"]["all"] >= run["cpu_cores_used"]["trainer"]
        assert len(run["load_average"]) == 2 and run["machine_cores"] >= 1
        assert run["steps"] >= 1 and run["samples_trained"] == run["steps"] * samples_per_step
        assert run["samples_per_s"] > 0 and run["training_seconds"] > 0
        assert 0 <= run["trainer_idle_fraction"] < 1
        assert run["staleness_max"] <= bound
        # Every prompt became one stored group; each was delivered to the trainer or dropped as stale.
        assert run["groups_generated"] == PROMPTS and run["filtered"] == 0
        assert run["groups_delivered"] + run["stale_dropped"] == PROMPTS
        assert run["rollout_wait_fraction"] is None or run["rollout_wait_fraction"] >= 0
    # Strictly on-policy, a worker waits for the weights of the step it generates for; only a lease racing the
    # trainer's version bump can go stale (before the buffer counted prompts on lease, most groups did).
    assert figures["on_policy"]["stale_dropped"] <= GROUPS_PER_STEP
