"""The clipped policy loss of the GRPO family over padded [N, T] tensors, with gradient-accumulation-exact scaling.

Every loss here is a SUM over the micro-batch divided by a normaliser of the whole mini-batch (all micro-batches,
all data-parallel ranks), so summing micro-batch losses gives exactly the one-big-batch loss. Colossal-RL divided
by per-micro-batch counts and summed, which made the gradient scale depend on the micro-batch count.

Three policies meet in an asynchronous step: the sampler's (behaviour, possibly versions old), the trainer's
before this step's updates (old, or proximal) and the one being updated. `AlgorithmConfig.off_policy` picks how
they enter the loss; the default, AReaL's decoupled objective, clips against old and weights by old / behaviour.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

from zerobubble.trainer.algorithms.presets import Aggregation, AlgorithmConfig, RatioLevel


@dataclass(frozen=True)
class LossStats:
    """Detached figures over this micro-batch's effective tokens: means (weight them by effective_tokens to
    combine micro-batches) and maxima."""

    clip_fraction: Tensor
    clip_low_fraction: Tensor
    clip_high_fraction: Tensor
    ratio_mean: Tensor
    effective_tokens: Tensor
    kl_mean: Tensor | None = None
    entropy_mean: Tensor | None = None
    behaviour_weight_mean: Tensor | None = None
    behaviour_weight_max: Tensor | None = None
    capped_fraction: Tensor | None = None
    mismatch_masked_fraction: Tensor | None = None
    # The rollout-trainer gap on tokens drawn by the weights being trained (staleness apart): the k3 estimate of
    # KL(pi_behaviour || pi_old) and the mean |log pi_old - log pi_behaviour|, means over gap_tokens tokens.
    gap_kl_mean: Tensor | None = None
    gap_abs_mean: Tensor | None = None
    gap_tokens: Tensor | None = None


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
    sum_over_ranks: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """The normaliser to pass to every micro-batch's `policy_loss` in one optimizer step.

    Sums `local_normaliser` over this rank's micro-batch masks, then over the data-parallel ranks with
    `sum_over_ranks` (the strategy's all_reduce_sum). The strategies SUM gradients over ranks, so each rank's
    loss sum / the global count, summed, is the global sum / global count: the update of one big batch.
    At least 1, so a mini-batch with nothing to learn from gives a zero loss, not NaN.
    """
    total = sum(local_normaliser(mask, aggregation, max_new_tokens=max_new_tokens).double() for mask in masks)
    if not isinstance(total, Tensor):
        raise ValueError("mini_batch_normaliser needs at least one micro-batch mask")
    if sum_over_ranks is not None:
        total = sum_over_ranks(total)
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


@dataclass(frozen=True)
class BehaviourWeight:
    """[N, T] detached weights multiplying each token's clipped term, and where the raw weight exceeded the cap."""

    raw: Tensor
    applied: Tensor
    capped: Tensor


def behaviour_weight(old_logp: Tensor, behaviour_logp: Tensor, mask: Tensor,
                     config: AlgorithmConfig) -> BehaviourWeight:
    """pi_old / pi_behaviour (per token, or per sequence with GSPO's ratio), capped as `config.off_policy` says."""
    raw = importance_ratio(old_logp, behaviour_logp, mask, config.ratio_level).detach()
    capped = raw > config.behaviour_weight_cap
    if config.off_policy == "decoupled":
        # The decoupled PPO objective of AReaL (Fu et al. 2025, arXiv 2505.24298): the clip keeps the update near
        # the proximal policy pi_old, and pi_old / pi_behaviour corrects for who drew the tokens; as in AReaL's
        # ppo_actor_loss_fn, tokens whose weight exceeds behav_imp_weight_cap are dropped.
        applied = torch.where(capped, 0.0, raw)
    else:
        # TIS ("Your efficient RL framework secretly brings you off-policy RL training", Yao et al. 2025):
        # min(pi_old / pi_behaviour, cap).
        applied = raw.clamp(max=config.behaviour_weight_cap)
    return BehaviourWeight(raw, applied, capped)
def mismatch_keep(old_logp: Tensor, behaviour_logp: Tensor, mask: Tensor, config: AlgorithmConfig) -> Tensor | None:
    """[N, T] bool: the tokens `config.mismatch_mask` keeps, judged by the behaviour weight w_t = pi_old /
    pi_behaviour against [mismatch_low, mismatch_high]; None when no mask is set."""
    if config.mismatch_mask == "none":
        return None
    log_weight = torch.where(mask, old_logp - behaviour_logp, 0.0).detach()
    if config.mismatch_mask == "icepop":
        # IcePop (inclusionAI, the Ring-1T report): a token whose weight leaves the band is masked, both ways.
        statistic = log_weight
    elif config.mismatch_mask == "sequence":
        # TRL's sequence-level masked importance sampling: the sample's weight prod_t w_t, whole samples masked.
        statistic = log_weight.sum(dim=1, keepdim=True)
    else:
        # verl's geometric-mean rejection: exp(mean_t log w_t), length-neutral where the product is not.
        statistic = log_weight.sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1)
    low = math.log(config.mismatch_low) if config.mismatch_low > 0 else -math.inf
    keep = (statistic >= low) & (statistic <= math.log(config.mismatch_high))
    return keep.expand_as(mask) & mask


