"""The clipped policy loss of the GRPO family over padded [N, T] tensors, with gradient-accumulation-exact scaling.

Every loss here is a SUM over the micro-batch divided by a normaliser of the whole mini-batch (all micro-batches,
all data-parallel ranks), so summing micro-batch losses gives exactly the one-big-batch loss. Colossal-RL divided
by per-micro-batch counts and summed, which made the gradient scale depend on the micro-batch count.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from zerobubble.trainer.algorithms.presets import Aggregation, AlgorithmConfig, RatioLevel


@dataclass(frozen=True)
class LossStats:
    """Detached means over this micro-batch's effective tokens (weight by effective_tokens to combine them)."""

    clip_fraction: Tensor
    ratio_mean: Tensor
    effective_tokens: Tensor
    kl_mean: Tensor | None = None
    entropy_mean: Tensor | None = None
    tis_weight_mean: Tensor | None = None


def local_normaliser(mask: Tensor, aggregation: Aggregation, *, max_new_tokens: int | None = None) -> Tensor:
    """This micro-batch's share of the normaliser: effective tokens, samples with any effective token, or
    (constant) samples * max_new_tokens."""
    mask = mask.bool()
    if aggregation == "token_level":
        return mask.sum()
    if aggregation == "sample_level":
        return mask.any(dim=1).sum()
    if aggregation == "constant":
        if max_new_tokens is None or max_new_tokens <= 0:
            raise ValueError("aggregation 'constant' needs max_new_tokens > 0")
        return torch.tensor(mask.size(0) * max_new_tokens, device=mask.device)
    raise ValueError(f"unknown aggregation {aggregation!r}")


def mini_batch_normaliser(
    masks: Iterable[Tensor],
    aggregation: Aggregation,
    *,
    max_new_tokens: int | None = None,
    group: dist.ProcessGroup | None = None,
) -> Tensor:
    """The normaliser to pass to every micro-batch's `policy_loss` in one optimizer step.

    Sums `local_normaliser` over the micro-batch masks; with a data-parallel `group`, all-reduces the sum
    and divides it by the group size, because DDP and FSDP average gradients over ranks: each rank's
    loss sum / (global count / ranks), averaged, is the global sum / global count. At least 1, so a
    mini-batch with nothing to learn from gives a zero loss, not NaN.
    """
    total = sum(local_normaliser(mask, aggregation, max_new_tokens=max_new_tokens).double() for mask in masks)
    if not isinstance(total, Tensor):
        raise ValueError("mini_batch_normaliser needs at least one micro-batch mask")
    if group is not None:
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
        total = total / dist.get_world_size(group)
    return total.clamp(min=1.0)


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    # Schulman's k3 estimator of KL(pi || ref), as GRPO and Colossal-RL: exp(ref - logp) - (ref - logp) - 1.
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1


def importance_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor, level: RatioLevel) -> Tensor:
    """[N, T] ratios: per token, or GSPO's per-sequence ratio broadcast over the sample's tokens."""
    log_ratio = logp - old_logp
    if level == "token":
        # PPO / GRPO: pi(y_t) / pi_old(y_t).
        return torch.exp(log_ratio)
    lengths = mask.sum(dim=1, keepdim=True).clamp(min=1)
    # GSPO (Zheng et al. 2025): s_i = exp(mean over the sample's tokens of log pi - log pi_old).
    sequence = torch.exp(torch.where(mask, log_ratio, 0.0).sum(dim=1, keepdim=True) / lengths)
    return sequence.expand_as(log_ratio)


def truncated_is_weight(old_logp: Tensor, behaviour_logp: Tensor, cap: float) -> Tensor:
    # TIS ("Your efficient RL framework secretly brings you off-policy RL training", Yao et al. 2025):
    # min(pi_old / pi_behaviour, cap), detached, corrects for the sampler's numerics differing from the trainer's.
    return torch.exp(old_logp - behaviour_logp).clamp(max=cap).detach()


