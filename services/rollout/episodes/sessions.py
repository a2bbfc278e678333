"""What the rollout worker needs of wherever its environments run: open an episode, step it, close it.

Environments are the user's code, so they run in the environment service's processes, never here; this module
is the plain-Python side of that boundary (JSON in, dataclasses out).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

# An environment's failure, as the environment service reports it; the episode ends with this reason.
UNAVAILABLE = "unavailable"


RESET_FAILED = "reset_failed"


@dataclass
class Opening:
    episode_id: str
    opening: str | list[dict] | None      # appended to the row's last user message (a string) or after it
    tools: list[dict] = field(default_factory=list)   # OpenAI function schemas, for the chat template
    # Why the episode could not be opened ("" when it was): it then plays its first turn and ends there.
    failed: str = ""
    error: str = ""                       # what went wrong, as the service said, when it failed


@dataclass
class StepOutcome:
    observation: str | list[dict] | None
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    tool_calls: int = 0
    ended_reason: str = ""                # "" unless the environment failed; then done


class EnvironmentSessions(Protocol):
    def open(self, environment: str, row: dict[str, Any]) -> Opening:
        """Never raises for the environment's own failures: they come back as an Opening with `failed`."""
        ...

    def step(self, episode_id: str, assistant_text: str) -> StepOutcome:
        """Never raises for the environment's own failures: they come back as an outcome with ended_reason."""
        ...

    def close(self, episode_id: str) -> None: ...
