"""Advantage estimators of the GRPO family, over rewards laid out as [groups, generations]."""

from __future__ import annotations

import torch
from torch import Tensor

from zerobubble.trainer.algorithms.presets import AdvantageEstimator

GRPO_STD_EPS = 1e-4
WHITEN_VAR_EPS = 1e-8


def _check_groups(rewards: Tensor, minimum: int) -> None:
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [groups, generations], got shape {tuple(rewards.shape)}")
    if rewards.size(1) < minimum:
        raise ValueError(f"this estimator needs at least {minimum} generations per group, got {rewards.size(1)}")


def grpo_advantages(rewards: Tensor) -> Tensor:
    """Per-group standardised rewards, [groups, G] -> [groups, G]."""
    _check_groups(rewards, 2)
    # GRPO (Shao et al. 2024), as Colossal-RL: (r - mean) / (std + 1e-4), std unbiased, per group.
    return (rewards - rewards.mean(dim=1, keepdim=True)) / (rewards.std(dim=1, keepdim=True) + GRPO_STD_EPS)


def dr_grpo_advantages(rewards: Tensor) -> Tensor:
    """Per-group centred rewards, [groups, G] -> [groups, G]."""
    _check_groups(rewards, 1)
    # Dr.GRPO (Liu et al. 2025): r - mean; dividing by the std biases towards too easy or too hard prompts.
    return rewards - rewards.mean(dim=1, keepdim=True)


def rloo_advantages(rewards: Tensor) -> Tensor:
    """Leave-one-out advantages, [groups, G] -> [groups, G]."""
    _check_groups(rewards, 2)
    group = rewards.size(1)
    # RLOO (Ahmadian et al. 2024): r_i - mean of the others, which equals (r - mean) * G / (G - 1).
    return (rewards - rewards.mean(dim=1, keepdim=True)) * group / (group - 1)


def reinforce_pp_advantages(rewards: Tensor, response_mask: Tensor) -> Tensor:
    """REINFORCE++ with a group baseline: [groups, G] rewards, [groups*G, T] mask -> [groups*G, T] per token."""
    mask = _token_mask(rewards, response_mask)
    centred = dr_grpo_advantages(rewards).reshape(-1, 1).expand_as(mask)
    count = mask.sum()
    if count < 2:
        raise ValueError(f"whitening over the batch needs at least 2 response tokens, got {int(count)}")
    mean = torch.where(mask, centred, 0.0).sum() / count
    # Bessel-corrected variance over every response token of the batch (veRL's masked_var).
    variance = torch.where(mask, (centred - mean) ** 2, 0.0).sum() / (count - 1)
    # REINFORCE++ (Hu 2025): whiten over the batch, DIVIDING by the std (Colossal-RL multiplies: a bug).
    whitened = (centred - mean) * torch.rsqrt(variance + WHITEN_VAR_EPS)
    return torch.where(mask, whitened, 0.0)


def _token_mask(rewards: Tensor, response_mask: Tensor) -> Tensor:
    if response_mask.dim() != 2 or response_mask.size(0) != rewards.numel():
        raise ValueError(
            f"response_mask must be [groups*G, T] = [{rewards.numel()}, T], got shape {tuple(response_mask.shape)}"
        )
    return response_mask.bool()


def compute_advantages(name: AdvantageEstimator, rewards: Tensor, response_mask: Tensor) -> Tensor:
    """Per-token advantages [groups*G, T] (zero on padding) for any estimator, so the loss code is uniform.

    Row i*G + j of the result is generation j of group i, the order of `rewards.reshape(-1)`.
    """
    mask = _token_mask(rewards, response_mask)
    if name == "reinforce_pp":
        return reinforce_pp_advantages(rewards, mask)
    estimators = {"grpo": grpo_advantages, "dr_grpo": dr_grpo_advantages, "rloo": rloo_advantages}
    if name not in estimators:
        raise ValueError(f"unknown advantage estimator {name!r}; known: {', '.join([*estimators, 'reinforce_pp'])}")
    per_sample = estimators[name](rewards).reshape(-1, 1)
    return torch.where(mask, per_sample, 0.0)


def reverse_kl_advantages(student_logp: Tensor, teacher_logp: Tensor, mask: Tensor, coef: float, *,
                          centred: bool = False, discount: float = 0.0) -> Tensor:
    """On-policy distillation's per-token advantage, [N, T] -> [N, T] (zero off the mask): -coef (log p_student -
    log p_teacher) of each sampled token.

    The per-token reverse KL KL(p_student || p_teacher), estimated on the student's own samples, is the expectation of
    log p_student - log p_teacher over them; with its negative as a per-token advantage (no group baseline, no
    discount), the policy gradient descends it: each token is pushed towards what the teacher would have said in
    that very context (Agarwal et al. 2024, "On-Policy Distillation of Language Models: Learning from
    Self-Generated Mistakes" (GKD) with the reverse KL; Lu and Thinking Machines Lab 2025, "On-Policy Distillation",
    whose advantage this is). log p_student is that of the distribution the token was drawn from (the sampler's, as
    Tinker's recipe uses), so the estimate needs no forward pass of its own.

    `centred` subtracts the batch's mean log-ratio over its masked tokens (the KL estimate itself) first: a baseline
    that does not depend on the token leaves the gradient's expectation as it is (Williams 1992, "Simple
    statistical gradient-following algorithms", section 4) but not its spread. Without it, a student far from its
    teacher has almost every sampled token's advantage negative, so every step pushes down what was sampled and
    raises the entropy whatever the teacher prefers.

    `discount` (gamma) makes each token's term the discounted sum of the log-ratios from it to the response's end,
    sum_{u >= t} gamma^(u - t) r_u, as tinker-cookbook's kl_discount_factor does: gamma 1 is the score-function
    gradient of the whole sequence's reverse KL, whose terms after a token are the KL that token led to. Without it
    a token that derails the answer (one a student sampled from its spread mass and the teacher would not have) is
    charged its own log-ratio only, while the student's confident continuation of the derailed text, which the
    teacher finds far less likely, is pushed down instead: in those contexts the entropy rises and derails more."""
    if student_logp.shape != teacher_logp.shape or student_logp.shape != mask.shape:
        raise ValueError(f"student, teacher log-probs and mask must have one shape [N, T], got "
                         f"{tuple(student_logp.shape)}, {tuple(teacher_logp.shape)}, {tuple(mask.shape)}")
    on = mask.bool()
    ratio = student_logp - teacher_logp
    if centred:
        ratio = ratio - ratio[on].mean() if on.any() else ratio
    ratio = torch.where(on, ratio, 0.0)
    if discount:
        ratio = discounted_future_sums(ratio, discount)
    return torch.where(on, -coef * ratio, 0.0)


def discounted_future_sums(values: Tensor, discount: float) -> Tensor:
    """[N, T] -> [N, T]: out[:, t] = sum_{u >= t} discount^(u - t) values[:, u], along each row."""
    out = torch.empty_like(values)
    running = torch.zeros_like(values[:, 0])
    for t in range(values.shape[1] - 1, -1, -1):
        running = values[:, t] + discount * running
        out[:, t] = running
    return out
