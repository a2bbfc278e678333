"""The viewer's HTTP side (aiohttp, as the reward service's HTTP endpoints): the page and its assets, shipped in
the package, and a read-only JSON API over the run folder. File reads run on threads beside the event loop, so
paging a large rollout log does not stall the page's other requests."""

from __future__ import annotations

import asyncio
import json
import math
import sys
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

from aiohttp import web

from zerobubble.common.http_guard import RequestGuard
from zerobubble.tooling.viewer.config import ViewConfig
from zerobubble.tooling.viewer.query import (
    BadQuery,
    EvalPairQuery,
    FollowQuery,
    GroupQuery,
    Query,
    RolloutFilter,
    parse,
)
from zerobubble.tooling.viewer.run import NotInRun, RunFolder

ASSETS = {"index.html": "text/html", "viewer.js": "text/javascript", "viewer.css": "text/css"}
# Everything the page loads comes from this server; nothing from the internet, no inline script.
HEADERS = {"Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'",
           "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}


def _error(status: int, message: str, field: str | None = None) -> web.Response:
    return web.json_response({"error": {"field": field, "message": message}}, status=status, headers=HEADERS)


def _finite(value: Any) -> Any:
    """JSON as browsers parse it: the run's files may hold NaN or Infinity (a diverged loss), which JSON lacks."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _asset(name: str) -> bytes:
    return resources.files("zerobubble.tooling.viewer").joinpath("static", name).read_bytes()


def build_app(run: RunFolder, guard: RequestGuard) -> web.Application:
    def api(model: type[Query], answer: Callable[[Any], Any]) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            try:
                query = parse(model, request.query, [key for key, _ in request.query.items()])
                body = await asyncio.to_thread(answer, query)
            except BadQuery as exc:
                return _error(400, exc.message, exc.field)
            except NotInRun as exc:
                return _error(404, exc.message, exc.field)
            except ValueError as exc:  # a line of the run's files that is not a JSON object
                return _error(422, str(exc))
            return web.Response(text=json.dumps(_finite(body), allow_nan=False), content_type="application/json",
                                headers=HEADERS)
        return handle

    async def page(request: web.Request) -> web.Response:
        name = request.match_info.get("name", "index.html")
        if name not in ASSETS:
            return _error(404, "no such file")
        return web.Response(body=_asset(name), content_type=ASSETS[name], headers=HEADERS)

    @web.middleware
    async def no_surprises(request: web.Request, handler):
        # Whatever aiohttp itself refuses (a bad method, an unknown path) answers with the same JSON error body.
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return _error(exc.status, exc.reason)

    @web.middleware
    async def own_names_only(request: web.Request, handler):
        # A page from elsewhere that rebinds its name to this address sends its own name as Host.
        if refusal := guard.check(request.headers.get):
            return _error(refusal.status, refusal.message, refusal.field)
        return await handler(request)

    app = web.Application(middlewares=[own_names_only, no_surprises])
    app.add_routes([
        web.get("/", page),
        web.get("/static/{name}", page),
        web.get("/api/metrics", api(FollowQuery, lambda q: run.metrics(q.since))),
        web.get("/api/evals", api(FollowQuery, lambda q: run.evaluations(q.since))),
        web.get("/api/eval-pair", api(EvalPairQuery, run.eval_pair)),
        web.get("/api/rollouts", api(RolloutFilter, run.rollout_page)),
        web.get("/api/group", api(GroupQuery, lambda q: run.group(q.line))),
    ])
    return app


async def serve(config: ViewConfig) -> None:
    guard = RequestGuard(config.host, allowed_hosts=config.allowed_hosts)
    runner = web.AppRunner(build_app(RunFolder(config.run_dir, config.max_line_bytes), guard), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    await site.start()
    host, port = runner.addresses[0][:2]
    url = f"http://{host if ':' not in host else f'[{host}]'}:{port}/"
    # One JSON line for scripts (the port bound when 0 was asked), then a sentence for people.
    print(json.dumps({"view": str(config.run_dir), "url": url}), flush=True)
    print(f"viewing {config.run_dir} at {url} (read-only; Ctrl-C to stop)", file=sys.stderr, flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
