"""What an episode leaves besides its tokens: how it went, for its reward, its metrics and the rollout log."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zerobubble.common.episodes import ENVIRONMENT_FAILURES

DONE = "done"                 # the environment said so
MAX_TURNS = "max_turns"
MAX_TOKENS = "max_tokens"     # run_spec.max_new_tokens, the whole response's budget
# Ends that cut the episode short, as a length limit cuts a single response: counted as truncated.
TRUNCATING = frozenset({MAX_TURNS, MAX_TOKENS})


@dataclass
class EpisodeRecord:
    environment: str
    turns: int = 0
    tool_calls: int = 0
    step_rewards: list[float] = field(default_factory=list)
    ended_reason: str = ""
    info: dict[str, Any] = field(default_factory=dict)   # the last step's
    transcript: str = ""      # every token of the response decoded, observations included
    error: str = ""           # what went wrong, when an environment failure ended it

    @property
    def failed(self) -> bool:
        return self.ended_reason in ENVIRONMENT_FAILURES

    def environment_reward(self, rule: str) -> float:
        """'sum' of the step rewards or the 'last' one (0 for an episode that never stepped)."""
        if not self.step_rewards:
            return 0.0
        return float(sum(self.step_rewards)) if rule == "sum" else float(self.step_rewards[-1])
