"""The environment service's environments served the OpenEnv way (openenv-core's HTTP + WebSocket contract:
`POST /reset`, `POST /step`, `GET /health|/schema|/state`, a session at `/ws`), built with openenv-core's own
server classes, so that its `EnvClient` (and TRL, NeMo Gym, ... through it) plays our episodes.

    python -m zerobubble.environment.openenv_server --set environment.address=127.0.0.1:50056 \
        --set default_environment=calculator --set listen=127.0.0.1:8000

Each OpenEnv session is one episode of the environment service, reached over gRPC: `reset(environment=NAME,
row={...})` opens it (both optional: the default environment, an empty row), `step({"message": TEXT})` is one
assistant turn. OpenEnv's plain HTTP `/reset` and `/step` make a fresh environment per request, so only the
WebSocket session carries an episode across steps; a step with no episode ends at once with `no_episode`.

The server is a door to the environment service, so it is locked as one (common/http_guard.py): a caller shows the
environment service's bearer token (`Authorization: Bearer TOKEN`, or `http://user:TOKEN@host:port` as the base URL
of openenv-core's client), a browser page may call it only from `allowed_origins`, a Host that is not one of this
server's names is refused (DNS rebinding), a request must arrive whole within `request_deadline_s` and carry at
most `max_body_bytes`, and a WebSocket session idle for `session_timeout_s` is ended.
"""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

import grpc
from pydantic import Field

from zerobubble.common.clients.environment import EnvironmentClient
from zerobubble.common.config import ClientConfig, Schema, is_loopback, load_config
from zerobubble.common.http_guard import RequestGuard

log = logging.getLogger(__name__)
NO_EPISODE = "no_episode"
# The environment service's refusals as the HTTP statuses a client of OpenEnv's server reads.
_HTTP_STATUS = {grpc.StatusCode.INVALID_ARGUMENT: 422, grpc.StatusCode.NOT_FOUND: 404,
                grpc.StatusCode.RESOURCE_EXHAUSTED: 429, grpc.StatusCode.UNAVAILABLE: 503,
                grpc.StatusCode.UNAUTHENTICATED: 502, grpc.StatusCode.DEADLINE_EXCEEDED: 504}


class OpenEnvServerConfig(Schema):
    listen: str = Field("127.0.0.1:8000", pattern=r"^[^\s:]+:\d+$", description="host:port of the HTTP server")
    environment: ClientConfig = Field(default_factory=lambda: ClientConfig(address="127.0.0.1:50056"),
                                      description="the environment service")
    default_environment: str = Field("calculator", description="what a reset that names none opens")
    max_sessions: int = Field(64, gt=0, description="WebSocket sessions (episodes) at once")
    session_timeout_s: float = Field(300.0, gt=0, description="a WebSocket session with no message for this long "
                                     "is ended (its episode closed) and its slot freed")
    request_deadline_s: float = Field(10.0, gt=0, description="a request's head and body must arrive whole within "
                                      "this; a slower sender gets 408 and is cut")
    max_body_bytes: int = Field(4 * 1024 * 1024, gt=0, description="the largest request body or WebSocket message "
                                "(413 past it)")
    allowed_origins: list[str] = Field(default_factory=list, description="browser pages (scheme://host:port) that "
                                       "may call the server; a page from anywhere else is refused")
    allowed_hosts: list[str] = Field(default_factory=list, description="names this server is reached by besides "
                                     "the loopback names and its listen address (\"*\": any)")


