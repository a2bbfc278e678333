"""One bootstrap for every service: gRPC server with health checking, reflection, metrics, TLS,
bearer-token check, message-size limits and graceful shutdown on SIGTERM."""

from __future__ import annotations

import hmac
import logging
import signal
import threading
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry, start_http_server

from zerobubble.common.config import ServerConfig

log = logging.getLogger(__name__)

HEALTH_PREFIX = "/grpc.health.v1.Health/"


def server_credentials(config: ServerConfig) -> grpc.ServerCredentials | None:
    tls = config.tls
    if tls.cert is None and tls.key is None:
        return None
    if tls.cert is None or tls.key is None:
        raise ValueError("server.tls: cert and key must be given together")
    if tls.require_client_cert and tls.ca is None:
        raise ValueError("server.tls.ca: needed to verify client certificates when require_client_cert is set")
    return grpc.ssl_server_credentials(
        [(tls.key.read_bytes(), tls.cert.read_bytes())],
        root_certificates=tls.ca.read_bytes() if tls.ca else None,
        require_client_auth=tls.require_client_cert,
    )


class BearerTokenCheck(grpc.ServerInterceptor):
    """Refuses calls without 'authorization: Bearer <token>'. Health checks stay open for probes."""

    def __init__(self, token: str):
        self._expected = f"Bearer {token}".encode()

    def intercept_service(self, continuation, handler_call_details):
        if handler_call_details.method.startswith(HEALTH_PREFIX):
            return continuation(handler_call_details)
        sent = dict(handler_call_details.invocation_metadata or ()).get("authorization", "")
        if hmac.compare_digest(sent.encode(), self._expected):
            return continuation(handler_call_details)
        return _refusal(handler_call_details.method)


def _refusal(method: str) -> grpc.RpcMethodHandler:
    def deny(request_or_iterator, context):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, f"{method}: missing or wrong bearer token")

    # The handler kind must match the method's or grpc reports an internal error instead.
    return grpc.stream_stream_rpc_method_handler(deny)


class ServiceHost:
    """Hosts one service's servicers on a real socket.

    `add(register_fn, servicer, full_name)` before `start()`; `run_until_signal()` blocks until
    SIGTERM/SIGINT and then lets in-flight calls finish for `grace_seconds`.
    """

    def __init__(self, name: str, config: ServerConfig, registry: CollectorRegistry | None = None):
        self.name = name
        self.config = config
        self.registry = registry or CollectorRegistry()
        self.port: int | None = None
        self.metrics_port: int | None = None
        self._metrics_server: Any = None
        self._service_names: list[str] = []
        self._stopped = threading.Event()
        self._exit = threading.Event()
        self.exit_code = 0
        token = config.bearer_token()
        if warning := config.exposure(token):
            log.warning("%s: %s", name, warning)
        interceptors = [BearerTokenCheck(token)] if token else []
        limit = config.max_message_bytes
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=config.max_workers, thread_name_prefix=f"{name}-rpc"),
            interceptors=interceptors,
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", limit),
                ("grpc.so_reuseport", 0),
            ],
        )
        self._health = health.HealthServicer(experimental_non_blocking=True)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)

    def add(self, register: Callable[[Any, grpc.Server], None], servicer: Any, full_name: str) -> None:
        register(servicer, self._server)
        self._service_names.append(full_name)

    @property
    def address(self) -> str:
        host = self.config.listen.rpartition(":")[0]
        return f"{host}:{self.port}"

    def start(self) -> ServiceHost:
        reflection.enable_server_reflection(
            [*self._service_names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
             reflection.SERVICE_NAME],
            self._server,
        )
        credentials = server_credentials(self.config)
        if credentials is None:
            self.port = self._server.add_insecure_port(self.config.listen)
        else:
            self.port = self._server.add_secure_port(self.config.listen, credentials)
        if self.port == 0:
            raise OSError(f"{self.name}: cannot listen on {self.config.listen}")
        if self.config.metrics_port is not None:
            self._metrics_server, _ = start_http_server(
                self.config.metrics_port, addr=self.config.metrics_host, registry=self.registry
            )
            self.metrics_port = self._metrics_server.server_port
        self._server.start()
        for service in ["", *self._service_names]:
            self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        log.info("%s listening on %s (metrics port %s)", self.name, self.address, self.metrics_port)
        return self

    def stop(self, grace: float | None = None) -> None:
        """Stop accepting calls, let in-flight ones finish within the grace period, then close.
        Services that own more (worker pools, logs) extend this to close it after the server."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._health.enter_graceful_shutdown()
        self._server.stop(self.config.grace_seconds if grace is None else grace).wait()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
        log.info("%s stopped", self.name)

    def exit(self, code: int, reason: str) -> None:
        """Ask run_until_signal to stop the service and return `code`: a background job (a worker loop,
        a training run) has finished (0) or failed (non-zero) and the process has nothing left to do."""
        (log.info if code == 0 else log.error)("%s: %s", self.name, reason)
        self.exit_code = code
        self._exit.set()

    def run_until_signal(self) -> int:
        """Serve until SIGTERM or SIGINT (main thread only) or exit(), then stop gracefully; returns the
        process exit code."""

        def handle(signum, _frame):
            log.info("%s: %s received, shutting down", self.name, signal.Signals(signum).name)
            self._exit.set()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)
        while not self._exit.wait(0.5):
            pass
        self.stop()
        return self.exit_code
