"""`zerobubble bench reward --load` at a small scale, through the command: more streams than the server
has threads, every stream served, no health check failed, and the figures all reported."""

from __future__ import annotations

import json
import subprocess
import sys


def test_bench_reward_load_serves_every_stream_and_every_health_check():
    result = subprocess.run(
        [sys.executable, "-m", "zerobubble", "bench", "reward", "--load", "--streams", "24", "--seconds", "4",
         "--math-workers", "1"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["streams"] == 24 and figures["items"] > 0 and figures["items_per_s"] > 0
    assert figures["items_per_stream_min"] > 0 and figures["streams_starved"] == 0
    assert figures["stream_errors"] == 0 and figures["items_unanswered_at_end"] == 0
    assert figures["health_checks"] > 0 and figures["health_failures"] == 0
    assert figures["latency_p50_ms"] <= figures["latency_p99_ms"] <= figures["latency_max_ms"]
    assert figures["service_rss_mib_before"] > 0 and figures["service_rss_mib_after"] > 0