def surrogate(logp: Tensor, denominator_logp: Tensor, ratio: Tensor, advantages: Tensor,
              config: AlgorithmConfig) -> tuple[Tensor, Tensor]:
    """[N, T] per-token losses of `config.surrogate` and where each held the token's gradient back (clipped,
    capped or masked). ratio = pi / pi_denominator (token level); the formulas and sources are in
    docs/concepts/objective.md."""
    if config.surrogate == "cispo":
        # CISPO (MiniMax-M1, arXiv 2506.13585): the importance weight is clipped and detached, and multiplies the
        # REINFORCE term, so every token keeps its gradient: -sg(min(r, 1 + eps_high)) A log pi. No lower bound.
        capped = ratio.detach() > 1 + config.clip_high
        weight = ratio.detach().clamp(max=1 + config.clip_high)
        return -(weight * advantages) * logp, capped
    if config.surrogate == "sapo":
        # SAPO (Qwen, arXiv 2511.20347): a smooth gate f(r) = (4 / tau) sigmoid(tau (r - 1)) in place of the clip;
        # its gradient 4 sigmoid (1 - sigmoid) * r grad log pi is the plain one at r = 1 and fades away from it,
        # faster for negative advantages (tau_neg > tau_pos).
        tau = torch.full_like(ratio, config.sapo_tau_negative).masked_fill(advantages > 0, config.sapo_tau_positive)
        return -(4 / tau) * torch.sigmoid(tau * (ratio - 1)) * advantages, torch.zeros_like(ratio, dtype=torch.bool)
    if config.surrogate == "dppo":
        # DPPO (Qi et al., arXiv 2602.04879, Eq. 11 with the binary total variation): -M r A, where M drops a token
        # whose probability already moved more than delta from the denominator's in the direction its advantage
        # pushes (up for A > 0, down for A < 0); no ratio clip.
        moved = (logp.exp() - denominator_logp.exp()).detach()
        masked = ((advantages > 0) & (moved > config.dppo_delta)) | ((advantages < 0) & (-moved > config.dppo_delta))
        return -torch.where(masked, 0.0, ratio * advantages), masked
    # PPO clipping with DAPO's decoupled bounds: -min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A).
    unclipped = ratio * advantages
    clipped = ratio.clamp(1 - config.clip_low, 1 + config.clip_high) * advantages
    return -torch.minimum(unclipped, clipped), clipped < unclipped


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
    old_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    config: AlgorithmConfig,
    *,
    normaliser: Tensor | float,
    ref_logp: Tensor | None = None,
    behaviour_logp: Tensor | None = None,
    entropy: Tensor | None = None,
    current_tokens: Tensor | None = None,
) -> tuple[Tensor, LossStats]:
    """The surrogate (`config.surrogate`, plus beta * k3 KL) of one micro-batch, scaled by the mini-batch `normaliser`.

    logp [N, T] (with gradients); old_logp [N, T]: the policy before this update (the proximal policy; unused
    with off_policy 'behaviour_ratio'); behaviour_logp [N, T]: the sampler's log-probs (needed unless off_policy
    is 'none'); advantages [N, T] or [N]; mask [N, T] (effective response tokens: padding, filtered samples and
    overlong-filtered samples are 0). current_tokens [N, T] bool: the tokens drawn by the weights being trained
    (for the rollout-trainer gap figures; None: no figures). normaliser: `mini_batch_normaliser` over every
    micro-batch of the optimizer step and every rank. ref_logp is needed when beta > 0.
    Values at masked positions are never read, so padding may hold anything, NaN included.
    """
    mask = mask.bool()
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1).expand_as(mask)
    if config.beta > 0 and ref_logp is None:
        raise ValueError(f"beta={config.beta} needs ref_logp (the reference model's log-probs)")
    if config.off_policy != "none" and behaviour_logp is None:
        raise ValueError(f"off_policy={config.off_policy!r} needs behaviour_logp (the sampler's log-probs)")
    if config.off_policy != "behaviour_ratio" and old_logp is None:
        raise ValueError(f"off_policy={config.off_policy!r} needs old_logp (the policy before this update)")

    def effective(values: Tensor) -> Tensor:
        # Zero the padding before any exp: where() after the fact still back-propagates NaN from inf.
        return torch.where(mask, values, 0.0)

    logp, advantages = effective(logp), effective(advantages)
    # Colossal-RL's ratio is against the sampler (behaviour_ratio); PPO's against the policy before the update.
    denominator = behaviour_logp if config.off_policy == "behaviour_ratio" else old_logp
    denominator = effective(denominator).detach()
    ratio = importance_ratio(logp, denominator, mask, config.ratio_level)
    per_token, held_back = surrogate(logp, denominator, ratio, advantages, config)

    weight = keep = None
    if config.off_policy in ("decoupled", "truncated_is"):
        weight = behaviour_weight(effective(old_logp), effective(behaviour_logp), mask, config)
        keep = mismatch_keep(effective(old_logp), effective(behaviour_logp), mask, config)
        per_token = per_token * (weight.applied if keep is None else torch.where(keep, weight.applied, 0.0))
    kl = None
    if ref_logp is not None:
        kl = k3_kl(logp, effective(ref_logp).detach())
        if config.beta > 0:
            per_token = per_token + config.beta * kl

    loss = aggregate(per_token, mask, config.aggregation, normaliser)
    stats = _stats(mask, ratio, advantages, held_back, kl, entropy, weight, keep)
    if current_tokens is not None and behaviour_logp is not None and old_logp is not None:
        stats = _with_gap(stats, effective(old_logp).detach(), effective(behaviour_logp), mask & current_tokens.bool())
    return loss, stats


