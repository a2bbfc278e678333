"""One training step on one batch of experience: rewards -> advantages -> clipped policy loss -> optimizer.

Reads top to bottom as the algorithm runs; the formulas themselves live in trainer/algorithms/.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from zerobubble.trainer.algorithms.advantages import compute_advantages, reverse_kl_advantages
from zerobubble.trainer.algorithms.losses import LossStats, mini_batch_normaliser, policy_loss
from zerobubble.trainer.algorithms.overlong import overlong_sample_mask, shape_rewards
from zerobubble.trainer.algorithms.presets import AlgorithmConfig
from zerobubble.trainer.collate import ExperienceBatch
from zerobubble.trainer.figures import FIGURES
from zerobubble.trainer.micro_batches import plan_micro_batches
from zerobubble.trainer.sequences import choose_layout, forward_logprobs
from zerobubble.trainer.strategies.base import Strategy


@dataclass
class UpdateSettings:
    mini_batches: int
    micro_batch_samples: int
    max_new_tokens: int
    # None: micro-batches of micro_batch_samples; else cut by this many tokens (see trainer/micro_batches.py).
    max_tokens_per_micro_batch: int | None = None
    # Positions per chunk of the output projection (None: full logits); packing needs the chunks.
    logprob_chunk_tokens: int | None = 512
    packing: bool = True


class ModelPass:
    """One model's forward over an experience batch, in the layout it supports (trainer/sequences.py)."""

    def __init__(self, model: nn.Module, settings: UpdateSettings, what: str):
        self.model = model
        self.settings = settings
        self.layout = choose_layout(model, chunk=settings.logprob_chunk_tokens, packing=settings.packing, what=what)

    def micro_batches(self, batch: ExperienceBatch, indices: torch.Tensor,
                      agree: Callable[[int], int]) -> list[torch.Tensor]:
        return plan_micro_batches(indices, batch.sequence_lengths, samples=self.settings.micro_batch_samples,
                                  budget=self.settings.max_tokens_per_micro_batch, padded=not self.layout.packed,
                                  agree=agree)

    def logprobs(self, batch: ExperienceBatch, *, with_entropy: bool):
        return forward_logprobs(self.model, batch, with_entropy=with_entropy, layout=self.layout)

    @torch.no_grad()
    def all_logprobs(self, batch: ExperienceBatch, micros: list[torch.Tensor]) -> torch.Tensor:
        """[N, T] float32 log-probs of the whole batch, without gradients, micro-batch by micro-batch."""
        out = torch.zeros(batch.response_mask.shape)
        for micro in micros:
            out[micro] = self.logprobs(batch.select(micro), with_entropy=False).logprobs.float().cpu()
        return out


