"""The GRPO-family math: advantages, log-probs, the policy loss, DAPO's overlong handling and named presets."""

from zerobubble.trainer.algorithms.advantages import (
    compute_advantages,
    dr_grpo_advantages,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)
from zerobubble.trainer.algorithms.logprobs import TokenLogprobs, token_logprobs_and_entropy
from zerobubble.trainer.algorithms.losses import LossStats, local_normaliser, mini_batch_normaliser, policy_loss
from zerobubble.trainer.algorithms.overlong import (
    default_cache_length,
    overlong_sample_mask,
    shape_rewards,
    soft_overlong_penalty,
)
from zerobubble.trainer.algorithms.presets import PRESETS, AlgorithmConfig, algorithm_config

__all__ = [
    "PRESETS",
    "AlgorithmConfig",
    "LossStats",
    "TokenLogprobs",
    "algorithm_config",
    "compute_advantages",
    "default_cache_length",
    "dr_grpo_advantages",
    "grpo_advantages",
    "local_normaliser",
    "mini_batch_normaliser",
    "overlong_sample_mask",
    "policy_loss",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "shape_rewards",
    "soft_overlong_penalty",
    "token_logprobs_and_entropy",
]