def _with_gap(stats: LossStats, old_logp: Tensor, behaviour_logp: Tensor, current: Tensor) -> LossStats:
    """The engine's gap alone: on tokens the trained weights drew, pi_old and pi_behaviour are one policy in exact
    arithmetic, so whatever separates them is the engines' numerics (or a sampling support not replayed)."""
    with torch.no_grad():
        count = current.sum()

        def mean(values: Tensor) -> Tensor:
            return torch.where(current, values, 0.0).sum() / count.clamp(min=1)

        # k3 with samples from pi_behaviour: r - 1 - log r, r = pi_old / pi_behaviour (non-negative per token).
        gap_kl = mean(k3_kl(behaviour_logp, old_logp))
        gap_abs = mean((old_logp - behaviour_logp).abs())
    return dataclasses.replace(stats, gap_kl_mean=gap_kl, gap_abs_mean=gap_abs, gap_tokens=count)


def _stats(
    mask: Tensor, ratio: Tensor, advantages: Tensor, was_clipped: Tensor, kl: Tensor | None, entropy: Tensor | None,
    weight: BehaviourWeight | None, keep: Tensor | None,
) -> LossStats:
    count = mask.sum()
    with torch.no_grad():
        def mean(values: Tensor | None) -> Tensor | None:
            if values is None:
                return None
            return torch.where(mask, values.to(ratio.dtype), 0.0).sum() / count.clamp(min=1)

        return LossStats(
            clip_fraction=mean(was_clipped),
            # The clip acts above 1 + clip_high only for A > 0 and below 1 - clip_low only for A < 0.
            clip_low_fraction=mean(was_clipped & (advantages < 0)),
            clip_high_fraction=mean(was_clipped & (advantages > 0)),
            ratio_mean=mean(ratio),
            effective_tokens=count,
            kl_mean=mean(kl),
            entropy_mean=mean(entropy),
            behaviour_weight_mean=None if weight is None else mean(weight.raw),
            behaviour_weight_max=None if weight is None else torch.where(mask, weight.raw, 0.0).max(),
            capped_fraction=None if weight is None else mean(weight.capped),
            mismatch_masked_fraction=None if keep is None else mean(~keep),
        )
