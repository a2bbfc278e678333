"""Prometheus metrics of the environment service."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class _CounterFrom(Collector):
    def __init__(self, name: str, doc: str, read: Callable[[], int]):
        self._name, self._doc, self._read = name, doc, read

    def collect(self):
        family = CounterMetricFamily(self._name, self._doc)
        family.add_metric([], self._read())
        yield family


class EnvironmentMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.opened = Counter("zerobubble_environment_episodes_opened", "episodes opened, by environment",
                              ["environment"], registry=registry)
        self.ended = Counter("zerobubble_environment_episodes_ended", "episodes ended, by environment and reason "
                             "(done, closed, expired, max_steps, or how the environment failed: timeout, error, "
                             "exited, bad_reply, observation_too_large)", ["environment", "reason"],
                             registry=registry)
        self.steps = Counter("zerobubble_environment_steps", "steps answered, by environment", ["environment"],
                             registry=registry)
        self.tool_calls = Counter("zerobubble_environment_tool_calls", "tool calls parsed from assistant turns",
                                  ["environment"], registry=registry)
        self.step_seconds = Histogram("zerobubble_environment_step_seconds", "time to answer one step",
                                      ["environment"], buckets=_LATENCY_BUCKETS, registry=registry)
        self.refused = Counter("zerobubble_environment_refused", "episodes refused before they opened",
                               ["reason"], registry=registry)
        self._registry = registry

    def expose(self, live: Callable[[], int], restarts: Callable[[], int]) -> None:
        gauge = Gauge("zerobubble_environment_episodes_live", "episodes open now", registry=self._registry)
        gauge.set_function(live)
        self._registry.register(_CounterFrom("zerobubble_environment_process_restarts", "times the parent of the "
                                             "episode processes died and was started again", restarts))
