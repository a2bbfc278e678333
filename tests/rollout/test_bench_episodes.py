"""`zerobubble bench episodes` at a small scale, through the command: multi-turn figures beside the single-turn
baseline of the same run."""

from __future__ import annotations

import json
import subprocess
import sys


def test_bench_episodes_reports_the_cost_of_turns_beside_single_turn():
    result = subprocess.run(
        [sys.executable, "-m", "zerobubble", "bench", "episodes", "--prompts", "2", "--samples", "2", "--turns", "3",
         "--turn-tokens", "8", "--rounds", "1"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    # Every episode ran its three turns through the environment service.
    assert (figures["episodes"], figures["turns_mean"]) == (4, 3)
    assert figures["multi_turn_tokens_per_s"] > 0 and figures["single_turn_tokens_per_s"] > 0
    assert figures["multi_vs_single"] == round(figures["multi_turn_tokens_per_s"] /
                                               figures["single_turn_tokens_per_s"], 3)
    assert 0 < figures["step_latency_ms_p50"] <= figures["step_latency_ms_p99"]
    assert 0 < figures["environment_wait_fraction"] < 1
