"""An OpenEnv server as an environment: each episode is one WebSocket session with the server at `openenv.url`, in
the messages openenv-core's `EnvClient` sends (`{"type": "reset"|"step", "data": ...}`, answered by
`{"type": "observation", "data": {observation, reward, done}}` or `{"type": "error", ...}`); its own client is not
used here because importing openenv.core takes seconds (it imports gradio), in every episode's process.

The assistant's turn is the action's `action_field`; the observation's `observation_field` (or the whole observation,
as JSON) is what the model reads next; the server's reward and done are the step's. It runs in the episode's own
process, so a server that hangs is cut at the step's time limit."""

from __future__ import annotations

import json
from typing import Any

from zerobubble.environment.config import OpenEnvSource

# One reply of the server; what the model reads of it is bounded again by limits.max_observation_bytes.
_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


class OpenEnvEpisode:
    def __init__(self, source: OpenEnvSource):
        self.source = source
        self._client: Any = None

    def reset(self, row: dict) -> Any:
        from websockets.sync.client import connect

        url = self.source.url.rstrip("/")
        url = "ws" + url[len("http"):] if url.startswith("http") else url
        self._client = connect(f"{url}/ws", open_timeout=self.source.connect_timeout_s, max_size=_MAX_MESSAGE_BYTES)
        result = self._send("reset", {"row": row} if self.source.reset_with_row else {})
        return self._seen(result.get("observation") or {}) if self.source.opening else None

    def step(self, assistant_text: str) -> dict:
        result = self._send("step", {self.source.action_field: assistant_text})
        done = result.get("done") is True
        reward = result.get("reward")
        return {"observation": None if done else self._seen(result.get("observation") or {}),
                "reward": 0.0 if reward is None else reward, "done": done, "info": {}}

    def _send(self, kind: str, data: dict) -> dict:
        self._client.send(json.dumps({"type": kind, "data": data}))
        reply = json.loads(self._client.recv(timeout=self.source.message_timeout_s))
        if not isinstance(reply, dict) or reply.get("type") != "observation" or not isinstance(reply.get("data"), dict):
            error = reply.get("data", {}) if isinstance(reply, dict) else {}
            message = error.get("message") if isinstance(error, dict) else None
            raise RuntimeError(f"the OpenEnv server answered {kind} with {message or str(reply)[:200]}")
        return reply["data"]

    def _seen(self, observation: dict) -> Any:
        """What the model reads: a string, or chat messages, as an environment's observation is."""
        field = self.source.observation_field
        if field is None:
            return json.dumps(observation, ensure_ascii=False)
        if field not in observation:
            raise ValueError(f"openenv.observation_field: the observation has no {field!r} (it has "
                             f"{sorted(observation)[:8]})")
        value = observation[field]
        return value if isinstance(value, str | list) or value is None else json.dumps(value, ensure_ascii=False)
