"""`zerobubble bench environment` at a small scale, through the command: every figure reported, the environments'
latencies beside the round trip of a call that runs nothing."""

from __future__ import annotations

import json
import subprocess
import sys


def test_bench_environment_reports_latencies_and_throughput_with_its_baseline():
    result = subprocess.run(
        [sys.executable, "-m", "zerobubble", "bench", "environment", "--samples", "20", "--episodes", "8",
         "--turns", "3", "--concurrency", "4"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert 0 < figures["grpc_round_trip"]["p50_ms"] <= figures["grpc_round_trip"]["p99_ms"]
    for name in ("calculator", "user_environment"):
        for call in ("open", "step"):
            assert 0 < figures[name][call]["p50_ms"] <= figures[name][call]["p99_ms"]
        concurrent = figures[f"{name}_concurrent"]
        assert concurrent["steps_per_s"] > 0 and concurrent["episodes_per_s"] > 0
        assert concurrent["steps_per_s"] >= concurrent["episodes_per_s"] * 3 * 0.99  # three steps an episode
