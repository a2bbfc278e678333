"""`zerobubble bench connections`: each service, started as its own process under a small file-descriptor limit,
against thousands of connections that open and go quiet: gRPC ones that finish the HTTP/2 handshake and then
say nothing (answering no ping), and for the reward service HTTP ones whose request headers never end.

Meanwhile, from new connections as a new caller would make them: the health check's latency (goal: p50 and max
under 100 ms) and an authenticated call's (goal: under 1 s), and how long until the service has closed the quiet
connections. A check that fails (no descriptor left to accept it, say) counts as a failure, not a latency.

With `--front haproxy` each gRPC port is measured again behind `zerobubble front`, where a quiet connection
refused by the per-peer limit is reset at once and counts in `failed_to_connect`.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import h2.config
import h2.connection
import h2.events
from grpc_health.v1 import health_pb2, health_pb2_grpc

from zerobubble.tooling.bench import stop_service
from zerobubble.tooling.front import FrontConfig, running_front
from zerobubble.tooling.ports import free_port
from zerobubble.v1 import buffer_pb2, buffer_pb2_grpc, reward_pb2, reward_pb2_grpc

TOKEN_ENV = "ZEROBUBBLE_BENCH_TOKEN"
TOKEN = "bench-connections-token"
PROBE_TIMEOUT_S = 5.0
PROBE_EVERY_S = 0.25
HANDSHAKE_S = 10.0
SETTLE_AFTER_CLOSE_S = 1.5


def _endpoint(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def _raise_own_limit(needed: int) -> None:
    """This process holds every quiet connection's other end."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(needed, hard), hard))


class QuietConnections:
    """`count` connections to `address` that send `opening` (or, for gRPC, finish the HTTP/2 handshake) and then
    nothing; `poll()` says how many the server has closed so far."""

    def __init__(self, address: str, count: int, *, http2: bool, opening: bytes = b"", source: str | None = None):
        self.sockets: list[socket.socket] = []
        self.failed_to_connect = 0
        self.handshaken = 0
        self.closed_count = 0
        self._open = selectors.DefaultSelector()
        connections: dict[socket.socket, h2.connection.H2Connection] = {}
        for sock in self._connect(address, count, source):
            if http2:
                connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
                connection.initiate_connection()
                opening = connection.data_to_send()
                connections[sock] = connection
            with contextlib.suppress(OSError):
                sock.sendall(opening)
            self.sockets.append(sock)
            self._open.register(sock, selectors.EVENT_READ)
        if http2:
            self._settle(connections)

    def _connect(self, address: str, count: int, source: str | None) -> list[socket.socket]:
        """All at once, without blocking: a server whose accept queue is full leaves the rest unanswered, and one
        at a time each would wait out its own timeout."""
        connecting = selectors.DefaultSelector()
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            if source is not None:
                sock.bind((source, 0))
            sock.setblocking(False)
            sock.connect_ex(_endpoint(address))
            connecting.register(sock, selectors.EVENT_WRITE)
        connected = []
        end = time.monotonic() + HANDSHAKE_S
        while connecting.get_map() and (left := end - time.monotonic()) > 0:
            for key, _ in connecting.select(left):
                connecting.unregister(key.fileobj)
                if key.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                    connected.append(key.fileobj)
                else:
                    key.fileobj.close()
        for key in list(connecting.get_map().values()):
            key.fileobj.close()
        connecting.close()
        self.failed_to_connect = count - len(connected)
        return connected

    def _settle(self, connections: dict[socket.socket, h2.connection.H2Connection]) -> None:
        """Acknowledge each server's settings once (the handshake's end); from then on nothing is answered."""
        waiting = set(connections)
        end = time.monotonic() + HANDSHAKE_S
        while waiting and time.monotonic() < end:
            for key, _ in self._open.select(0.1):
                sock = key.fileobj
                if sock not in waiting:
                    continue
                try:
                    data = sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    waiting.discard(sock)
                    self._forget(sock)
                    continue
                events = connections[sock].receive_data(data)
                if any(isinstance(event, h2.events.RemoteSettingsChanged) for event in events):
                    with contextlib.suppress(OSError):
                        sock.sendall(connections[sock].data_to_send())
                    waiting.discard(sock)
                    self.handshaken += 1

    def _forget(self, sock: socket.socket) -> None:
        self._open.unregister(sock)
        self.closed_count += 1

    def poll(self) -> int:
        """Reads (and drops) what arrived without answering; the number of connections closed by the server."""
        for key, _ in self._open.select(0):
            try:
                if not key.fileobj.recv(65536):
                    self._forget(key.fileobj)
            except BlockingIOError:
                pass
            except OSError:
                self._forget(key.fileobj)
        return self.closed_count

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()
        self._open.close()


def _probe(call: Callable[[], None]) -> float | None:
    started = time.perf_counter()
    try:
        call()
    except (grpc.RpcError, OSError):
        return None
    return time.perf_counter() - started


