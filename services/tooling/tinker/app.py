"""HTTP around the Tinker core (service.py): the routes the official client calls, under common/asgi_guard.py's
checks (Host, Origin, the bearer token, the body limit, one deadline for the whole request). The client sends its
API key as X-API-Key; it is read as the bearer token. Refusals answer {"detail", "field"} with a 4xx status; a
route the client knows but this server does not serve is a 404 saying so (never a 5xx, which the client retries)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from zerobubble.common.asgi_guard import GuardMiddleware
from zerobubble.common.http_guard import RequestGuard
from zerobubble.tooling.tinker import schema
from zerobubble.tooling.tinker.errors import Refused
from zerobubble.tooling.tinker.service import TinkerService
from zerobubble.tooling.tinker.wire import PROTO, decode_forward_backward

log = logging.getLogger(__name__)
API = "/api/v1"
# The client's feature flags, fixed to what this server speaks: plain API keys (no JWT exchange), one
# forward_backward chunk sent after the previous was taken (so a client's calls arrive in order), no compression,
# one retrieve_future poll per request. The client's own default transport, pyqwest (Rust's reqwest): with httpx's,
# an RL loop's client spends a fifth of its time in httpcore's connection pool, scanning its open connections (one
# per sample awaited) on every request, on the cores the front shares with it.
CLIENT_CONFIG = {"pjwt_auth_enabled": False, "credential_default_source": "api_key", "use_pyqwest_transport": True,
                 "parallel_fwdbwd_chunks": False, "proto_compress_fwdbwd": False,
                 "sample_use_retrieve_futures": False, "sample_join_sampling_session": False,
                 "custom_loss_server_side": False}


def _future(request_id: str, **extra) -> dict:
    return {"request_id": request_id, **extra}


def create_app(service: TinkerService) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        expiring = asyncio.create_task(_expire_sessions(service))
        yield
        expiring.cancel()
        service.close()

    app = FastAPI(title="Zerobubble Tinker API", openapi_url=None, docs_url=None, redoc_url=None, lifespan=lifespan)
    config = service.config

    @app.exception_handler(Refused)
    async def refused(_request: Request, exc: Refused) -> JSONResponse:
        return JSONResponse({"detail": exc.refusal.message, "field": exc.refusal.field}, exc.refusal.status)

    @app.get(f"{API}/healthz")
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.get(f"{API}/get_server_capabilities")
    async def capabilities() -> dict:
        return service.capabilities()

    @app.post(f"{API}/client/config")
    async def client_config() -> dict:
        return CLIENT_CONFIG

    @app.post(f"{API}/client/dynamic_config")
    async def client_dynamic_config() -> dict:
        return {"refresh_interval_sec": 300, "sample_cancel_enabled": False}

    @app.post(f"{API}/telemetry")
    async def telemetry() -> dict:
        return {"status": "accepted"}  # the client's usage events are not kept

    @app.post(f"{API}/create_session")
    async def create_session(request: Request) -> dict:
        schema.parse(schema.CreateSession, await request.body())
        return {"type": "create_session", "session_id": service.create_session()}

    @app.post(f"{API}/session_heartbeat")
    async def heartbeat(request: Request) -> dict:
        service.heartbeat(schema.parse(schema.SessionRef, await request.body()).session_id)
        return {"type": "session_heartbeat"}

    @app.post(f"{API}/create_model")
    async def create_model(request: Request) -> dict:
        return _future(service.create_model(schema.parse(schema.CreateModel, await request.body())))

    @app.post(f"{API}/get_info")
    async def get_info(request: Request) -> dict:
        return service.info(schema.parse(schema.ModelRef, await request.body()).model_id)

    @app.post(f"{API}/unload_model")
    async def unload_model(request: Request) -> dict:
        return _future(service.unload_model(schema.parse(schema.ModelRef, await request.body()).model_id))

    @app.post(f"{API}/forward_backward")
    async def forward_backward(request: Request) -> dict:
        if request.headers.get("content-type", "").split(";")[0].strip() != PROTO:
            raise Refused(415, "Content-Type", f"forward_backward takes {PROTO}, as the tinker client sends it")
        if request.headers.get("content-encoding", "identity") != "identity":
            raise Refused(415, "Content-Encoding", "compressed bodies are not served")
        return _future(service.forward_backward(decode_forward_backward(await request.body())))

    @app.post(f"{API}/optim_step")
    async def optim_step(request: Request) -> dict:
        return _future(service.optim_step(schema.parse(schema.OptimStep, await request.body())))

    @app.post(f"{API}/save_weights_for_sampler")
    async def save_weights_for_sampler(request: Request) -> dict:
        return _future(service.save_for_sampler(schema.parse(schema.SaveForSampler, await request.body())))

    @app.post(f"{API}/save_weights")
    async def save_weights(request: Request) -> dict:
        return _future(service.save_state(schema.parse(schema.SaveState, await request.body())))

    @app.post(f"{API}/load_weights")
    async def load_weights(request: Request) -> dict:
        return _future(service.load_state(schema.parse(schema.LoadState, await request.body())))

    @app.post(f"{API}/create_sampling_session")
    async def create_sampling_session(request: Request) -> dict:
        body = schema.parse(schema.CreateSamplingSession, await request.body())
        return {"type": "create_sampling_session", "sampling_session_id": service.create_sampling_session(body)}

    @app.get(f"{API}/samplers/{{sampling_id}}")
    async def sampler(sampling_id: str) -> dict:
        session = service.sampling_session(sampling_id)
        return {"sampler_id": sampling_id, "base_model": session.base_model, "model_path": session.model_path}

    @app.post(f"{API}/asample")
    async def asample(request: Request) -> dict:
        request_id, sequence_ids = service.sample(schema.parse(schema.Sample, await request.body()))
        return _future(request_id, sample_sequence_ids=sequence_ids)

    @app.post(f"{API}/retrieve_future")
    async def retrieve_future(request: Request) -> Response:
        request_id = schema.parse(schema.RetrieveFuture, await request.body()).request_id
        entry = await service.futures.wait(request_id, config.poll_wait_s)
        if entry is None:
            return JSONResponse({"type": "try_again", "request_id": request_id, "queue_state": "active"})
        if entry.failure is not None:
            return JSONResponse(entry.failure)
        if isinstance(entry.result, bytes):
            return Response(entry.result, media_type=PROTO)
        return JSONResponse(entry.result)

    @app.api_route(f"{API}/{{rest:path}}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def not_served(rest: str) -> JSONResponse:
        raise Refused(404, "path", f"{API}/{rest[:100]} is not served by this server (docs/guides/tinker.md lists "
                      "what is)")

    guard = RequestGuard(config.listen.rsplit(":", 1)[0], config.auth.bearer_token(), config.allowed_hosts)
    app.add_middleware(GuardMiddleware, guard=guard, max_body_bytes=config.max_body_bytes)
    app.add_middleware(ApiKeyAsBearer)
    return app


async def _expire_sessions(service: TinkerService) -> None:
    while True:
        await asyncio.sleep(min(30.0, service.config.session_timeout_s / 4))
        for session_id in service.expire():
            log.info("session %s ended: nothing heard from it for %g s", session_id, service.config.session_timeout_s)


class ApiKeyAsBearer:
    """The tinker client sends its key as `X-API-Key`; the guard reads `Authorization: Bearer`. A request with
    no Authorization header gets one from its X-API-Key."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            headers = scope["headers"]
            names = {name.lower() for name, _ in headers}
            key = next((value for name, value in headers if name.lower() == b"x-api-key"), None)
            if key is not None and b"authorization" not in names:
                scope = {**scope, "headers": [*headers, (b"authorization", b"Bearer " + key)]}
        await self.app(scope, receive, send)
