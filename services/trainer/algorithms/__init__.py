"""The GRPO-family math: advantages, log-probs, the policy loss, DAPO's overlong handling and named presets.

Names load from their module on first use: the trainer's config imports `presets` (no torch) through this package,
and checking a config must not import torch."""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "advantages": ("compute_advantages", "dr_grpo_advantages", "grpo_advantages", "reinforce_pp_advantages",
                   "rloo_advantages"),
    "logprobs": ("TokenLogprobs", "token_logprobs_and_entropy"),
    "losses": ("LossStats", "local_normaliser", "mini_batch_normaliser", "policy_loss"),
    "overlong": ("default_cache_length", "overlong_sample_mask", "shape_rewards", "soft_overlong_penalty"),
    "presets": ("PRESETS", "AlgorithmConfig", "algorithm_config"),
}
_MODULE_OF = {name: module for module, names in _HOMES.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