def aggregate(per_token: Tensor, mask: Tensor, aggregation: Aggregation, normaliser: Tensor | float) -> Tensor:
    """Reduce [N, T] per-token losses to the micro-batch's share of the mini-batch loss."""
    masked = torch.where(mask, per_token, 0.0)
    normaliser = torch.as_tensor(normaliser, dtype=masked.dtype, device=masked.device)
    if aggregation == "sample_level":
        # GRPO (Shao et al. 2024) as Colossal-RL's sample_level: each sample's token mean, then mean over samples.
        per_sample = masked.sum(dim=1) / mask.sum(dim=1).clamp(min=1)
        return per_sample.sum() / normaliser
    if aggregation in ("token_level", "constant"):
        # token_level (DAPO): sum / effective tokens; constant (Dr.GRPO): sum / (samples * max_new_tokens).
        return masked.sum() / normaliser
    raise ValueError(f"unknown aggregation {aggregation!r}")


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    config: AlgorithmConfig,
    *,
    normaliser: Tensor | float,
    ref_logp: Tensor | None = None,
    behaviour_logp: Tensor | None = None,
    entropy: Tensor | None = None,
) -> tuple[Tensor, LossStats]:
    """The clipped surrogate (plus beta * k3 KL) of one micro-batch, scaled by the mini-batch `normaliser`.

    logp [N, T] (with gradients), old_logp [N, T] (the policy before this update), advantages [N, T] or [N],
    mask [N, T] (effective response tokens: padding, filtered samples and overlong-filtered samples are 0).
    normaliser: from `mini_batch_normaliser` over every micro-batch of the optimizer step.
    ref_logp is needed when beta > 0; behaviour_logp (the sampler's log-probs) when tis_cap is set.
    Values at masked positions are never read, so padding may hold anything, NaN included.
    """
    mask = mask.bool()
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1).expand_as(mask)
    if config.beta > 0 and ref_logp is None:
        raise ValueError(f"beta={config.beta} needs ref_logp (the reference model's log-probs)")
    if config.tis_cap is not None and behaviour_logp is None:
        raise ValueError(f"tis_cap={config.tis_cap} needs behaviour_logp (the sampler's log-probs)")
    # Zero the padding before any exp: where() after the fact still back-propagates NaN from inf.
    logp, old_logp, advantages = (torch.where(mask, t, 0.0) for t in (logp, old_logp, advantages))

    ratio = importance_ratio(logp, old_logp.detach(), mask, config.ratio_level)
    unclipped = ratio * advantages
    # PPO clipping with DAPO's decoupled bounds: -min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A).
    clipped = ratio.clamp(1 - config.clip_low, 1 + config.clip_high) * advantages
    per_token = -torch.minimum(unclipped, clipped)

    tis_weight = None
    if config.tis_cap is not None:
        tis_weight = truncated_is_weight(old_logp, torch.where(mask, behaviour_logp, 0.0), config.tis_cap)
        per_token = per_token * tis_weight
    kl = None
    if ref_logp is not None:
        kl = k3_kl(logp, torch.where(mask, ref_logp, 0.0).detach())
        if config.beta > 0:
            per_token = per_token + config.beta * kl

    loss = aggregate(per_token, mask, config.aggregation, normaliser)
    return loss, _stats(mask, ratio, clipped < unclipped, kl, entropy, tis_weight)


def _stats(
    mask: Tensor, ratio: Tensor, was_clipped: Tensor, kl: Tensor | None, entropy: Tensor | None,
    tis_weight: Tensor | None,
) -> LossStats:
    count = mask.sum()
    with torch.no_grad():
        def mean(values: Tensor | None) -> Tensor | None:
            if values is None:
                return None
            return torch.where(mask, values.to(ratio.dtype), 0.0).sum() / count.clamp(min=1)

        return LossStats(
            clip_fraction=mean(was_clipped),
            ratio_mean=mean(ratio),
            effective_tokens=count,
            kl_mean=mean(kl),
            entropy_mean=mean(entropy),
            tis_weight_mean=mean(tis_weight),
        )
