"""`zerobubble bench environment` at a small scale, through the command: figures that come from real steps (each
timed step answered as a step, the counts add up), the user's environment measured isolated and not in one run (its
episodes reported their user ids: workers.uid, then root), beside the round trip of a call that runs nothing."""

from __future__ import annotations

import json
import subprocess
import sys

from zerobubble.environment.config import WorkersConfig

SAMPLES, EPISODES, TURNS = 12, 6, 3


def test_bench_environment_measures_real_steps_isolated_and_not_in_one_run():
    result = subprocess.run(
        [sys.executable, "-m", "zerobubble", "bench", "environment", "--samples", str(SAMPLES), "--episodes",
         str(EPISODES), "--turns", str(TURNS), "--concurrency", "3"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert 0 < figures["grpc_round_trip"]["p50_ms"] <= figures["grpc_round_trip"]["p99_ms"]
    for name in ("calculator", "user_environment", "user_environment_unisolated"):
        assert figures[name]["steps"] == SAMPLES  # every timed step was a step, not an ended episode
        assert 0 < figures[name]["open"]["p50_ms"] <= figures[name]["open"]["p99_ms"]
        concurrent = figures[f"{name}_concurrent"]
        assert concurrent["steps"] == EPISODES * TURNS
        assert concurrent["steps_per_s"] > 0
        assert concurrent["steps_per_s"] >= concurrent["episodes_per_s"] * TURNS * 0.99
    # The steps ran where the figures say: the isolated path as workers.uid, the other as the service's root.
    assert figures["user_environment"]["uids"] == [WorkersConfig().uid]
    assert figures["user_environment_unisolated"]["uids"] == [0]
    cost = figures["isolation_cost"]
    assert cost["isolated"] is True and cost["open_p50_ratio"] > 0 and cost["step_p50_ratio"] > 0
