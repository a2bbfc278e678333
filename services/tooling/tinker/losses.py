"""The Tinker losses over per-token log-probs, each a sum over tokens as Tinker defines them (the client scales its
own weights and advantages). PPO's clip and CISPO's capped weight are the trainer's own surrogates
(trainer/algorithms/losses.py), with Tinker's ratio thresholds turned into its clip widths."""

from __future__ import annotations

import torch
from pydantic import ValidationError
from torch import Tensor

from zerobubble.tooling.tinker.errors import invalid
from zerobubble.trainer.algorithms.losses import surrogate
from zerobubble.trainer.algorithms.presets import AlgorithmConfig

# The loss_fn_inputs each loss reads, beside target_tokens.
INPUTS = {
    "cross_entropy": ("weights",),
    "importance_sampling": ("logprobs", "advantages"),
    "ppo": ("logprobs", "advantages"),
    "cispo": ("logprobs", "advantages"),
}
_THRESHOLDS = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
_SURROGATE = {"ppo": "clipped", "cispo": "cispo"}


def check_config(loss_fn: str, config: dict[str, float | str]) -> AlgorithmConfig | None:
    """The surrogate's settings from loss_fn_config (None for the losses without one); 422 naming the key."""
    if loss_fn not in INPUTS:
        raise invalid("loss_fn", f"{loss_fn!r} is not served; served: {', '.join(INPUTS)}")
    allowed = _THRESHOLDS if loss_fn in _SURROGATE else {}
    for key, value in config.items():
        if key not in allowed:
            raise invalid(f"loss_fn_config.{key}", f"{loss_fn} takes no such setting (it takes: "
                          f"{', '.join(allowed) or 'none'})")
        if isinstance(value, str):
            raise invalid(f"loss_fn_config.{key}", "must be a number")
    if loss_fn not in _SURROGATE:
        return None
    low = float(config.get("clip_low_threshold", _THRESHOLDS["clip_low_threshold"]))
    high = float(config.get("clip_high_threshold", _THRESHOLDS["clip_high_threshold"]))
    try:
        return AlgorithmConfig(surrogate=_SURROGATE[loss_fn], clip_low=1 - low, clip_high=high - 1)
    except ValidationError as exc:
        key = "clip_low_threshold" if "clip_low" in str(exc) else "clip_high_threshold"
        raise invalid(f"loss_fn_config.{key}", "the low threshold must be in (0, 1] and the high one >= 1") from None


def per_token_loss(loss_fn: str, logp: Tensor, inputs: dict[str, Tensor], surrogate_config: AlgorithmConfig | None,
                   mask: Tensor) -> Tensor:
    """[N, T] losses; zero where `mask` (the real tokens) is False."""
    if loss_fn == "cross_entropy":
        per_token = -logp * inputs["weights"]
    else:
        sampler_logp, advantages = inputs["logprobs"], inputs["advantages"]
        ratio = torch.exp(logp - sampler_logp)
        if loss_fn == "importance_sampling":
            per_token = -ratio * advantages
        else:
            per_token, _ = surrogate(logp, sampler_logp, ratio, advantages, surrogate_config)
    return torch.where(mask, per_token, 0.0)
