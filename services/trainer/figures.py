"""The figures of a training step, in one table: each row of metrics.jsonl, each Prometheus gauge, each dashboard
tag and each rule for combining data-parallel ranks is derived from it. Adding a figure is adding a row (and
computing it where its source says)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# How the ranks' values of one step make the step's: `sum` for what each rank holds a share of, `shared` for what
# every rank has the same of, `max` for maxima, `mean` for the rest, averaged weighted by each rank's samples
# (exact for means over samples; token-weighted loss statistics and reward_std come out as close approximations).
Ranks = Literal["sum", "shared", "max", "mean"]


@dataclass(frozen=True)
class Figure:
    name: str                 # the key in metrics.jsonl; the gauge is zerobubble_trainer_<name>
    help: str
    ranks: Ranks = "mean"
    dashboard: Literal["train", "pipeline"] = "train"   # the section of TensorBoard's and wandb's tags
    gauge: bool = True        # exported to Prometheus as a gauge of the last step
    loss_stat: str | None = None   # the LossStats field it comes from: micro-batches combine it by `ranks`
                                   # (max: the largest; otherwise weighted by effective tokens)


FIGURES: tuple[Figure, ...] = (
    # From the policy update (services/trainer/update.py).
    Figure("loss", "policy loss of the last step", ranks="sum"),
    Figure("grad_norm", "gradient norm before clipping", ranks="shared"),
    Figure("lr", "learning rate", ranks="shared"),
    Figure("reward_mean", "mean reward of the last step's samples (after reward shaping)"),
    Figure("reward_std", "reward standard deviation of the last step's samples"),
    Figure("sample_utilisation", "fraction of samples with a non-zero advantage"),
    Figure("teacher_reverse_kl", "mean log p_student - log p_teacher over the trained tokens: the reverse KL to the "
           "teacher that distillation descends (absent without a teacher)"),
    Figure("clip_fraction", "fraction of tokens whose ratio was clipped", loss_stat="clip_fraction"),
    Figure("clip_low_fraction", "fraction of tokens clipped below (ratio under 1 - clip_low, negative advantage)",
           loss_stat="clip_low_fraction"),
    Figure("clip_high_fraction", "fraction of tokens clipped above (ratio over 1 + clip_high, positive advantage)",
           loss_stat="clip_high_fraction"),
    Figure("ratio_mean", "mean importance ratio against the policy before the step", gauge=False,
           loss_stat="ratio_mean"),
    Figure("kl", "mean k3 KL to the reference model", loss_stat="kl_mean"),
    Figure("entropy", "mean token entropy of the policy on the sampled responses", loss_stat="entropy_mean"),
    Figure("behaviour_weight_mean", "mean importance weight pi_old / pi_behaviour before capping",
           loss_stat="behaviour_weight_mean"),
    Figure("behaviour_weight_max", "largest importance weight pi_old / pi_behaviour before capping", ranks="max",
           loss_stat="behaviour_weight_max"),
    Figure("behaviour_weight_capped_fraction", "fraction of tokens whose importance weight exceeded the cap",
           loss_stat="capped_fraction"),
    Figure("mismatch_masked_fraction", "fraction of tokens left out by the rollout-trainer mismatch mask",
           loss_stat="mismatch_masked_fraction"),
    Figure("rollout_gap_kl", "k3 KL(pi_behaviour || pi_old) on the tokens drawn by the weights trained (the "
           "engines' gap, staleness apart)", loss_stat="gap_kl_mean"),
    Figure("rollout_gap_abs", "mean |log pi_old - log pi_behaviour| on the tokens drawn by the weights trained",
           loss_stat="gap_abs_mean"),
    # From the batch trained on (services/trainer/loop.py, experience_figures).
    Figure("answer_accuracy", "fraction of the last step's samples with a correct answer"),
    Figure("format_accuracy", "fraction of the last step's samples with a valid format"),
    Figure("response_length_mean", "mean response length in tokens"),
    Figure("response_length_max", "longest response in tokens", ranks="max"),
    Figure("truncation_rate", "fraction of responses stopped by max_new_tokens"),
    Figure("staleness_mean", "mean policy versions between generating a sample and training on it",
           dashboard="pipeline"),
    Figure("staleness_max", "most policy versions between generating a sample and training on it", ranks="max",
           dashboard="pipeline"),
    Figure("staleness_token_mean", "token-weighted mean policy versions between drawing a token and training on "
           "it (below staleness_mean when workers take weights mid-sequence)", dashboard="pipeline"),
    Figure("turns_mean", "mean assistant turns of a sample's episode (1 for single-turn samples)"),
    Figure("tool_calls_mean", "mean tool calls of a sample's episode"),
    # Counted over every rank's groups (services/trainer/tracking.py, episode_endings); absent from a step without
    # episodes. Beside them, episodes_failed_<reason> counts each failure reason seen (error, timeout, ...).
    Figure("episodes", "multi-turn episodes among the step's samples", ranks="sum"),
    Figure("episodes_failed", "episodes of the step that ended by their environment failing (error, bad_reply, "
           "timeout, reset_failed, unavailable, ...)", ranks="sum"),
    Figure("samples", "samples trained on", ranks="sum", gauge=False),
    Figure("tokens", "prompt and response tokens trained on", ranks="sum", gauge=False),
    # Timing, measured by rank 0 after the ranks' figures are combined (services/trainer/loop.py, _train).
    Figure("pull_wait_seconds", "seconds the step waited for its groups", dashboard="pipeline", gauge=False),
    Figure("collate_seconds", "seconds spent collating the step's groups", dashboard="pipeline", gauge=False),
    Figure("update_seconds", "seconds of the policy update", dashboard="pipeline", gauge=False),
    Figure("publish_seconds", "seconds spent handing the new weights to the broadcaster", dashboard="pipeline",
           gauge=False),
    Figure("step_seconds", "seconds of the whole step", dashboard="pipeline", gauge=False),
    Figure("tokens_per_second", "prompt and response tokens trained per second", dashboard="pipeline"),
    Figure("trainer_idle_fraction", "fraction of wall time spent waiting for experience", dashboard="pipeline"),
    # The broadcaster has its own histogram of sync durations (zerobubble_trainer_weight_sync_seconds).
    Figure("weight_sync_seconds", "seconds of the last weight broadcast", dashboard="pipeline", gauge=False),
    Figure("weight_sync_gbps", "GB/s of the last weight broadcast", dashboard="pipeline"),
)

BY_NAME = {figure.name: figure for figure in FIGURES}


def combine_ranks(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """The figures of a data-parallel step from each rank's figures of its share."""
    if len(per_rank) == 1:
        return dict(per_rank[0])
    samples = [rank["samples"] for rank in per_rank]
    total = sum(samples)
    out = {}
    for name, value in per_rank[0].items():
        values = [rank[name] for rank in per_rank]
        ranks = BY_NAME[name].ranks
        if ranks == "sum":
            out[name] = sum(values)
        elif ranks == "shared":
            out[name] = value
        elif ranks == "max":
            out[name] = max(values)
        else:
            out[name] = sum(v * n for v, n in zip(values, samples, strict=True)) / total if total else 0.0
    return out