def _grpc_probes(address: str, service: str,
                 timeout: float = PROBE_TIMEOUT_S) -> tuple[Callable[[], None], Callable[[], None]]:
    """A health check and an authenticated call, each on a connection of its own, made for the call."""
    token = (("authorization", f"Bearer {TOKEN}"),)
    # Not gRPC's process-wide pool of connections: a probe after a refused one would share its reconnect backoff
    # and fail without trying.
    options = [("grpc.use_local_subchannel_pool", 1)]

    def health() -> None:
        with grpc.insecure_channel(address, options) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
            if reply.status != health_pb2.HealthCheckResponse.SERVING:
                raise OSError("not serving")

    def authenticated() -> None:
        with grpc.insecure_channel(address, options) as channel:
            if service == "buffer":
                buffer_pb2_grpc.BufferServiceStub(channel).Stats(buffer_pb2.StatsRequest(), metadata=token,
                                                                timeout=timeout)
            else:
                reward_pb2_grpc.RewardServiceStub(channel).Score(
                    reward_pb2.ScoreRequest(id="1", verifier="boxed", response="\\boxed{2}", gt_answer="2"),
                    metadata=token, timeout=timeout)

    return health, authenticated


def _figures(seconds: list[float | None], prefix: str) -> dict:
    answered = [s for s in seconds if s is not None]
    return {f"{prefix}_checks": len(seconds), f"{prefix}_failed": len(seconds) - len(answered),
            f"{prefix}_p50_ms": round(statistics.median(answered) * 1000, 1) if answered else None,
            f"{prefix}_max_ms": round(max(answered) * 1000, 1) if answered else None}


def _watch(quiet: QuietConnections, probes: tuple[Callable[[], None], Callable[[], None]], seconds: float) -> dict:
    health, authenticated = probes
    health_s: list[float | None] = []
    call_s: list[float | None] = []
    started = time.monotonic()
    all_closed = None
    while time.monotonic() - started < seconds:
        health_s.append(_probe(health))
        call_s.append(_probe(authenticated))
        if quiet.poll() >= len(quiet.sockets):
            all_closed = time.monotonic() - started
            break
        time.sleep(PROBE_EVERY_S)
    # And once they are gone: a service that never recovered shows here. A front frees a connection's slot up to a
    # second after closing it (timeout client-fin), as the flood never closes its own half.
    time.sleep(SETTLE_AFTER_CLOSE_S)
    health_s.append(_probe(health))
    call_s.append(_probe(authenticated))
    return {"opened": len(quiet.sockets), "failed_to_connect": quiet.failed_to_connect,
            "handshaken": quiet.handshaken, "closed_by_server": quiet.closed_count,
            "all_closed_after_s": None if all_closed is None else round(all_closed, 1),
            **_figures(health_s, "health"), **_figures(call_s, "authenticated_call")}


def _fd_limit(fd_limit: int) -> Callable[[], None]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))

    return limit


def _serve(service: str, settings: list[str], fd_limit: int, directory: Path) -> tuple[subprocess.Popen, str]:
    log = open(directory / f"{service}.log", "w")
    command = [sys.executable, "-m", "zerobubble", "serve", service]
    for setting in ["server.listen=127.0.0.1:0", "server.metrics_port=null", "server.grace_seconds=0.5",
                    f"server.auth_token_env={TOKEN_ENV}", *settings]:
        command += ["--set", setting]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True, preexec_fn=_fd_limit(fd_limit),
                               env={**os.environ, TOKEN_ENV: TOKEN})
    log.close()
    line = process.stdout.readline()
    if not line:
        process.kill()
        raise RuntimeError(f"zerobubble serve {service} did not start; see {directory / f'{service}.log'}")
    return process, json.loads(line)["address"]


def _flood(service: str, kind: str, address: str, http_port: int, connections: int, watch_seconds: float,
           source: str | None = None) -> dict:
    """The quiet connections against `address` (the service's gRPC port, or a front before it) from `source`,
    watched with probes from 127.0.0.1."""
    target = address if kind == "grpc" else f"127.0.0.1:{http_port}"
    quiet = QuietConnections(target, connections, http2=kind == "grpc", source=source,
                             opening=b"POST /v1/score HTTP/1.1\r\nHost: bench\r\n")
    try:
        return _watch(quiet, _grpc_probes(address, service), watch_seconds)
    finally:
        quiet.close()


