"""Prometheus view of the trainer: the figures of its last step as gauges (the weight broadcaster adds its
own sync duration histogram, zerobubble_trainer_weight_sync_seconds)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

PREFIX = "zerobubble_trainer"
STEP_FIGURES = {
    "loss": "policy loss of the last step",
    "reward_mean": "mean reward of the last step's samples (after reward shaping)",
    "reward_std": "reward standard deviation of the last step's samples",
    "answer_accuracy": "fraction of the last step's samples with a correct answer",
    "format_accuracy": "fraction of the last step's samples with a valid format",
    "kl": "mean k3 KL to the reference model",
    "entropy": "mean token entropy of the policy on the sampled responses",
    "clip_fraction": "fraction of tokens whose ratio was clipped",
    "clip_low_fraction": "fraction of tokens clipped below (ratio under 1 - clip_low, negative advantage)",
    "clip_high_fraction": "fraction of tokens clipped above (ratio over 1 + clip_high, positive advantage)",
    "behaviour_weight_mean": "mean importance weight pi_old / pi_behaviour before capping",
    "behaviour_weight_max": "largest importance weight pi_old / pi_behaviour before capping",
    "behaviour_weight_capped_fraction": "fraction of tokens whose importance weight exceeded the cap",
    "grad_norm": "gradient norm before clipping",
    "lr": "learning rate",
    "response_length_mean": "mean response length in tokens",
    "response_length_max": "longest response in tokens",
    "truncation_rate": "fraction of responses stopped by max_new_tokens",
    "staleness_mean": "mean policy versions between generating a sample and training on it",
    "staleness_max": "most policy versions between generating a sample and training on it",
    "sample_utilisation": "fraction of samples with a non-zero advantage",
    "tokens_per_second": "prompt and response tokens trained per second",
    "trainer_idle_fraction": "fraction of wall time spent waiting for experience",
    "weight_sync_gbps": "GB/s of the last weight broadcast",
}


class TrainerMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.steps = Counter(f"{PREFIX}_steps", "training steps done", registry=registry)
        self.policy_version = Gauge(f"{PREFIX}_policy_version", "version of the newest weights", registry=registry)
        self.groups_refused = Counter(f"{PREFIX}_groups_refused", "experience groups skipped as unusable "
                                      "(non-finite values, token ids outside the vocabulary)", registry=registry)
        self.figures = {name: Gauge(f"{PREFIX}_{name}", text, registry=registry)
                        for name, text in STEP_FIGURES.items()}

    def observe_step(self, row: dict) -> None:
        self.steps.inc()
        self.policy_version.set(row["policy_version"])
        for name, gauge in self.figures.items():
            if name in row:
                gauge.set(row[name])
