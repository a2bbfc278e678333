"""One bootstrap for every service: gRPC server with health checking, reflection, metrics, TLS,
bearer-token check, message-size limits and graceful shutdown on SIGTERM.

The server is grpc's asyncio server on an event loop of its own thread, so an open stream costs a
coroutine, not a thread: a thousand idle streams leave health checks and unary calls as fast as
with none. The rest of a service stays threaded (see `ServiceHost`).
"""

from __future__ import annotations

import asyncio
import hmac
import inspect
import logging
import signal
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry, start_http_server

from zerobubble.common.config import ConfigError, ServerConfig

log = logging.getLogger(__name__)

HEALTH_PREFIX = "/grpc.health.v1.Health/"
T = TypeVar("T")

_HANDLER_KINDS = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def _with_behavior(handler: grpc.RpcMethodHandler, behavior: Callable) -> grpc.RpcMethodHandler:
    """The same method (kind and codecs) served by another function."""
    return _HANDLER_KINDS[handler.request_streaming, handler.response_streaming](
        behavior, request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer)


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


class BearerTokenCheck(grpc.aio.ServerInterceptor):
    """Refuses calls without 'authorization: Bearer <token>'. Health checks stay open for probes."""

    def __init__(self, token: str):
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(HEALTH_PREFIX):
            return handler
        sent = dict(handler_call_details.invocation_metadata or ()).get("authorization", "")
        if hmac.compare_digest(sent.encode(), self._expected):
            return handler
        method = handler_call_details.method

        async def deny(request_or_iterator, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, f"{method}: missing or wrong bearer token")

        # The refusal takes the method's kind: the server reads requests by the handler's kind.
        return _with_behavior(handler, deny)


class _SyncContext:
    """The call's context as a sync handler on the host's threads sees it: `abort()` blocks and raises, as on the
    thread-per-call server; the context's plain methods pass through."""

    def __init__(self, context: grpc.aio.ServicerContext, loop: asyncio.AbstractEventLoop):
        self._context = context
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        asyncio.run_coroutine_threadsafe(self._context.abort(code, details), self._loop).result()


_MISSING = object()


class _Undecodable:
    """Stands for a request whose bytes are no message of its method's type."""

    def __init__(self, reason: str):
        self.reason = reason


def _tolerant(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:  # DecodeError, and UnicodeDecodeError for a string field that is not UTF-8
            return _Undecodable(f"{type(exc).__name__}: {exc}"[:200])

    return parse


class UndecodableRequests(grpc.aio.ServerInterceptor):
    """Bytes that do not parse as the method's request are the caller's error, INVALID_ARGUMENT naming
    `request`; grpc itself answers INTERNAL ("Exception deserializing request!") before any handler runs.
    The method keeps its kind (sync or async, streaming or not) so the interceptors around it still see it."""

    def __init__(self):
        self._wrapped: dict[str, grpc.RpcMethodHandler] = {}

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method = handler_call_details.method
        if method not in self._wrapped:
            behavior = next(b for b in (handler.unary_unary, handler.unary_stream, handler.stream_unary,
                                        handler.stream_stream) if b is not None)
            wrapped = _refusing_undecodable(behavior, handler.request_streaming, method.rpartition("/")[2])
            self._wrapped[method] = _HANDLER_KINDS[handler.request_streaming, handler.response_streaming](
                wrapped, request_deserializer=_tolerant(handler.request_deserializer),
                response_serializer=handler.response_serializer)
        return self._wrapped[method]


def _refusing_undecodable(behavior: Callable, request_streaming: bool, name: str) -> Callable:
    def message(bad: _Undecodable) -> str:
        return f"request: not a valid {name} request message ({bad.reason})"

    if request_streaming:
        if inspect.iscoroutinefunction(behavior) or inspect.isasyncgenfunction(behavior):
            async def checked_async(requests, context):
                async for request in requests:
                    if isinstance(request, _Undecodable):
                        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message(request))
                    yield request

            if inspect.isasyncgenfunction(behavior):
                async def async_stream_of_stream(requests, context):
                    async for reply in behavior(checked_async(requests, context), context):
                        yield reply

                return async_stream_of_stream

            async def async_unary_of_stream(requests, context):
                return await behavior(checked_async(requests, context), context)

            return async_unary_of_stream

        def checked(requests, context):
            for request in requests:
                if isinstance(request, _Undecodable):
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, message(request))
                yield request

        if inspect.isgeneratorfunction(behavior):
            def stream_of_stream(requests, context):
                yield from behavior(checked(requests, context), context)

            return stream_of_stream

        def unary_of_stream(requests, context):
            return behavior(checked(requests, context), context)

        return unary_of_stream
    if inspect.isasyncgenfunction(behavior):
        async def async_stream(request, context):
            if isinstance(request, _Undecodable):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message(request))
            async for reply in behavior(request, context):
                yield reply

        return async_stream
    if inspect.iscoroutinefunction(behavior):
        async def async_unary(request, context):
            if isinstance(request, _Undecodable):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message(request))
            return await behavior(request, context)

        return async_unary
    if inspect.isgeneratorfunction(behavior):
        def sync_stream(request, context):
            if isinstance(request, _Undecodable):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, message(request))
            yield from behavior(request, context)

        return sync_stream

    def sync_unary(request, context):
        if isinstance(request, _Undecodable):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, message(request))
        return behavior(request, context)

    return sync_unary


