"""The HAProxy front (`zerobubble front`) before a real buffer service under a small descriptor limit: a flood of
quiet connections from one address takes every descriptor of the service when it meets it directly, and through
the front keeps neither the health check nor an authenticated call of another address from answering, while the
quiet connections are closed within the stated time and a long, quiet stream of a real client stays open."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import grpc
import h2.config
import h2.connection
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from zerobubble.tooling.bench import stop_service
from zerobubble.tooling.bench.connections import QuietConnections, _fd_limit, _grpc_probes, _probe, _serve
from zerobubble.tooling.front import FrontConfig, running_front
from zerobubble.tooling.ports import free_port

pytestmark = pytest.mark.skipif(shutil.which("haproxy") is None,
                                reason="haproxy is not installed (make front-tool installs it)")

FD_LIMIT = 256
QUIET = 300
KEEPALIVE_S = 4.0
KEEPALIVE_TIMEOUT_S = 1.0
# The stated bound on a quiet connection's life: the service's unanswered ping, through the front as without it.
CLOSED_WITHIN_S = KEEPALIVE_S + KEEPALIVE_TIMEOUT_S
FLOODER = "127.0.0.2"


def _preface() -> bytes:
    """What a gRPC client sends first (the HTTP/2 preface and its settings); the flood sends it and then nothing,
    without waiting for the server's settings, so that the service meets all of them at once."""
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    connection.initiate_connection()
    return connection.data_to_send()


def _flood(address: str) -> QuietConnections:
    return QuietConnections(address, QUIET, http2=False, opening=_preface(), source=FLOODER)


def _probes_for(address: str, seconds: float) -> list[tuple[float | None, float | None]]:
    # Within the goal of an authenticated call (1 s); the health check's p50 goal (100 ms) is the bench's to measure.
    health, authenticated = _grpc_probes(address, "buffer", timeout=1.0)
    results = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        results.append((_probe(health), _probe(authenticated)))
        time.sleep(0.2)
    return results


def _open_within(quiet: QuietConnections, most: int, within: float) -> int:
    end = time.monotonic() + within
    while len(quiet.sockets) - quiet.poll() > most and time.monotonic() < end:
        time.sleep(0.05)
    return len(quiet.sockets) - quiet.poll()


def _closed_after(quiet: QuietConnections, within: float) -> float | None:
    started = time.monotonic()
    while time.monotonic() - started < within:
        if quiet.poll() >= len(quiet.sockets):
            return time.monotonic() - started
        time.sleep(0.1)
    return None


@pytest.fixture
def buffer(tmp_path: Path):
    subprocess.run([sys.executable, "-m", "zerobubble", "make-task", "arithmetic", str(tmp_path / "task"),
                    "--train-size", "16", "--eval-size", "4"], check=True, capture_output=True)
    process, address = _serve("buffer", [
        f"server.connections.keepalive_seconds={KEEPALIVE_S}",
        f"server.connections.keepalive_timeout_seconds={KEEPALIVE_TIMEOUT_S}",
        "server.connections.min_client_ping_seconds=1",
        f"prompts.path={tmp_path / 'task' / 'train.jsonl'}", f"wal.directory={tmp_path / 'wal'}"], FD_LIMIT, tmp_path)
    try:
        yield address
    finally:
        stop_service(process)


def test_the_front_keeps_callers_answered_through_a_flood_of_quiet_connections_from_one_peer(buffer):
    # Without the front the flood takes every descriptor: new callers wait unanswered until the quiet ones close.
    quiet = _flood(buffer)
    try:
        direct = _probes_for(buffer, 2.0)
        assert any(health is None for health, _ in direct), direct
    finally:
        quiet.close()
    health, _ = _grpc_probes(buffer, "buffer", timeout=1.0)
    recovered = time.monotonic() + CLOSED_WITHIN_S + 3
    while _probe(health) is None:
        assert time.monotonic() < recovered, "the buffer did not recover after the direct flood"

    config = FrontConfig(listen=f"127.0.0.1:{free_port()}", backend=buffer, per_peer_connections=50,
                         max_connections=(FD_LIMIT - 32) // 2, client_timeout_seconds=KEEPALIVE_S + 2)
    with running_front(config, preexec_fn=_fd_limit(FD_LIMIT)), grpc.insecure_channel(config.listen) as channel:
        # A real client's stream with nothing to say for longer than the front's timeout: the service's pings and
        # their answers keep it open.
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        started = time.monotonic()
        quiet = _flood(config.listen)
        try:
            # Those beyond the peer's limit are refused at once (reset, or closed as soon as accepted).
            assert _open_within(quiet, config.per_peer_connections, 1.0) <= config.per_peer_connections
            through = _probes_for(config.listen, 3.0)
            assert all(health is not None and call is not None for health, call in through), through
            closed = _closed_after(quiet, CLOSED_WITHIN_S + 2)
            assert closed is not None and time.monotonic() - started < CLOSED_WITHIN_S + 2, quiet.closed_count
        finally:
            quiet.close()
        time.sleep(max(0.0, started + config.client_timeout_seconds + 1 - time.monotonic()))
        assert not watch.done(), watch
        watch.cancel()
