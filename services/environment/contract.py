"""The shapes an environment answers in, checked on both sides: in the episode's process (so a user hears what was
wrong) and again in the service (whatever that process sends). Nothing here runs users' code."""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass
from typing import Any

from zerobubble.common.user_code import shown

# Stable codes an episode ends with when its environment failed (StepEpisodeReply.ended_reason).
TIMEOUT, ERROR, EXITED, BAD_REPLY, TOO_LARGE, MAX_STEPS = (
    "timeout", "error", "exited", "bad_reply", "observation_too_large", "max_steps")
_STEP_KEYS = {"observation", "reward", "done", "info"}
# How deep JSON read from an environment or a model may nest: far beyond any observation, info or tool call's
# arguments, far below what json and the service's recursive code (json.dumps, protobuf) can take.
MAX_JSON_DEPTH = 64


class BadReply(ValueError):
    """What an environment returned is out of contract; `code` is the episode's ended_reason."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Step:
    observation: Any  # None, a string or a list of messages
    reward: float
    done: bool
    info: dict
    tool_calls: int = 0


def check_messages(value: Any, what: str) -> list[dict]:
    """A list of chat messages: objects with string `role` and `content` (and string values for other keys)."""
    if not isinstance(value, list):
        raise BadReply(BAD_REPLY, f"{what} must be a string, a list of messages or None, got a "
                                  f"{type(value).__name__}")
    for index, message in enumerate(value):
        if not isinstance(message, dict):
            raise BadReply(BAD_REPLY, f"{what}[{index}] must be a message {{role, content}}, got a "
                                      f"{type(message).__name__}")
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                raise BadReply(BAD_REPLY, f"{what}[{index}].{key} must be a string")
        odd = [key for key, item in message.items() if not isinstance(key, str) or not isinstance(item, str)]
        if odd:
            raise BadReply(BAD_REPLY, f"{what}[{index}]: {shown(odd[0])} must be a string key with a string value")
    return value


def check_observation(value: Any, what: str, max_bytes: int) -> str:
    """The observation (or opening) as JSON, after checking its shape and size."""
    if value is not None and not isinstance(value, str):
        check_messages(value, what)
    text = json.dumps(value, ensure_ascii=False)
    size = len(text.encode())
    if size > max_bytes:
        raise BadReply(TOO_LARGE, f"{what} has {size} bytes as JSON, over limits.max_observation_bytes={max_bytes}")
    return text


def check_step(value: Any, max_observation_bytes: int, max_info_bytes: int) -> Step:
    """What step() returned, checked: {observation, reward, done, info}."""
    if not isinstance(value, dict):
        raise BadReply(BAD_REPLY, f"step() must return a dict with {sorted(_STEP_KEYS)}, got a "
                                  f"{type(value).__name__}")
    unknown = [key for key in value if key not in _STEP_KEYS]
    if unknown:
        raise BadReply(BAD_REPLY, f"step() returned unknown keys {shown(unknown[:3])} (expected "
                                  f"{sorted(_STEP_KEYS)})")
    observation = value.get("observation")
    check_observation(observation, "observation", max_observation_bytes)
    reward = value.get("reward", 0.0)
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(float(reward)):
        raise BadReply(BAD_REPLY, f"'reward' must be a finite number, got {shown(reward)}")
    done = value.get("done", False)
    if not isinstance(done, bool):
        raise BadReply(BAD_REPLY, f"'done' must be true or false, got a {type(done).__name__}")
    info = value.get("info") or {}
    if not isinstance(info, dict):
        raise BadReply(BAD_REPLY, f"'info' must be a dict, got a {type(info).__name__}")
    try:
        size = len(json.dumps(info, allow_nan=False).encode())
    except (TypeError, ValueError) as exc:
        raise BadReply(BAD_REPLY, f"'info' is not JSON: {shown(exc)}") from None
    if size > max_info_bytes:
        raise BadReply(BAD_REPLY, f"'info' has {size} bytes as JSON, over limits.max_info_bytes={max_info_bytes}")
    return Step(observation, float(reward), done, info)


def deeper_than(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether decoded JSON nests lists and objects more than `limit` deep (checked without recursion)."""
    level = [value]
    for _ in range(limit + 1):
        level = [item for node in level if isinstance(node, dict | list)
                 for item in (node.values() if isinstance(node, dict) else node)]
        if not level:
            return False
    return True


def loads_bounded(data: str | bytes, limit: int = MAX_JSON_DEPTH) -> Any:
    """json.loads, with every way decoding fails as ValueError: not JSON, deeper than `limit` (json's own recursion
    guard too), an integer of more digits than Python converts."""
    try:
        value = json.loads(data)
    except RecursionError:
        raise ValueError(f"it nests deeper than {limit}") from None
    except ValueError as exc:  # JSONDecodeError, or int()'s digit limit
        raise ValueError(str(exc)) from None
    if deeper_than(value, limit):
        raise ValueError(f"it nests deeper than {limit}")
    return value
