"""HTTP/JSON beside the reward service's gRPC: the contracts of http_contracts.py served by aiohttp on an event
loop of its own thread, over the same RewardScorer as the gRPC servicer.

It shares what gRPC has: the scorer's limits and its bounded backlog (items are validated and admitted on
arrival, or refused at once, and a waiting request holds a coroutine, not a thread: nothing queues behind
HTTP), `server.max_message_bytes` for the body, the bearer token, TLS and the metrics registry. Errors are
an HTTP status mapped from the gRPC code the same error gets over gRPC, and a JSON body naming the field.

Connections are bounded by http_guard.py. A body is refused by its Content-Length before it is read, and while
it is read past that size; it must arrive within http.body_timeout_seconds; it is parsed (JSON, item count,
protobuf) on a thread beside the event loop, so a large one does not stall health checks and other requests.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import ssl
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from zerobubble.common import errors
from zerobubble.common.server import CannotListen
from zerobubble.common.status import status_of
from zerobubble.reward import http_contracts as contracts
from zerobubble.reward.config import RewardServiceConfig
from zerobubble.reward.http_guard import ConnectionGuard
from zerobubble.reward.scorer import RewardScorer, Score

log = logging.getLogger(__name__)

# google.rpc.Code's HTTP mapping (google/rpc/code.proto), for the codes the reward service answers with.
HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.INTERNAL: 500,
}
# gRPC's RESOURCE_EXHAUSTED covers both; over HTTP an item too large must not read as "retry later", which
# OpenRLHF's and slime's clients would do with it.
_TOO_LARGE = 413
_OPEN_PATHS = {"/healthz"}
# Parsing holds the GIL in C for most of its time; more threads would not parse faster.
_PARSE_THREADS = 2
# After an early answer (408, 413) the rest of the body is read and dropped this long, so that a client still
# sending it can read the answer; aiohttp's 10 s default would let a slow sender hold the connection on.
_LINGER_SECONDS = 2.0


def _error(status: int, code: str, message: str, field: str | None = None, **headers: str) -> web.Response:
    return web.json_response({"error": {"code": code, "field": field, "message": message}}, status=status,
                             headers=headers)


def _service_error(exc: errors.ServiceError) -> web.Response:
    code = status_of(exc)
    status = _TOO_LARGE if isinstance(exc, errors.TooLarge) else HTTP_STATUS.get(code, 500)
    headers = {"Retry-After": "1"} if isinstance(exc, errors.Overloaded) else {}
    return _error(status, code.name, str(exc), exc.field, **headers)


def ssl_context(config: RewardServiceConfig) -> ssl.SSLContext | None:
    """The gRPC listener's certificate, key and client CA, for HTTPS (the host has checked them already)."""
    tls = config.server.tls
    if tls.cert is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tls.cert, tls.key)
    if tls.ca is not None:
        context.load_verify_locations(tls.ca)
    if tls.require_client_cert:
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def accept_batch(max_connections: int) -> int:
    """The listen backlog, which is also how many connections asyncio accepts in one go before any of them is
    checked against the bounds: a few of those batches can hold descriptors at once, so it is kept to a
    quarter of the connection bound."""
    return min(128, max(8, max_connections // 4))


class RewardHttp:
    """The HTTP endpoints of one reward service; start() binds `http.listen`, stop() lets calls finish."""

    def __init__(self, config: RewardServiceConfig, scorer: RewardScorer, registry: CollectorRegistry):
        self.config = config
        self.scorer = scorer
        self.port: int | None = None
        self._requests = Counter("zerobubble_reward_http_requests", "HTTP requests, by path and status",
                                 ["path", "status"], registry=registry)
        token = config.server.bearer_token()
        self._expected = f"Bearer {token}".encode() if token else None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self.guard = ConnectionGuard(config.http)
        self._parsing: ThreadPoolExecutor | None = None

    @property
    def url(self) -> str:
        host = self.config.http.listen.rpartition(":")[0]
        scheme = "https" if self.config.server.tls.cert else "http"
        return f"{scheme}://{host}:{self.port}"

    # -- the application ------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.server.max_message_bytes,
                              middlewares=[self._guarded, self._count, self._authenticate, self._errors])
        app.router.add_get("/healthz", self._healthz)
        app.router.add_post("/v1/score", self._v1_score)
        app.router.add_post("/get_reward", self._get_reward)
        app.router.add_post("/reward", self._reward)
        return app

    @web.middleware
    async def _guarded(self, request: web.Request, handler) -> web.StreamResponse:
        self.guard.head_arrived(request.protocol)
        try:
            return await handler(request)
        finally:
            # The next request head of a keep-alive connection is due within the idle time and the head time.
            self.guard.expect_head(request.protocol, self.config.http.idle_timeout_seconds
                                   + self.config.http.header_timeout_seconds)

    @web.middleware
    async def _count(self, request: web.Request, handler) -> web.StreamResponse:
        response = await handler(request)
        route = request.match_info.route.resource
        self._requests.labels(route.canonical if route else "unmatched", str(response.status)).inc()
        return response

    @web.middleware
    async def _authenticate(self, request: web.Request, handler) -> web.StreamResponse:
        if self._expected is None or request.path in _OPEN_PATHS:
            return await handler(request)
        sent = request.headers.get("Authorization", "").encode()
        if hmac.compare_digest(sent, self._expected):
            return await handler(request)
        return _error(401, grpc.StatusCode.UNAUTHENTICATED.name, "missing or wrong bearer token",
                      "Authorization", **{"WWW-Authenticate": "Bearer"})

    @web.middleware
    async def _errors(self, request: web.Request, handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except errors.ServiceError as exc:
            return _service_error(exc)
        except web.HTTPRequestEntityTooLarge as exc:
            return _error(_TOO_LARGE, grpc.StatusCode.RESOURCE_EXHAUSTED.name,
                          f"{exc.text} (server.max_message_bytes)", "body")
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return _error(exc.status, exc.reason.upper().replace(" ", "_"), exc.reason)
        except _BodyTimeout:
            return _error(408, grpc.StatusCode.DEADLINE_EXCEEDED.name,
                          f"the body did not arrive within http.body_timeout_seconds="
                          f"{self.config.http.body_timeout_seconds:g}", "body", Connection="close")
        except ConnectionError as exc:
            # The client left mid-upload: nobody reads an answer, and it is no fault of the service.
            log.info("HTTP %s %s: the client left (%s)", request.method, request.path, exc)
            return _error(400, grpc.StatusCode.CANCELLED.name, "the client left", "body")
        except Exception:
            log.exception("HTTP %s %s failed", request.method, request.path)
            return _error(500, grpc.StatusCode.INTERNAL.name, "internal error; see the service's log")

    async def _score(self, parsed: contracts.Parsed) -> list[Score]:
        """Validate and admit every item at once (or refuse all), then wait for them without a thread."""
        try:
            return await self.scorer.score_batch(parsed.items)
        except errors.ServiceError as exc:
            raise contracts.renamed(exc, parsed.rename) from None

    async def _parsed(self, request: web.Request, contract: Callable[[Any], Any], batch: str | None = None) -> Any:
        """What `contract` makes of the body, read within its size and time bounds and parsed off the loop;
        `batch` names the list of items, whose count is checked while it is parsed."""
        limit = self.config.server.max_message_bytes
        if request.content_length is not None and request.content_length > limit:
            raise errors.TooLarge(f"Content-Length {request.content_length} exceeds server.max_message_bytes="
                                  f"{limit}", field="body")
        try:
            async with asyncio.timeout(self.config.http.body_timeout_seconds):
                raw = await request.read()
        except TimeoutError:
            raise _BodyTimeout from None
        digits = self.config.http.max_json_digits
        bounded = None if batch is None else {batch: self.config.limits.max_batch_items}
        return await asyncio.get_running_loop().run_in_executor(
            self._parsing, lambda: contract(contracts.json_body(raw, digits, bounded)))

    def _verifier(self, request: web.Request) -> tuple[str, str]:
        """The verifier the URL names (?verifier=), else http.verifier, and the ground truth it reads."""
        name = request.query.get("verifier", self.config.http.verifier)
        verifier = self.scorer.verifiers.get(name)
        return name, verifier.ground_truth if verifier else "gt_answer"

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "serving"})

    async def _v1_score(self, request: web.Request) -> web.Response:
        parsed, batch = await self._parsed(request, contracts.score_request, batch="items")
        return web.json_response(contracts.score_reply(await self._score(parsed), batch))

    async def _get_reward(self, request: web.Request) -> web.Response:
        verifier = self._verifier(request)
        parsed = await self._parsed(request, lambda body: contracts.openrlhf_request(body, *verifier), batch="query")
        return web.json_response(contracts.openrlhf_reply(await self._score(parsed), self.config.rewards))

    async def _reward(self, request: web.Request) -> web.Response:
        verifier = self._verifier(request)
        parsed = await self._parsed(request, lambda body: contracts.slime_request(body, *verifier))
        return web.json_response(contracts.slime_reply(await self._score(parsed)))

    # -- running beside the gRPC server ---------------------------------------------------------------
    def _call(self, coroutine: Awaitable[Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def start(self) -> RewardHttp:
        self._parsing = ThreadPoolExecutor(_PARSE_THREADS, thread_name_prefix="reward-http-parse")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="reward-http", daemon=True)
        self._thread.start()
        try:
            self._call(self._start())
        except BaseException:
            self._close_loop()
            raise
        log.info("reward HTTP listening on %s", self.url)
        return self

    async def _start(self) -> None:
        host, _, port = self.config.http.listen.rpartition(":")
        self._runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=self.config.server.grace_seconds,
                                     keepalive_timeout=self.config.http.idle_timeout_seconds,
                                     lingering_time=_LINGER_SECONDS)
        await self._runner.setup()
        self.guard.watch(self._runner.server)
        site = web.TCPSite(self._runner, host.strip("[]"), int(port), ssl_context=ssl_context(self.config),
                           backlog=accept_batch(self.config.http.max_connections))
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            raise CannotListen(f"http.listen: reward cannot listen on {self.config.http.listen}: another process has "
                               f"the port, or the host is not this machine's ({exc.strerror})") from None
        self.port = self._runner.addresses[0][1]

    def stop(self) -> None:
        """Stop accepting, let requests in flight finish within server.grace_seconds, then close."""
        if self._loop is None:
            return
        self._call(self._runner.cleanup())
        self._close_loop()

    def _close_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
        self._loop = None
        self._parsing.shutdown(cancel_futures=True)


class _BodyTimeout(Exception):
    """The body did not arrive within http.body_timeout_seconds."""