def bench_connections(connections: int = 2000, fd_limit: int = 1024, idle_seconds: float = 60.0,
                      keepalive_seconds: float = 30.0, keepalive_timeout_seconds: float = 10.0,
                      watch_seconds: float = 180.0, services: tuple[str, ...] = ("buffer", "reward"),
                      front: str | None = None, per_peer_connections: int = 100,
                      front_timeout_seconds: float | None = None) -> dict:
    """With `front="haproxy"`, each gRPC port is also measured behind an HAProxy front under the same descriptor
    limit (`zerobubble front`): the quiet connections from another address (127.0.0.2, a peer of their own), and
    then from the probes' own address, beside the run without it."""
    _raise_own_limit(2 * connections + 256)
    limits = [f"server.connections.idle_seconds={idle_seconds}",
              f"server.connections.keepalive_seconds={keepalive_seconds}",
              f"server.connections.keepalive_timeout_seconds={keepalive_timeout_seconds}"]
    figures: dict = {"connections": connections, "fd_limit": fd_limit, "idle_seconds": idle_seconds,
                     "keepalive_seconds": keepalive_seconds, "keepalive_timeout_seconds": keepalive_timeout_seconds}
    if front is not None:
        if front != "haproxy":
            raise ValueError(f"front: {front!r} is not one of: haproxy")
        front_config = FrontConfig(
            listen=f"127.0.0.1:{free_port()}", backend="127.0.0.1:0", per_peer_connections=per_peer_connections,
            # Two descriptors a connection, and a few for HAProxy's own use.
            max_connections=(fd_limit - 32) // 2,
            **({} if front_timeout_seconds is None else {"client_timeout_seconds": front_timeout_seconds}))
        figures["front"] = {"kind": front, **front_config.model_dump(exclude={"listen", "backend"})}
    with tempfile.TemporaryDirectory(prefix="bench-connections-") as folder:
        directory = Path(folder)
        subprocess.run([sys.executable, "-m", "zerobubble", "make-task", "arithmetic", str(directory / "task"),
                        "--train-size", "16", "--eval-size", "4"], check=True, capture_output=True)
        extra = {
            "buffer": [f"prompts.path={directory / 'task' / 'train.jsonl'}", f"wal.directory={directory / 'wal'}"],
            "reward": ["sandbox.slots=1"],
        }
        kinds = {"buffer": ["grpc"], "reward": ["grpc", "http"]}
        # (name suffix, the quiet connections' source address); the front stands only before gRPC ports.
        runs = [("", None)] + ([("_front", "127.0.0.2"), ("_front_same_address", "127.0.0.1")] if front else [])
        for service in services:
            for kind in kinds[service]:
                for suffix, source in runs if kind == "grpc" else runs[:1]:
                    http_port = free_port()
                    settings = [*limits, *extra[service]]
                    if service == "reward":
                        settings.append(f"http.listen=127.0.0.1:{http_port}")
                    process, address = _serve(service, settings, fd_limit, directory)
                    try:
                        if not suffix:
                            figures[f"{service}_{kind}"] = _flood(service, kind, address, http_port, connections,
                                                                  watch_seconds)
                            continue
                        config = front_config.model_copy(update={"backend": address})
                        with running_front(config, preexec_fn=_fd_limit(fd_limit)):
                            figures[f"{service}_{kind}{suffix}"] = _flood(service, kind, config.listen, http_port,
                                                                          connections, watch_seconds, source)
                    finally:
                        stop_service(process)
    return figures


def register_bench(benches) -> None:
    parser = benches.add_parser("connections", help="each service under a small descriptor limit against thousands "
                                "of quiet connections: health and call latency meanwhile, time until they close")
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--fd-limit", type=int, default=1024, help="the services' RLIMIT_NOFILE (and the front's)")
    parser.add_argument("--idle-seconds", type=float, default=60.0, help="server.connections.idle_seconds")
    parser.add_argument("--keepalive-seconds", type=float, default=30.0, help="server.connections.keepalive_seconds")
    parser.add_argument("--keepalive-timeout-seconds", type=float, default=10.0,
                        help="server.connections.keepalive_timeout_seconds")
    parser.add_argument("--watch-seconds", type=float, default=180.0, help="longest wait for the quiet ones to close")
    parser.add_argument("--services", default="buffer,reward", help="comma-separated, of buffer and reward")
    parser.add_argument("--front", choices=["haproxy"], help="also measure each gRPC port behind this front "
                        "(zerobubble front), flooded from another address and from the probes' own")
    parser.add_argument("--per-peer-connections", type=int, default=100, help="the front's per_peer_connections")
    parser.add_argument("--front-timeout-seconds", type=float, help="the front's client_timeout_seconds (default: "
                        "zerobubble front's)")
    parser.set_defaults(measure=lambda args: bench_connections(
        connections=args.connections, fd_limit=args.fd_limit, idle_seconds=args.idle_seconds,
        keepalive_seconds=args.keepalive_seconds, keepalive_timeout_seconds=args.keepalive_timeout_seconds,
        watch_seconds=args.watch_seconds, services=tuple(args.services.split(",")), front=args.front,
        per_peer_connections=args.per_peer_connections, front_timeout_seconds=args.front_timeout_seconds))
