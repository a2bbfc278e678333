"""DAPO's treatment of responses that run into max_new_tokens: reward shaping and loss filtering."""

from __future__ import annotations

import torch
from torch import Tensor

from zerobubble.trainer.algorithms.presets import AlgorithmConfig

MAX_CACHE_LENGTH = 1024


def default_cache_length(max_new_tokens: int) -> int:
    # Colossal-RL's DAPO setting: min(1024, max_new_tokens // 4).
    return min(MAX_CACHE_LENGTH, max_new_tokens // 4)


def soft_overlong_penalty(lengths: Tensor, max_new_tokens: int, cache_length: int) -> Tensor:
    """The (non-positive) length penalty of each response, [N] lengths -> [N]."""
    if not 0 < cache_length <= max_new_tokens:
        raise ValueError(f"cache_length must be in (0, max_new_tokens={max_new_tokens}], got {cache_length}")
    start = max_new_tokens - cache_length
    lengths = lengths.to(torch.promote_types(lengths.dtype, torch.float32))
    # DAPO (Yu et al. 2025) eq. 13: ((max_new - cache) - L) / cache for max_new - cache < L <= max_new.
    penalty = (start - lengths) / cache_length
    return torch.where((lengths > start) & (lengths <= max_new_tokens), penalty, torch.zeros_like(penalty))


def shape_rewards(
    rewards: Tensor,
    lengths: Tensor,
    truncated: Tensor,
    config: AlgorithmConfig,
    *,
    max_new_tokens: int,
    no_answer_reward: float = 0.0,
) -> Tensor:
    """Rewards after DAPO's soft overlong punishment (applied before advantages); unchanged when it is off.

    A truncated response never reached its answer, so it gets `no_answer_reward` (the reward of a wrong
    answer), then every response in the penalty zone gets the length penalty times overlong_penalty_scale.
    """
    if not config.soft_overlong_punishment:
        return rewards
    cache = config.overlong_cache_length or default_cache_length(max_new_tokens)
    truncated = truncated.bool().reshape(rewards.shape)
    answered = torch.where(truncated, torch.full_like(rewards, no_answer_reward), rewards)
    penalty = soft_overlong_penalty(lengths, max_new_tokens, cache).to(rewards.dtype).reshape(rewards.shape)
    return answered + config.overlong_penalty_scale * penalty


def overlong_sample_mask(truncated: Tensor, config: AlgorithmConfig) -> Tensor:
    """[N] bool: which samples take part in the loss (DAPO overlong filtering drops the truncated ones)."""
    if config.overlong_filtering:
        return ~truncated.bool()
    return torch.ones_like(truncated, dtype=torch.bool)