def _classes():
    """openenv-core's types, imported when a server is made (the agents extra)."""
    from fastapi import HTTPException
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State

    class EpisodeAction(Action):
        message: str = Field(description="the assistant's turn: its text, tool calls included")

    class EpisodeObservation(Observation):
        messages: Any = Field(None, description="the environment's answer: a string, chat messages or null")
        tools: list[dict] = Field(default_factory=list, description="the tools' OpenAI function schemas (reset)")
        tool_format: str = ""
        ended_reason: str = Field("", description="why the environment ended the episode, if it failed")
        info: dict = Field(default_factory=dict)

    class HostedEpisode(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self, client: EnvironmentClient, default: str):
            super().__init__()
            self._client = client
            self._default = default
            self._episode_id: str | None = None
            self._steps = 0

        def reset(self, seed: int | None = None, episode_id: str | None = None, environment: str | None = None,
                  row: dict | None = None, **kwargs: Any) -> EpisodeObservation:
            self.close()
            if row is not None and not isinstance(row, dict):
                raise HTTPException(422, "row: must be an object (the prompt row)")
            name = environment or self._default
            try:
                opened = self._client.open_episode(name, row or {})
                formats = {info.name: info.tool_format for info in self._client.list_environments().environments}
            except grpc.RpcError as exc:
                raise HTTPException(_HTTP_STATUS.get(exc.code(), 502), f"{exc.code().name}: {exc.details()}") from None
            self._episode_id, self._steps = opened.episode_id, 0
            return EpisodeObservation(messages=json.loads(opened.opening_json), tools=json.loads(opened.tools_json),
                                      tool_format=formats.get(name, ""), reward=0.0, done=False)

        def step(self, action: EpisodeAction, timeout_s: float | None = None, **kwargs: Any) -> EpisodeObservation:
            if self._episode_id is None:
                return EpisodeObservation(done=True, reward=0.0, ended_reason=NO_EPISODE,
                                          info={"error": "no episode: reset first, in the same /ws session"})
            try:
                step = self._client.step_episode(self._episode_id, action.message)
            except grpc.RpcError as exc:
                self._episode_id = None
                return EpisodeObservation(done=True, reward=0.0, ended_reason=NO_EPISODE,
                                          info={"error": f"{exc.code().name}: {exc.details()}"})
            self._steps += 1
            if step.done:
                self.close()
            return EpisodeObservation(messages=json.loads(step.observation_json or "null"), reward=step.reward,
                                      done=step.done, ended_reason=step.ended_reason,
                                      info=json.loads(step.info_json or "{}"))

        @property
        def state(self) -> State:
            return State(episode_id=self._episode_id, step_count=self._steps)

        def close(self) -> None:
            episode_id, self._episode_id = self._episode_id, None
            if episode_id is not None:
                try:
                    self._client.close_episode(episode_id)
                except grpc.RpcError:
                    pass  # the service closes idle episodes itself

    return HostedEpisode, EpisodeAction, EpisodeObservation


def create_app(config: OpenEnvServerConfig, client: EnvironmentClient):
    """The FastAPI app of openenv-core's server over `client`'s environment service."""
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from openenv.core.env_server.http_server import create_fastapi_app
    from openenv.core.env_server.types import ConcurrencyConfig

    from zerobubble.common.asgi_guard import GuardMiddleware

    hosted, action, observation = _classes()
    app = create_fastapi_app(lambda: hosted(client, config.default_environment), action, observation,
                             concurrency_config=ConcurrencyConfig(max_concurrent_envs=config.max_sessions,
                                                                  session_timeout=config.session_timeout_s))

    async def invalid(request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own answer echoes the input, which fails to encode when it holds NaN (a 500 instead of a 422).
        errors = [{"loc": list(error.get("loc", ())), "msg": error.get("msg", ""), "type": error.get("type", "")}
                  for error in exc.errors()]
        return JSONResponse({"detail": errors}, status_code=422)

    app.add_exception_handler(RequestValidationError, invalid)
    guard = RequestGuard(config.listen.rsplit(":", 1)[0], config.environment.bearer_token(), config.allowed_hosts,
                         config.allowed_origins)
    app.add_middleware(GuardMiddleware, guard=guard, max_body_bytes=config.max_body_bytes)
    return app


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    from zerobubble.common.asgi_guard import deadline_protocol

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="a YAML file of OpenEnvServerConfig")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a dotted override")
    args = parser.parse_args(argv)
    config = load_config(OpenEnvServerConfig, args.config, args.set)
    host, port = config.listen.rsplit(":", 1)
    if config.environment.bearer_token() is None and not is_loopback(config.listen):
        log.warning("%s answers every caller that reaches it: the environment service has no bearer token "
                    "(environment.auth_token_file or environment.auth_token_env)", config.listen)
    with EnvironmentClient(config.environment) as client:
        uvicorn.run(create_app(config, client), host=host, port=int(port), log_level="warning",
                    http=deadline_protocol(config.request_deadline_s), ws_max_size=config.max_body_bytes)


if __name__ == "__main__":
    main()
