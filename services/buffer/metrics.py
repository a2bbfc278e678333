"""Prometheus view of the buffer: its Stats as metrics, and push/pull latency."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from zerobubble.buffer.core import Buffer
from zerobubble.common.not_stored import NOT_STORED_LABELS

PREFIX = "zerobubble_buffer"
GAUGES = {
    "queued_groups": "groups waiting for the trainer",
    "queued_bytes": "serialized bytes of the groups waiting for the trainer",
    "epoch": "oldest epoch with unfinished prompts",
    "policy_version": "policy version last set by the trainer",
    "end_of_data": "1 once every prompt of every epoch is finished",
    "unacknowledged": "groups sent to trainer ranks and not yet acknowledged",
}
COUNTERS = {
    "groups_in": "groups stored",
    "groups_out": "groups delivered to trainer ranks",
    "filtered": "groups dropped by the accuracy filter",
    "stale_dropped": "groups dropped at pull time as older than max_staleness",
    "lease_expirations": "leases that expired before they were completed",
    "returned": "groups sent to trainer ranks that went back to the queue unacknowledged",
}


class StatsCollector(Collector):
    """Reads the core's figures at scrape time, so they never drift from what Stats answers."""

    def __init__(self, core: Buffer):
        self.core = core

    def collect(self):
        stats = self.core.stats()
        for name, text in GAUGES.items():
            yield GaugeMetricFamily(f"{PREFIX}_{name}", text, value=float(stats[name]))
        for name, text in COUNTERS.items():
            yield CounterMetricFamily(f"{PREFIX}_{name}", text, value=stats[name])


class BufferMetrics:
    def __init__(self, registry: CollectorRegistry, core: Buffer):
        buckets = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
        self.push_seconds = Histogram(
            f"{PREFIX}_push_seconds", "from receiving a group to its ack (includes waiting for room)",
            registry=registry, buckets=buckets,
        )
        self.pull_seconds = Histogram(
            f"{PREFIX}_pull_seconds", "from a PullBatch call to each group it hands out (includes waiting)",
            registry=registry, buckets=buckets,
        )
        self.not_stored = Counter(f"{PREFIX}_not_stored", "pushed groups acknowledged but not stored, by reason",
                                  ["reason"], registry=registry)
        for label in NOT_STORED_LABELS.values():
            self.not_stored.labels(reason=label)
        registry.register(StatsCollector(core))
