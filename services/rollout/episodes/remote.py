"""The environment service as the episode driver's sessions: JSON replies turned into plain values, and a lost
service turned into ended episodes instead of a failed batch."""

from __future__ import annotations

import json
import logging
import threading

import grpc

from zerobubble.common.clients.environment import EnvironmentClient
from zerobubble.common.config import ClientConfig
from zerobubble.common.persistence import TRANSIENT, until_done
from zerobubble.rollout.episodes.sessions import RESET_FAILED, UNAVAILABLE, Opening, StepOutcome

log = logging.getLogger(__name__)
# The statuses of an OpenEpisode that opened nothing: the service was away (its episodes are gone with it), or it
# refused before opening (limits.max_episodes reached, or its environments' process could not start). After a
# deadline the service may have opened the episode, or may still be opening it: a second call would open another.
NOT_OPENED = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})


class RemoteSessions:
    def __init__(self, config: ClientConfig, *, stop: threading.Event | None = None, max_backoff: float = 5.0):
        self.client = EnvironmentClient(config, retries=False)
        self.config = config
        self.stop = stop or threading.Event()
        self.max_backoff = max_backoff
        self._told: set[tuple[str, str]] = set()   # what has been warned of once, by what failed and how

    def open(self, environment: str, row: dict) -> Opening:
        """Retried only while the service certainly opened nothing (NOT_OPENED): away (a supervisor restarts it) or
        full. A call that passed its deadline is not retried: the service may have opened that episode, and one
        opened twice holds a slot of limits.max_episodes, and a user's environment's process, until
        limits.idle_timeout_s expires it. The episode ends `unavailable` instead."""
        try:
            reply = until_done(lambda: self.client.open_episode(environment, row), what="open an episode",
                               stop=self.stop, max_backoff=self.max_backoff,
                               give_up_seconds=self.config.retry_seconds, transient=NOT_OPENED)
        except grpc.RpcError as exc:
            # The environment's reset failed (or the service stayed away): this episode only, not the batch.
            self._warn_once(("open " + environment, exc.code().name), "an episode of %s could not be opened: %s (%s)",
                            environment, exc.code().name, exc.details())
            return Opening("", None, failed=UNAVAILABLE if exc.code() in TRANSIENT else RESET_FAILED,
                           error=exc.details() or exc.code().name)
        return Opening(reply.episode_id, json.loads(reply.opening_json or "null"), json.loads(reply.tools_json or "[]"))

    def step(self, episode_id: str, assistant_text: str) -> StepOutcome:
        try:
            reply = self.client.step_episode(episode_id, assistant_text)
        except grpc.RpcError as exc:
            # The episode's state lived in the service: lost with it (restarted, or the episode expired), the
            # episode ends here, and the batch goes on.
            self._warn_once(("step", exc.code().name), "episode %s ended: the environment service answered %s (%s)",
                            episode_id, exc.code().name, exc.details())
            return StepOutcome(None, done=True, ended_reason=UNAVAILABLE, info={
                "error": f"the environment service answered {exc.code().name}: {exc.details()}"})
        return StepOutcome(json.loads(reply.observation_json or "null"), reward=reply.reward, done=reply.done,
                           info=json.loads(reply.info_json or "{}"), tool_calls=reply.tool_calls,
                           ended_reason=reply.ended_reason)

    def _warn_once(self, key: tuple[str, str], message: str, *args) -> None:
        """A warning the first time, debug after: a batch of episodes failing alike is one line, not one each (the
        worker counts them and logs their first error whole, episodes/failures.py)."""
        if key in self._told:
            log.debug(message, *args)
            return
        self._told.add(key)
        log.warning(message + " (more like it are logged at debug level)", *args)

    def close(self, episode_id: str) -> None:
        try:
            self.client.close_episode(episode_id)
        except grpc.RpcError as exc:
            log.debug("closing episode %s: %s", episode_id, exc.code().name)

    def environments(self) -> dict[str, str]:
        """The service's environments: name -> tool format."""
        return {e.name: e.tool_format for e in self.client.list_environments().environments}
