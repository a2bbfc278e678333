"""Prometheus metrics of the reward service."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class _CountersFrom(Collector):
    """Exposes counters kept by the cores (sandbox kills, worker replacements) without copying them."""

    def __init__(self, sources: dict[str, tuple[str, Callable[[], int]]]):
        self._sources = sources

    def collect(self):
        for name, (doc, read) in self._sources.items():
            family = CounterMetricFamily(name, doc)
            family.add_metric([], read())
            yield family


class RewardMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.requests = Counter(
            "zerobubble_reward_items", "items scored, by verifier and outcome", ["verifier", "outcome"],
            registry=registry,
        )
        self.latency = Histogram(
            "zerobubble_reward_latency_seconds", "time to score one item", ["verifier"],
            buckets=_LATENCY_BUCKETS, registry=registry,
        )
        self.timeouts = Counter(
            "zerobubble_reward_timeouts", "items that hit a time limit", ["verifier"], registry=registry
        )
        self.rejected = Counter(
            "zerobubble_reward_rejected", "items refused before scoring", ["reason"], registry=registry
        )
        self.queue_depth = Gauge(
            "zerobubble_reward_queue_depth", "items accepted and not yet scored", registry=registry
        )
        self._registry = registry

    def expose(self, sources: dict[str, tuple[str, Callable[[], int]]]) -> None:
        self._registry.register(_CountersFrom(sources))
