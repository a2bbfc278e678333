"""Prometheus metrics of the teacher service."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class TeacherMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.requests = Counter("zerobubble_teacher_requests", "Logprobs requests, by outcome: scored, refused "
                                "(bad input, limits, another tokenizer), overloaded", ["outcome"], registry=registry)
        self.tokens = Counter("zerobubble_teacher_tokens_scored", "tokens whose log-prob was answered",
                              registry=registry)
        self.seconds = Histogram("zerobubble_teacher_request_seconds", "time to answer one scored request, the wait "
                                 "for the model included", buckets=_SECONDS_BUCKETS, registry=registry)
