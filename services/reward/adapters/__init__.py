"""Reward hooks of other RL frameworks, each a thin client of a running reward service's HTTP endpoints
(`zerobubble serve reward --set http.listen=HOST:PORT`): `trl.TRLReward` for TRL's `reward_funcs`,
`verl.compute_score` for verl's `custom_reward_function`, the file `openrlhf.py` for OpenRLHF's
`--reward.remote_url`.

They use only the standard library, so they import in the framework's own environment whatever it has
installed. Settings come from arguments or, where the framework passes none, from the environment:
ZEROBUBBLE_REWARD_URL (default http://127.0.0.1:8000), ZEROBUBBLE_AUTH_TOKEN, ZEROBUBBLE_REWARD_CA (a CA
file for https), ZEROBUBBLE_REWARD_TIMEOUT (seconds for one call, retries included; default 120) and
ZEROBUBBLE_REWARD_VERIFIER (default boxed).
"""

from __future__ import annotations

import json
import os
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT = 120.0
# Refusals worth another try within the deadline: the service's backlog is full, or it is starting.
_RETRY_STATUS = {429, 503}
_BACKOFF_SECONDS = (0.1, 0.2, 0.5, 1.0)


class RewardServiceError(RuntimeError):
    """The service refused the call: `status` is the HTTP status, `field` the request field it names."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None):
        super().__init__(f"reward service answered {status} {code}: {message}")
        self.status, self.code, self.field = status, code, field


@dataclass(frozen=True)
class RewardEndpoint:
    url: str = DEFAULT_URL
    token: str | None = None
    ca: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    verifier: str = "boxed"

    @classmethod
    def from_env(cls, **given: Any) -> RewardEndpoint:
        """Settings given as arguments (None: not given), else from the environment, else the defaults."""
        env = {
            "url": os.environ.get("ZEROBUBBLE_REWARD_URL"),
            "token": os.environ.get("ZEROBUBBLE_AUTH_TOKEN"),
            "ca": os.environ.get("ZEROBUBBLE_REWARD_CA"),
            "timeout": float(os.environ["ZEROBUBBLE_REWARD_TIMEOUT"]) if "ZEROBUBBLE_REWARD_TIMEOUT" in os.environ
            else None,
            "verifier": os.environ.get("ZEROBUBBLE_REWARD_VERIFIER"),
        }
        chosen = {key: given.get(key) if given.get(key) is not None else value for key, value in env.items()}
        return cls(**{key: value for key, value in chosen.items() if value is not None})

    def post(self, path: str, body: Any, **query: str) -> Any:
        """POST JSON and return the JSON reply; the whole call, retries included, ends within `timeout`."""
        url = self.url.rstrip("/") + path + (f"?{urllib.parse.urlencode(query)}" if query else "")
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = json.dumps(body).encode()
        context = ssl.create_default_context(cafile=self.ca) if self.ca else None
        deadline = time.monotonic() + self.timeout
        attempt = 0
        while True:
            remaining = deadline - time.monotonic()
            request = urllib.request.Request(url, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=max(remaining, 0.001), context=context) as reply:
                    return json.loads(reply.read())
            except urllib.error.HTTPError as exc:
                if exc.code not in _RETRY_STATUS or remaining <= 0:
                    raise _refusal(exc) from None
                failure: Exception = _refusal(exc)
            except (urllib.error.URLError, ConnectionError) as exc:
                if remaining <= 0 or isinstance(getattr(exc, "reason", None), ssl.SSLError):
                    raise
                failure = exc
            pause = _BACKOFF_SECONDS[min(attempt, len(_BACKOFF_SECONDS) - 1)]
            if time.monotonic() + pause >= deadline:
                raise TimeoutError(f"reward service at {self.url} did not answer within {self.timeout}s: "
                                   f"{failure}") from failure
            time.sleep(pause)
            attempt += 1


def _refusal(exc: urllib.error.HTTPError) -> RewardServiceError:
    try:
        error = json.loads(exc.read()).get("error", {})
    except (ValueError, AttributeError):
        error = {}
    return RewardServiceError(exc.code, error.get("code", exc.reason), error.get("message", exc.reason),
                              error.get("field"))


def truth_fields(value: Any) -> dict:
    """A dataset's ground truth as ScoreRequest JSON: test cases for an {"inputs", "outputs"} object (or
    that object as JSON text), otherwise the answer as text."""
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            pass
    if isinstance(value, dict):
        return {"test_cases": {"inputs": value.get("inputs", []), "outputs": value.get("outputs", [])}}
    return {"gt_answer": str(value)}
