"""Which prompt rows are multi-turn episodes, in which environment, judged how, and within which limits.

A run setting (the run spec's `episodes`): the rollout workers drive the episodes, the buffer and trainer only
see their experience, and the environment service hosts the environments by the names used here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from zerobubble.common.config import Schema

# The ends of an episode (EpisodeInfo.ended_reason) that are its environment failing, not a limit of the run
# (done, max_turns, max_tokens) or of the environment service (max_steps).
ENVIRONMENT_FAILURES = frozenset({"error", "bad_reply", "timeout", "exited", "observation_too_large",
                                  "reset_failed", "unavailable"})


class EpisodeRoute(Schema):
    environment: str = Field(min_length=1, description="the environment service's name for the environment "
                             "(its config's `environments`)")
    reward: Literal["environment", "verifier", "both"] = Field(
        "environment", description="what an episode's reward is: the environment's (see environment_reward), "
        "the row's verifier on the final assistant turn (the reward service, as for single-turn rows), or their "
        "sum")
    environment_reward: Literal["sum", "last"] = Field(
        "sum", description="the environment's part: the sum of its step rewards, or the last step's")


class EpisodeSpec(Schema):
    by_data_source: dict[str, EpisodeRoute] = Field(
        default_factory=dict, description="data_source -> the episode route of its rows; rows of other data "
        "sources are single-turn (or take `default`)")
    default: EpisodeRoute | None = Field(None, description="the route of rows whose data source by_data_source "
                                         "does not name (null: those rows are single-turn)")
    max_turns: int = Field(4, gt=0, description="assistant turns at most; an episode still going after the last "
                           "ends with reason max_turns (counted as truncated)")
    max_turn_tokens: int | None = Field(None, gt=0, description="new tokens per assistant turn at most (null: "
                                        "run_spec.max_new_tokens, which bounds the whole episode's response: "
                                        "every turn and observation together)")
    max_observation_tokens: int = Field(256, gt=0, description="an observation's content is cut to this many "
                                        "tokens (the chat template around it is not counted)")
    max_failed_batches: int | None = Field(
        3, gt=0, description="a rollout worker whose episodes all end in an environment failure (error, "
        "bad_reply, timeout, reset_failed, unavailable, ...) for this many batches in a row stops the run, naming "
        "the environment, the reason and its first error (null: never; each failed batch is still a warning)")

    def route(self, data_source: str | None) -> EpisodeRoute | None:
        """The episode route of a row, or None when the row is single-turn."""
        if data_source is not None and data_source in self.by_data_source:
            return self.by_data_source[data_source]
        return self.default

    @property
    def enabled(self) -> bool:
        return bool(self.by_data_source) or self.default is not None

    def environments(self) -> list[str]:
        routes = [*self.by_data_source.values(), *([self.default] if self.default else [])]
        return list(dict.fromkeys(r.environment for r in routes))
