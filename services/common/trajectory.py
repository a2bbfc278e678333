"""One sample of experience in the plain form every core works with, however it was played: a single-turn answer,
a multi-turn episode, or an OpenAI endpoint session's chain of calls.

A trajectory is its prompt's ids, then one response of token ids in which the loss mask says which tokens the model
sampled (1) and which it only read (0: an episode's observations, the messages an agent put between two calls). The
tokens are the engine's own, never re-tokenised; log-probs and sampling support are those of the distribution each
sampled token was drawn from, 0 where the mask is 0. `check()` is the one judgement of whether a trajectory can be
trained on, the buffer's on arrival and the trainer's before a step; its protobuf form is in
common/trajectory_messages.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zerobubble.common.episodes import ENVIRONMENT_FAILURES
from zerobubble.common.errors import InvalidInput, TooLarge

FINISH_STOP = "stop"
FINISH_LENGTH = "length"
# Engines compute log-probs in reduced precision (bf16 logits, fused kernels), so a token drawn with
# probability ~1 may come back a hair above 0; anything clearly positive is not a log-probability.
LOGPROB_TOLERANCE = 1e-3


@dataclass
class EpisodeRecord:
    """What an episode leaves besides its tokens: how it went, for its reward, its metrics and the rollout log."""

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


@dataclass
class Trajectory:
    prompt_ids: np.ndarray            # int32 [P]
    response_ids: np.ndarray          # int32 [T]
    logprobs: np.ndarray              # float32 [T]: behaviour log-probs; 0 where loss_mask is 0
    loss_mask: np.ndarray             # uint8 [T]: 1 where the model sampled the token
    versions: np.ndarray              # int64 [T]: the policy version that drew (or, masked, preceded) each token
    finish_reason: str                # "stop" | "length"
    temperature: float
    text: str = ""                    # what a verifier judges: the answer, or an episode's last assistant turn
    # int32 [T]: tokens kept by top-k / top-p at each position (0: the whole vocabulary); None: no truncation.
    support: np.ndarray | None = None
    episode: EpisodeRecord | None = None
    reward: float = 0.0               # the score, once it is scored
    format_ok: bool = False
    answer_ok: bool = False

    def __post_init__(self) -> None:
        self.prompt_ids = np.asarray(self.prompt_ids, dtype=np.int32)
        self.response_ids = np.asarray(self.response_ids, dtype=np.int32)
        self.logprobs = np.asarray(self.logprobs, dtype=np.float32)
        self.loss_mask = np.asarray(self.loss_mask, dtype=np.uint8)
        self.versions = np.asarray(self.versions, dtype=np.int64)
        if self.support is not None:
            self.support = np.asarray(self.support, dtype=np.int32)
            if not self.support.any():
                self.support = None   # 0 everywhere: the whole vocabulary, which None says

    @property
    def model_tokens(self) -> int:
        return int(self.loss_mask.sum())

    @property
    def truncated(self) -> bool:
        return self.finish_reason == FINISH_LENGTH

    def check(self, where: str, *, vocab_size: int | None, max_prompt_tokens: int | None = None,
              max_response_tokens: int | None = None) -> None:
        """Refuse what would poison or crash a step: InvalidInput naming the field (`{where}.response_ids`, the
        group's `prompt_ids`), TooLarge over a given limit. Each array is read where it lies, one reduction a
        condition."""
        _check_ids(self.prompt_ids, "prompt_ids", vocab_size, max_prompt_tokens)
        tokens = len(self.response_ids)
        _check_ids(self.response_ids, f"{where}.response_ids", vocab_size, max_response_tokens)
        _check_count(self.logprobs, tokens, f"{where}.behaviour_logprobs", "log-probs")
        # min and max carry a NaN through: two reductions instead of a mask per condition.
        if not (np.isfinite(self.logprobs.min()) and self.logprobs.max() <= LOGPROB_TOLERANCE):
            raise InvalidInput("log-probabilities must be finite and not above 0", field=f"{where}.behaviour_logprobs")
        _check_count(self.loss_mask, tokens, f"{where}.loss_mask", "mask values")
        highest = self.loss_mask.max()  # above 1 is no mask value; 0 would train on nothing and divide by 0 tokens
        if highest > 1:
            raise InvalidInput(f"values must be 0 or 1, got {int(highest)}", field=f"{where}.loss_mask")
        if highest == 0:
            raise InvalidInput("no token is the model's (every value is 0)", field=f"{where}.loss_mask")
        if self.support is not None:
            top = np.iinfo(np.int32).max if vocab_size is None else vocab_size
            kept = self.support
            if len(kept) != tokens or kept.min() < 0 or kept.max() > top:
                raise InvalidInput(f"must hold one count per token ({tokens}), each from 0 to {top}",
                                   field=f"{where}.sampling_support")
        if self.finish_reason not in (FINISH_STOP, FINISH_LENGTH):
            raise InvalidInput(f"expected stop or length, got {self.finish_reason!r}", field=f"{where}.finish_reason")
        if not np.isfinite(self.reward):
            raise InvalidInput(f"must be finite, got {self.reward}", field=f"{where}.reward")
        if not (np.isfinite(self.temperature) and self.temperature > 0):
            raise InvalidInput(f"must be finite and above 0, got {self.temperature}", field=f"{where}.temperature")


def _check_count(values: np.ndarray, tokens: int, field: str, what: str) -> None:
    if len(values) != tokens:
        raise InvalidInput(f"{len(values)} {what} for {tokens} tokens", field=field)


def _check_ids(ids: np.ndarray, field: str, vocab_size: int | None, limit: int | None) -> None:
    if len(ids) == 0:
        raise InvalidInput("must not be empty", field=field)
    if limit is not None and len(ids) > limit:
        raise TooLarge(f"{len(ids)} tokens, over the limit of {limit}", field=field)
    # Read as unsigned, a negative id is above any vocabulary: one pass checks both bounds.
    if ids.min() >= 0 if vocab_size is None else ids.view(np.uint32).max() < vocab_size:
        return
    bound = "" if vocab_size is None else f", below the vocabulary size {vocab_size}"
    raise InvalidInput(f"token ids must be non-negative{bound}; got {int(ids.min())} to {int(ids.max())}", field=field)


def carried_versions(versions, loss_mask) -> np.ndarray:
    """Per-token versions in which each masked token (context the model read) takes the version of the sampled token
    before it, or of the first sampled one when context leads the response: the weights that were serving when it
    was read. `versions` at masked positions are ignored."""
    versions = np.asarray(versions, dtype=np.int64).copy()
    sampled = np.flatnonzero(np.asarray(loss_mask, dtype=bool))
    if len(sampled) == 0 or len(sampled) == len(versions):
        return versions
    # For each position, the last sampled position at or before it (the first sampled one before any).
    last = np.maximum.accumulate(np.where(np.asarray(loss_mask, dtype=bool), np.arange(len(versions)), -1))
    return versions[np.where(last < 0, sampled[0], last)]
