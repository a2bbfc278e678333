"""Prometheus view of the trainer: the figures of its last step as gauges (the weight broadcaster adds its
own sync duration histogram, zerobubble_trainer_weight_sync_seconds)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from zerobubble.trainer.figures import FIGURES

PREFIX = "zerobubble_trainer"
# The figures of the last step exported as gauges, with their help.
STEP_FIGURES = {figure.name: figure.help for figure in FIGURES if figure.gauge}


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