class SingleRequests(grpc.aio.ServerInterceptor):
    """Reads the one request of a unary-request method itself, as a one-message stream. grpc's asyncio server
    gives no status at all to a call whose only message is missing or cut short (the client waits out its
    deadline); read this way, the call is refused with INVALID_ARGUMENT. Sync handlers run on the host's
    threads, as grpc would run them."""

    def __init__(self, pool: ThreadPoolExecutor):
        self._pool = pool
        self._adapted: dict[str, grpc.RpcMethodHandler] = {}

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming:
            return handler
        method = handler_call_details.method
        if method not in self._adapted:
            self._adapted[method] = self._adapt(handler)
        return self._adapted[method]

    def _adapt(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        behavior = handler.unary_stream if handler.response_streaming else handler.unary_unary
        pool = self._pool

        async def request_of(requests, context):
            request = await anext(aiter(requests), _MISSING)
            if request is _MISSING:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the request message is missing or cut short")
            return request

        if inspect.isasyncgenfunction(behavior):
            async def serve(requests, context):
                async for reply in behavior(await request_of(requests, context), context):
                    await context.write(reply)
        elif inspect.iscoroutinefunction(behavior):
            async def serve(requests, context):
                return await behavior(await request_of(requests, context), context)
        elif not handler.response_streaming:
            async def serve(requests, context):
                request = await request_of(requests, context)
                loop = asyncio.get_running_loop()
                return await loop.run_in_executor(pool, behavior, request, _SyncContext(context, loop))
        else:
            # Streams are coroutines here (see ServiceHost); a sync generator is left to grpc's own bridge.
            return handler
        return _HANDLER_KINDS[True, handler.response_streaming](
            serve, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)


class CannotListen(ConfigError, OSError):
    """The address a server is configured to listen on is taken (or not this machine's): the field is named."""


class ServiceHost:
    """Hosts one service's servicers on a real socket.

    `add(register_fn, servicer, full_name)` before `start()`; `run_until_signal()` blocks until
    SIGTERM/SIGINT and then lets in-flight calls finish for `grace_seconds`, after which the calls
    still open are cancelled: `stop()` returns within the grace whatever streams are open.

    start(), stop() and run_until_signal() are plain blocking calls; the server runs on an event
    loop in a thread of its own. Handlers may be:

    - sync functions (unary): run on the host's `server.max_workers` threads, as before;
    - coroutines (and async generators): run on the loop and must never block it. This is the form
      for streams, whose waiting must not hold a thread. A streaming one sends with
      `await context.write(reply)` and reads an async request stream with `async for`:

          @translate_errors
          async def PullBatch(self, request, context):
              try:
                  # Blocking core work (disk, a lock held for long) goes to the host's threads, and
                  # only while there is work:
                  batch = await asyncio.to_thread(self.core.take, request.max_groups)
                  # Waiting for the core (data to arrive, room to free up) holds no thread when the
                  # core's threading.Condition is a common.conditions.AwaitableCondition:
                  await self.core.cond.wait_for_async(lambda: self.core.has_data(request.rank), timeout)
                  await context.write(reply)
              finally:
                  ...  # release what the call holds

      A client that goes away, or the end of the grace at shutdown, cancels the call: CancelledError
      comes out of the `await` the handler is parked in, so `finally` runs at once. (An async
      generator handler cancelled while grpc sends its reply is left suspended at its `yield`, and
      its `finally` waits for the garbage collector: hence coroutines for streams that hold things.)
    """

    def __init__(self, name: str, config: ServerConfig, registry: CollectorRegistry | None = None):
        self.name = name
        self.config = config
        self.registry = registry or CollectorRegistry()
        self.port: int | None = None
        self.metrics_port: int | None = None
        self._metrics_server: Any = None
        self._services: list[tuple[Callable[[Any, Any], None], Any, str]] = []
        self._stopped = threading.Event()
        self._exit = threading.Event()
        self.exit_code = 0
        self.stopped_by: int | None = None  # the signal that stopped run_until_signal, if one did
        self._token = config.bearer_token()
        if warning := config.exposure(self._token):
            log.warning("%s: %s", name, warning)
        self._pool = ThreadPoolExecutor(config.max_workers, thread_name_prefix=f"{name}-rpc")
        self._grpc_loop: asyncio.AbstractEventLoop | None = None
        self._grpc_thread: threading.Thread | None = None
        self._server: grpc.aio.Server | None = None
        self._health: health.aio.HealthServicer | None = None

    def add(self, register: Callable[[Any, Any], None], servicer: Any, full_name: str) -> None:
        """`register(servicer, server)` is a generated add_*Servicer_to_server or the like; it is
        called on the server when the host starts."""
        self._services.append((register, servicer, full_name))

    @property
    def address(self) -> str:
        host = self.config.listen.rpartition(":")[0]
        return f"{host}:{self.port}"

    def _call(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run a coroutine on the server's loop from any other thread and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._grpc_loop).result(timeout)

    def start(self) -> ServiceHost:
        credentials = server_credentials(self.config)
        if self.config.metrics_port is not None:
            try:
                self._metrics_server, _ = start_http_server(
                    self.config.metrics_port, addr=self.config.metrics_host, registry=self.registry
                )
            except OSError as exc:
                raise CannotListen(f"server.metrics_port: {self.name} cannot serve metrics on "
                                   f"{self.config.metrics_host}:{self.config.metrics_port} ({exc.strerror})") from None
            self.metrics_port = self._metrics_server.server_port
        self._grpc_loop = asyncio.new_event_loop()
        # asyncio.to_thread in a handler runs on the host's threads.
        self._grpc_loop.set_default_executor(self._pool)
        self._grpc_thread = threading.Thread(target=self._grpc_loop.run_forever, name=f"{self.name}-grpc", daemon=True)
        self._grpc_thread.start()
        try:
            self._call(self._start(credentials))
        except BaseException:
            self._server = None
            self._close_grpc_loop()
            self._close_metrics()
            raise
        log.info("%s listening on %s (metrics port %s)", self.name, self.address, self.metrics_port)
        return self

    async def _start(self, credentials: grpc.ServerCredentials | None) -> None:
        limit = self.config.max_message_bytes
        interceptors = [BearerTokenCheck(self._token)] if self._token else []
        self._server = grpc.aio.server(
            migration_thread_pool=self._pool,
            interceptors=[*interceptors, SingleRequests(self._pool), UndecodableRequests()],
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", limit),
                ("grpc.so_reuseport", 0),
                *self.config.connections.grpc_options(),
            ],
        )
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        for register, servicer, _ in self._services:
            register(servicer, self._server)
        names = [full_name for _, _, full_name in self._services]
        reflection.enable_server_reflection(
            [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME],
            self._server,
        )
        try:
            if credentials is None:
                self.port = self._server.add_insecure_port(self.config.listen)
            else:
                self.port = self._server.add_secure_port(self.config.listen, credentials)
        except RuntimeError as exc:
            await self._server.stop(None)
            raise CannotListen(f"server.listen: {self.name} cannot listen on {self.config.listen}: another process "
                               f"has the port, or the host is not this machine's ({exc})") from None
        await self._server.start()
        for service in ["", *names]:
            await self._health.set(service, health_pb2.HealthCheckResponse.SERVING)

    def stop(self, grace: float | None = None) -> None:
        """Stop accepting calls, let in-flight ones finish within the grace period, cancel the rest,
        then close. Services that own more (worker pools, logs) extend this to close it after the server."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        grace = self.config.grace_seconds if grace is None else grace
        # The metrics server takes up to half a second to stop: meanwhile, not after the grace.
        metrics_closing = threading.Thread(target=self._close_metrics, name=f"{self.name}-metrics-stop")
        metrics_closing.start()
        if self._server is not None:
            self._call(self._stop(grace))
            self._close_grpc_loop()
        # Sync handlers still in a core call hold their threads until the core lets go (services
        # close their cores after this); no new work is taken.
        self._pool.shutdown(wait=False, cancel_futures=True)
        metrics_closing.join()
        log.info("%s stopped", self.name)

    def _close_metrics(self) -> None:
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()

    async def _stop(self, grace: float) -> None:
        await self._health.enter_graceful_shutdown()
        # grpc cancels the calls still open at the end of the grace: their coroutines see CancelledError.
        await self._server.stop(grace)
        # What is left is grpc's own bookkeeping of the calls just cancelled; it ends within
        # milliseconds, or is cancelled.
        others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        if others:
            _, pending = await asyncio.wait(others, timeout=0.2)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    def _close_grpc_loop(self) -> None:
        self._grpc_loop.call_soon_threadsafe(self._grpc_loop.stop)
        self._grpc_thread.join()
        self._grpc_loop.close()

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
            self.stopped_by = signum
            self._exit.set()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)
        while not self._exit.wait(0.5):
            pass
        self.stop()
        return self.exit_code
