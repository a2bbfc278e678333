"""`zerobubble bench episodes` at a small scale, through the command: both schedules' figures beside the single-turn
baseline of the same run, and the loops with batches overlapping beside lockstep with slow steps."""

from __future__ import annotations

import json
import subprocess
import sys


def test_bench_episodes_reports_both_schedules_beside_single_turn():
    result = subprocess.run(
        [sys.executable, "-m", "zerobubble", "bench", "episodes", "--prompts", "2", "--samples", "2", "--turns", "3",
         "--turn-tokens", "8", "--rounds", "1", "--slow-batches", "3", "--in-flight", "2"],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["single_turn_tokens_per_s"] > 0
    for name in ("lockstep", "loops"):
        schedule = figures[name]
        # Every episode ran its three turns through the environment service.
        assert (schedule["episodes"], schedule["turns_mean"]) == (4, 3)
        assert schedule["vs_single_turn"] == round(schedule["tokens_per_s"] / figures["single_turn_tokens_per_s"],
                                                   3)
        assert 0 < schedule["step_latency_ms_p50"] <= schedule["step_latency_ms_p99"]
        assert 0 <= schedule["engine_idle_fraction"] < 1 and schedule["slow_steps_episodes_per_s"] > 0
    assert figures["loops_vs_lockstep_slow_steps"] == round(figures["loops"]["slow_steps_episodes_per_s"] /
                                                            figures["lockstep"]["slow_steps_episodes_per_s"], 3)
    # Every batch of the slow steps was played by each schedule, the overlapped one two at a time.
    assert figures["lockstep"]["slow_steps_episodes_per_s"] > 0
    overlapped = figures["overlapped"]
    assert (overlapped["batches_in_flight"], overlapped["episodes"]) == (2, 3 * 4)
    assert 0 <= overlapped["engine_idle_fraction"] < 1
    assert figures["overlapped_vs_lockstep_slow_steps"] == round(overlapped["slow_steps_episodes_per_s"] /
                                                                 figures["lockstep"]["slow_steps_episodes_per_s"], 3)
    # An episode's cache was kept between its turns, and measured.
    assert figures["kv_kept_bytes_per_episode"] > 0
