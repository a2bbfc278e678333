"""`zerobubble front`: the HAProxy configuration that sits in front of one service's gRPC port.

gRPC's C core can neither limit the connections of one peer nor accept a connection beyond its descriptors to
refuse it: a flood of quiet connections from one host takes every descriptor and keeps every new caller out until
the service's own limits (`server.connections`) close them. HAProxy in TCP mode, in front of the port, refuses a
peer's connections beyond `per_peer_connections` at once (accepted, then closed: it costs no descriptor), stops
accepting at `max_connections` so it never runs out of descriptors itself, and closes a connection on which
neither side has sent anything for `client_timeout_seconds`. The bytes pass through untouched, so HTTP/2, TLS and
every stream behave as without it.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from pydantic import Field, ValidationError, field_validator

from zerobubble.common.config import ConfigError, Schema, host_port
from zerobubble.tooling.bench import stop_service

HAPROXY = "haproxy"


class FrontConfig(Schema):
    """One HAProxy front for one gRPC port."""

    listen: str = Field(description="HOST:PORT callers reach (the service's public address)")
    backend: str = Field(description="HOST:PORT the service itself listens on, reachable only from this host "
                         "(e.g. server.listen=127.0.0.1:PORT)")
    per_peer_connections: int = Field(100, gt=0, description="connections one source address may hold at once; "
                                      "more are closed as soon as accepted. Every rollout worker, trainer rank "
                                      "and tool on one host counts as one peer")
    max_connections: int = Field(500, gt=0, description="connections held at once in all (HAProxy's maxconn); "
                                 "each takes two descriptors, so keep it under half the front's descriptor limit")
    client_timeout_seconds: float = Field(45.0, gt=0, description="a connection on which neither side sends "
                                          "anything for this long is closed; keep it above the service's "
                                          "server.connections.keepalive_seconds, as on a quiet stream only the "
                                          "service's pings and their answers pass")
    connect_timeout_seconds: float = Field(5.0, gt=0, description="longest wait for the service to accept")

    @field_validator("listen", "backend")
    @classmethod
    def _host_port(cls, address: str) -> str:
        return host_port(address)


def _ms(seconds: float) -> str:
    return f"{int(seconds * 1000)}ms"


def render(config: FrontConfig) -> str:
    """HAProxy's configuration: one TCP frontend with a per-source stick table, one backend server."""
    return f"""\
# zerobubble front: {config.listen} -> {config.backend} (written by `zerobubble front`)
global
    # Two descriptors a connection: under half of HAProxy's own limit, so it never fails to accept for want of one.
    maxconn {config.max_connections}

defaults
    mode tcp
    timeout connect {_ms(config.connect_timeout_seconds)}
    # In TCP mode traffic either way counts: a connection is closed when neither side sent anything this long.
    # On a quiet stream only the service's pings pass (every server.connections.keepalive_seconds) and their
    # answers, so this stays above that; the service itself closes a peer that answers no ping.
    timeout client {_ms(config.client_timeout_seconds)}
    timeout server {_ms(config.client_timeout_seconds)}
    # Once a side is closed, a peer that never closes its own half holds its slot (and its count against
    # per_peer_connections) only this long.
    timeout client-fin 1s
    timeout server-fin 1s

frontend grpc
    bind {config.listen}
    # One source address's connections at once, counted in a table; beyond the limit, closed as soon as accepted.
    maxconn {config.max_connections}
    stick-table type ip size 100k expire {_ms(config.client_timeout_seconds)} store conn_cur
    tcp-request connection track-sc0 src
    tcp-request connection reject if {{ sc0_conn_cur gt {config.per_peer_connections} }}
    default_backend service

backend service
    server service {config.backend}
"""


def _endpoint(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


@contextlib.contextmanager
def running_front(config: FrontConfig, *, preexec_fn=None, within: float = 10.0) -> Iterator[subprocess.Popen]:
    """HAProxy in the foreground with `config`, until the block ends; it is listening when the block starts."""
    haproxy = shutil.which(HAPROXY)
    if haproxy is None:
        raise RuntimeError("haproxy is not installed (make front-tool)")
    with tempfile.TemporaryDirectory(prefix="zerobubble-front-") as folder:
        path = Path(folder) / "haproxy.cfg"
        path.write_text(render(config))
        process = subprocess.Popen([haproxy, "-db", "-f", str(path)], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True, preexec_fn=preexec_fn)
        try:
            end = time.monotonic() + within
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"haproxy exited: {process.stderr.read().strip()}")
                with contextlib.suppress(OSError), socket.create_connection(_endpoint(config.listen), 0.5):
                    break
                if time.monotonic() > end:
                    raise RuntimeError(f"haproxy did not listen on {config.listen} within {within} s")
                time.sleep(0.05)
            yield process
        finally:
            stop_service(process, grace=5)
            process.stderr.close()


def _cmd_front(args) -> int:
    fields = {name: value for name, value in vars(args).items() if name in FrontConfig.model_fields}
    try:
        config = FrontConfig(**{name: value for name, value in fields.items() if value is not None})
    except ValidationError as error:
        raise ConfigError(f"front: {error}") from error
    sys.stdout.write(render(config))
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("front", help="print the HAProxy config for a front before a service's gRPC port "
                                   "(per-peer connection limit, quiet connections closed)")
    for name, field in FrontConfig.model_fields.items():
        required = field.is_required()
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, required=required, help=field.description,
                            type=str if field.annotation is str else field.annotation)
    parser.set_defaults(run=_cmd_front)
