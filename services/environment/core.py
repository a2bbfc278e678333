"""The environment service's core (no gRPC): the configured environments and the open episodes.

An episode lives from OpenEpisode to CloseEpisode, or until it has had no call for limits.idle_timeout_s. The
environment failing (hanging, raising, dying, answering out of contract or too much) ends it with a stable
`ended_reason`; so does an environment that never says done, after limits.max_steps. Users' environments run in
a process per episode (processes.py); the calculator and python built-ins, the service's own code, on its threads.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from zerobubble.common.errors import InvalidInput, NotFound, Overloaded, Unavailable, check_size
from zerobubble.common.sandbox.runner import CodeSandbox
from zerobubble.environment.config import EnvironmentServiceConfig
from zerobubble.environment.contract import MAX_STEPS, BadReply, Step, check_messages
from zerobubble.environment.deadlines import step_deadline
from zerobubble.environment.episode import Blueprint, Bounds, Episode, blueprint
from zerobubble.environment.metrics import EnvironmentMetrics
from zerobubble.environment.processes import EpisodeProcesses

log = logging.getLogger(__name__)
_EXPIRY_CHECK_SECONDS = 1.0


class ResetFailed(Unavailable):
    """The environment failed in reset: the episode never opened (FAILED_PRECONDITION, with the reason)."""


class _Local:
    """An episode of a built-in environment, on the calling thread."""

    def __init__(self, plan: Blueprint, bounds: Bounds):
        self._episode = Episode(plan, bounds)

    def open(self, environment: str, row: dict, timeout: float) -> str:
        return self._episode.open(row)

    def step(self, assistant_text: str, timeout: float) -> Step:
        with step_deadline(timeout):
            return self._episode.step(assistant_text)

    def kill(self) -> None:
        pass


@dataclass
class _Open:
    environment: str
    runner: Any  # _Local or processes.ProcessEpisode
    last_used: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    steps: int = 0
    ended: str = ""  # "" while it goes on; then "done" or the reason it ended


@dataclass(frozen=True)
class EnvironmentInfo:
    name: str
    description: str
    tools: list[dict]
    tool_format: str


class EpisodeService:
    def __init__(self, config: EnvironmentServiceConfig, metrics: EnvironmentMetrics, sandbox: CodeSandbox | None):
        self.config = config
        self.metrics = metrics
        limits = config.limits
        self._bounds = Bounds(limits.max_observation_bytes, limits.max_info_bytes, limits.max_tool_output_chars)
        self.unavailable: dict[str, str] = {}
        self._local: dict[str, Blueprint] = {}
        users = []
        for index, entry in enumerate(config.environments):
            if entry.runs_users_code:
                users.append((index, entry))
            elif entry.builtin == "python" and (sandbox is None or not sandbox.isolation.full):
                why = "the sandbox is off" if sandbox is None else sandbox.isolation.reason
                self.unavailable[entry.name] = f"the python tool needs the code sandbox: {why}"
                log.warning("environment %r is off: %s", entry.name, self.unavailable[entry.name])
            else:
                self._local[entry.name] = blueprint(entry, self._bounds, sandbox)
        self.processes = EpisodeProcesses(users, config.workers, self._bounds) if users else None
        self.infos = {}
        for entry in config.environments:
            if entry.name in self._local:
                plan = self._local[entry.name]
                self.infos[entry.name] = EnvironmentInfo(entry.name, entry.description, plan.tools, plan.tool_format)
            elif entry.name not in self.unavailable:
                self.infos[entry.name] = EnvironmentInfo(entry.name, entry.description,
                                                         self.processes.tools[entry.name],
                                                         self.processes.tool_formats[entry.name])
        self._episodes: dict[str, _Open] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._expiry = threading.Thread(target=self._expire_loop, name="episode-expiry", daemon=True)
        self._expiry.start()

    def open(self, environment: str, row_json: str) -> tuple[str, str, str]:
        """(episode_id, opening_json, tools_json)."""
        if environment in self.unavailable:
            raise Unavailable(f"environment {environment!r} is off: {self.unavailable[environment]}",
                              "environment")
        info = self.infos.get(environment)
        if info is None:
            raise NotFound(f"no environment {environment!r} (the service has {', '.join(self.infos) or 'none'})",
                           "environment")
        row = self._row(row_json)
        limits = self.config.limits
        with self._lock:
            if len(self._episodes) >= limits.max_episodes:
                self.metrics.refused.labels("max_episodes").inc()
                raise Overloaded(f"{limits.max_episodes} episodes are open (limits.max_episodes); close some or "
                                 "retry later")
            episode_id = secrets.token_hex(12)
            runner = (_Local(self._local[environment], self._bounds) if environment in self._local
                      else self.processes.open_process())
            episode = self._episodes[episode_id] = _Open(environment, runner, time.monotonic())
            episode.lock.acquire()  # held while it opens: no expiry, no step
        try:
            opening = runner.open(environment, row, limits.step_timeout_s)
        except BadReply as failed:
            self._forget(episode_id)
            self.metrics.ended.labels(environment, failed.code).inc()
            raise ResetFailed(f"environment {environment!r} failed in reset ({failed.code}): {failed}") from None
        finally:
            episode.last_used = time.monotonic()
            episode.lock.release()
        self.metrics.opened.labels(environment).inc()
        return episode_id, opening, json.dumps(info.tools)

    def step(self, episode_id: str, assistant_text: str, client_seconds: float | None = None) -> tuple[Step, str]:
        """The step and the reason the episode ended ("" when it goes on or the environment said done). It may take
        limits.step_timeout_s, or `client_seconds` (what is left of the client's deadline) when shorter."""
        limits = self.config.limits
        timeout = limits.step_timeout_s if client_seconds is None else min(limits.step_timeout_s, client_seconds)
        check_size(assistant_text, limits.max_assistant_bytes, "assistant_text", "limits.max_assistant_bytes")
        episode = self._get(episode_id)
        if not episode.lock.acquire(blocking=False):
            raise InvalidInput("a step of this episode is still running; steps of one episode go one at a time",
                               "episode_id")
        started = time.monotonic()
        try:
            if episode.ended:
                raise InvalidInput(f"the episode has ended ({episode.ended}); close it", "episode_id")
            episode.steps += 1
            try:
                step = episode.runner.step(assistant_text, max(timeout, 0.001))
                reason = ""
                if not step.done and episode.steps >= limits.max_steps:
                    step, reason = Step(step.observation, step.reward, True, step.info, step.tool_calls), MAX_STEPS
            except BadReply as failed:
                step, reason = Step(None, 0.0, True, {"error": str(failed)}, 0), failed.code
            if step.done:
                episode.ended = reason or "done"
                episode.runner.kill()
                with self._lock:
                    still_open = episode_id in self._episodes
                if still_open:  # one closed mid-step was counted as closed
                    self.metrics.ended.labels(episode.environment, episode.ended).inc()
            self.metrics.steps.labels(episode.environment).inc()
            self.metrics.tool_calls.labels(episode.environment).inc(step.tool_calls)
            self.metrics.step_seconds.labels(episode.environment).observe(time.monotonic() - started)
            return step, reason
        finally:
            episode.last_used = time.monotonic()
            episode.lock.release()

    def close(self, episode_id: str) -> None:
        episode = self._forget(episode_id)
        if episode is not None and not episode.ended:
            self.metrics.ended.labels(episode.environment, "closed").inc()

    def live(self) -> int:
        with self._lock:
            return len(self._episodes)

    def _row(self, row_json: str) -> dict:
        check_size(row_json, self.config.limits.max_row_bytes, "row_json", "limits.max_row_bytes")
        try:
            row = json.loads(row_json)
        except (ValueError, RecursionError) as exc:  # ValueError: also an integer of more digits than Python reads
            raise InvalidInput(f"not JSON ({getattr(exc, 'msg', exc)})", "row_json") from None
        if not isinstance(row, dict):
            raise InvalidInput(f"must be a JSON object, got a {type(row).__name__}", "row_json")
        if "messages" in row:
            try:
                check_messages(row["messages"], "messages")
            except BadReply as bad:
                raise InvalidInput(str(bad), "row_json") from None
        return row

    def _get(self, episode_id: str) -> _Open:
        with self._lock:
            episode = self._episodes.get(episode_id)
        if episode is None:
            raise NotFound("no such episode (never opened, closed, or expired after limits.idle_timeout_s)",
                           "episode_id")
        return episode

    def _forget(self, episode_id: str) -> _Open | None:
        with self._lock:
            episode = self._episodes.pop(episode_id, None)
        if episode is not None:
            episode.runner.kill()
        return episode

    def _expire_loop(self) -> None:
        idle = self.config.limits.idle_timeout_s
        while not self._closed.wait(_EXPIRY_CHECK_SECONDS):
            now = time.monotonic()
            with self._lock:
                stale = [key for key, episode in self._episodes.items()
                         if now - episode.last_used > idle and not episode.lock.locked()]
            for key in stale:
                episode = self._forget(key)
                if episode is not None and not episode.ended:
                    self.metrics.ended.labels(episode.environment, "expired").inc()

    def close_all(self) -> None:
        self._closed.set()
        with self._lock:
            keys = list(self._episodes)
        for key in keys:
            self._forget(key)
        if self.processes is not None:
            self.processes.close()