def batch_advantages(batch: ExperienceBatch, algo: AlgorithmConfig, max_new_tokens: int,
                     teacher_logp: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The shaped rewards [N], the loss mask [N, T] and the per-token advantages [N, T] the step trains with: the
    estimator's from the rewards, the distillation's from the teacher's log-probs [N, T], or their sum."""
    rewards = shape_rewards(batch.rewards, batch.response_lengths, batch.truncated, algo,
                            max_new_tokens=max_new_tokens)
    mask = batch.response_mask * overlong_sample_mask(batch.truncated, algo).unsqueeze(1).float()
    advantages = torch.zeros_like(mask)
    if algo.reward_advantage:
        advantages = compute_advantages(algo.advantage_estimator, rewards.reshape(-1, batch.group_size), mask)
    if algo.distillation_coef:
        if teacher_logp is None:
            raise ValueError("algorithm.distillation_coef: the step needs the teacher's log-probs (the trainer's "
                             "teacher)")
        advantages = advantages + reverse_kl_advantages(batch.behaviour_logprobs, teacher_logp, mask,
                                                        algo.distillation_coef, centred=algo.distillation_centred,
                                                        discount=algo.distillation_discount)
    return rewards, mask, advantages


def sample_advantages(batch: ExperienceBatch, algo: AlgorithmConfig, max_new_tokens: int,
                      teacher_logp: torch.Tensor | None = None) -> list[float]:
    """Each sample's advantage as the step trains it: the mean over the tokens it trains (the one value of every
    group estimator; with distillation, the mean of its per-token advantages). A sample the step leaves out, such as
    an overlong one under the overlong filter, has 0."""
    _, mask, advantages = batch_advantages(batch, algo, max_new_tokens, teacher_logp)
    return ((advantages * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)).tolist()


class PolicyUpdate:
    def __init__(self, strategy: Strategy, algorithm: AlgorithmConfig, settings: UpdateSettings,
                 reference: nn.Module | None = None, before_step: Callable[[], None] = lambda: None,
                 teacher: Callable[[ExperienceBatch], torch.Tensor] | None = None):
        if algorithm.distillation_coef and teacher is None:
            raise ValueError("algorithm.distillation_coef: distillation needs a teacher (the trainer's teacher)")
        self.strategy = strategy
        self.algorithm = algorithm
        self.settings = settings
        self.policy = ModelPass(strategy.model, settings, "policy")
        self.reference = None if reference is None else ModelPass(reference, settings, "reference model")
        # Called before every optimizer step: whatever still reads the weights of before it finishes first (the
        # broadcaster's copy of the last published version).
        self.before_step = before_step
        # batch -> [N, T] the teacher's log-probs of its response tokens (trainer/teacher_scores.py); the last
        # batch's are kept for the rollout log's advantages.
        self.teacher = teacher
        self._teacher_logp: tuple[ExperienceBatch, torch.Tensor] | None = None

    def __call__(self, batch: ExperienceBatch, policy_version: int) -> dict[str, float]:
        """One step on `batch` with the weights of `policy_version` (the version samples say they came from)."""
        algo, settings, strategy = self.algorithm, self.settings, self.strategy
        teacher_logp = self.teacher_logprobs(batch)
        rewards, mask, advantages = batch_advantages(batch, algo, settings.max_new_tokens, teacher_logp)
        whole = self.policy.micro_batches(batch, torch.arange(batch.size), self._agree)
        recomputed_old = self._recompute_old_logprobs(batch, policy_version, whole)
        ref_logp = self.reference.all_logprobs(batch, whole) if self.reference else None

        figures = StepFigures()
        for mini in torch.arange(batch.size).chunk(settings.mini_batches):
            micros = self.policy.micro_batches(batch, mini, self._agree)
            # One denominator for the mini-batch over its micro-batches and the ranks, so accumulation gives the
            # update of one big batch; the reference summed micro-batch losses instead.
            normaliser = mini_batch_normaliser([mask[m].to(strategy.device) for m in micros], algo.aggregation,
                                               max_new_tokens=settings.max_new_tokens,
                                               sum_over_ranks=strategy.all_reduce_sum)
            for micro in micros:
                part = batch.select(micro)
                current = self.policy.logprobs(part, with_entropy=True)
                device = current.logprobs.device
                old_logp = (current.logprobs.detach() if recomputed_old is None
                            else recomputed_old[micro].to(device))
                loss, stats = policy_loss(
                    current.logprobs, old_logp, advantages[micro].to(device), mask[micro].to(device), algo,
                    normaliser=normaliser.to(device),
                    ref_logp=None if ref_logp is None else ref_logp[micro].to(device),
                    behaviour_logp=part.behaviour_logprobs.to(device), entropy=current.entropy,
                    current_tokens=(part.token_versions == policy_version).to(device),
                )
                strategy.backward(loss)
                figures.add(float(loss.detach()), stats)
            self.before_step()
            result = strategy.step()
            figures.grad_norm, figures.lr = float(result.grad_norm), float(result.lr)
        out = figures.as_dict()
        out["reward_mean"] = float(rewards.mean())
        out["reward_std"] = float(rewards.std()) if batch.size > 1 else 0.0
        out["sample_utilisation"] = float(((advantages * mask).abs().sum(dim=1) > 0).float().mean())
        if teacher_logp is not None:
            gap = torch.where(mask.bool(), batch.behaviour_logprobs - teacher_logp, 0.0)
            out["teacher_reverse_kl"] = float(gap.sum() / mask.sum().clamp(min=1))
        return out

    def teacher_logprobs(self, batch: ExperienceBatch) -> torch.Tensor | None:
        """The teacher's [N, T] log-probs of the batch (None without distillation), asked once per batch."""
        if not self.algorithm.distillation_coef:
            return None
        if self._teacher_logp is None or self._teacher_logp[0] is not batch:
            self._teacher_logp = (batch, self.teacher(batch))
        return self._teacher_logp[1]

    def sample_advantages(self, batch: ExperienceBatch) -> list[float]:
        return sample_advantages(batch, self.algorithm, self.settings.max_new_tokens, self.teacher_logprobs(batch))

    def _agree(self, count: int) -> int:
        """The most micro-batches any data-parallel rank makes of its share."""
        return int(self.strategy.all_reduce_max(torch.tensor(count, device=self.strategy.device)))

    def _recompute_old_logprobs(self, batch: ExperienceBatch, policy_version: int,
                                micros: list[torch.Tensor]) -> torch.Tensor | None:
        """The log-probs of the policy before this step's updates, by a forward of their own; None where each
        micro-batch's training forward gives them (detached) or the loss does not read them."""
        if self.algorithm.off_policy == "behaviour_ratio":
            return None
        if self.settings.mini_batches == 1 and self._every_sample_current(batch, policy_version):
            # One update, from the very weights that drew every sample: old = current before the step.
            return None
        return self.policy.all_logprobs(batch, micros)

    def _every_sample_current(self, batch: ExperienceBatch, policy_version: int) -> bool:
        # Decided over all ranks: with sharded weights the recompute forward is collective.
        stale = (batch.versions != policy_version).sum()
        return int(self.strategy.all_reduce_sum(stale.to(self.strategy.device))) == 0


# LossStats field -> the step figure's name in metrics.jsonl, by how micro-batches combine it.
MEAN_FIGURES = {f.loss_stat: f.name for f in FIGURES if f.loss_stat and f.ranks != "max"}
MAX_FIGURES = {f.loss_stat: f.name for f in FIGURES if f.loss_stat and f.ranks == "max"}
# Means over a subset of the tokens, weighted by that subset's count rather than by the effective tokens.
OWN_COUNTS = {"gap_kl_mean": "gap_tokens", "gap_abs_mean": "gap_tokens"}


@dataclass
class StepFigures:
    """Loss summed over micro-batches (it is already globally normalised); means weighted by tokens; maxima."""

    loss: float = 0.0
    tokens: float = 0.0
    grad_norm: float = 0.0
    lr: float = 0.0
    weighted: dict[str, float] = field(default_factory=dict)
    counts: dict[str, float] = field(default_factory=dict)
    maxima: dict[str, float] = field(default_factory=dict)

    def add(self, loss: float, stats: LossStats) -> None:
        self.loss += loss
        tokens = float(stats.effective_tokens)
        self.tokens += tokens
        for name, key in MEAN_FIGURES.items():
            value = getattr(stats, name)
            if value is not None:
                count = float(getattr(stats, OWN_COUNTS[name])) if name in OWN_COUNTS else tokens
                self.weighted[key] = self.weighted.get(key, 0.0) + float(value) * count
                self.counts[key] = self.counts.get(key, 0.0) + count
        for name, key in MAX_FIGURES.items():
            value = getattr(stats, name)
            if value is not None and tokens:
                self.maxima[key] = max(self.maxima.get(key, 0.0), float(value))

    def as_dict(self) -> dict[str, float]:
        out = {"loss": self.loss, "grad_norm": self.grad_norm, "lr": self.lr, **self.maxima}
        for key, total in self.weighted.items():
            out[key] = total / self.counts[key] if self.counts[key] else 0.0
        return out
