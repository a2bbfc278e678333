"""`zerobubble bench connections` with small numbers: its figures have their shape, and with short limits the quiet
connections are closed while health and an authenticated call keep answering."""

from __future__ import annotations

from zerobubble.tooling.bench.connections import bench_connections
from zerobubble.tooling.cli import BENCHES


def test_the_bench_reports_latencies_and_when_the_quiet_connections_closed():
    assert BENCHES["connections"][0] == "bench.connections"
    figures = bench_connections(connections=60, fd_limit=256, idle_seconds=1.0, keepalive_seconds=1.0,
                                keepalive_timeout_seconds=1.0, watch_seconds=20.0, services=("buffer",))
    assert (figures["connections"], figures["fd_limit"]) == (60, 256)
    buffer = figures["buffer_grpc"]
    assert set(buffer) == {"opened", "failed_to_connect", "handshaken", "closed_by_server", "all_closed_after_s",
                           "health_checks", "health_failed", "health_p50_ms", "health_max_ms",
                           "authenticated_call_checks", "authenticated_call_failed", "authenticated_call_p50_ms",
                           "authenticated_call_max_ms"}
    assert buffer["opened"] == buffer["handshaken"] == buffer["closed_by_server"] == 60, buffer
    assert buffer["all_closed_after_s"] is not None and buffer["all_closed_after_s"] < 20.0, buffer
    assert buffer["health_failed"] == 0 and buffer["authenticated_call_failed"] == 0, buffer
    assert buffer["health_checks"] >= 2 and buffer["health_p50_ms"] > 0, buffer
