"""Prometheus view of a rollout worker."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PREFIX = "zerobubble_rollout"


class RolloutMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.registry = registry
        self.tokens = Counter(f"{PREFIX}_tokens", "response tokens generated", registry=registry)
        self.prompts = Counter(f"{PREFIX}_prompts", "prompts generated for", registry=registry)
        self.tokens_per_second = Gauge(f"{PREFIX}_tokens_per_second", "generation speed of the last batch",
                                       registry=registry)
        self.batch_seconds = Histogram(
            f"{PREFIX}_batch_seconds", "engine time of one batch of prompts", registry=registry,
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
        )
        self.reward_wait = Counter(f"{PREFIX}_reward_wait_seconds", "time spent waiting on the reward service",
                                   registry=registry)
        self.buffer_wait = Counter(f"{PREFIX}_buffer_wait_seconds", "time spent waiting on the buffer service",
                                   registry=registry)
        self.groups_pushed = Counter(f"{PREFIX}_groups_pushed", "groups the buffer stored", registry=registry)
        self.groups_not_stored = Counter(f"{PREFIX}_groups_not_stored", "groups acknowledged but not stored",
                                         ["reason"], registry=registry)
        self.policy_version = Gauge(f"{PREFIX}_policy_version", "weights version the engine generates with",
                                    registry=registry)
        self.episodes = Counter(f"{PREFIX}_episodes", "multi-turn episodes played, by how they ended (done, "
                                "max_turns, max_tokens, or an environment failure)", ["environment", "ended"],
                                registry=registry)
        self.episode_turns = Counter(f"{PREFIX}_episode_turns", "assistant turns of episodes", registry=registry)
        self.episode_tool_calls = Counter(f"{PREFIX}_episode_tool_calls", "tool calls of episodes",
                                          registry=registry)
        self.openai_chains_dropped = Counter(f"{PREFIX}_openai_chains_dropped", "chains of calls of OpenAI "
                                             "endpoint sessions that forked, not trained (each session trains its "
                                             "last)", registry=registry)
        self.eval_pass_at_1 = Gauge(f"{PREFIX}_eval_pass_at_1", "last evaluation's pass@1", ["dataset"],
                                    registry=registry)
        self.eval_pass_at_k = Gauge(f"{PREFIX}_eval_pass_at_k", "last evaluation's pass@k", ["dataset"],
                                    registry=registry)

    def watch_batcher(self, batcher_of) -> None:
        """Gauges of the engine's continuous batcher, read when scraped: `batcher_of()` is it once started, else
        None (an engine without one, or a run without episodes)."""
        def read(figure):
            return lambda: figure(batcher) if (batcher := batcher_of()) is not None else 0
        Gauge(f"{PREFIX}_batcher_running", "requests in the continuous batcher's running batch",
              registry=self.registry).set_function(read(lambda b: b.running))
        Gauge(f"{PREFIX}_kept_kv_cache_bytes", "KV cache the continuous batcher keeps for episodes between their "
              "turns", registry=self.registry).set_function(read(lambda b: b.kept.bytes))
        Gauge(f"{PREFIX}_kept_kv_cache_episodes", "episodes whose KV cache is kept between their turns",
              registry=self.registry).set_function(read(lambda b: len(b.kept)))

    def observe_episodes(self, samples) -> None:
        for sample in samples:
            if (record := sample.episode) is not None:
                self.episodes.labels(environment=record.environment, ended=record.ended_reason).inc()
                self.episode_turns.inc(record.turns)
                self.episode_tool_calls.inc(record.tool_calls)

    def observe_batch(self, *, tokens: int, prompts: int, seconds: float) -> None:
        self.tokens.inc(tokens)
        self.prompts.inc(prompts)
        self.batch_seconds.observe(seconds)
        if seconds > 0:
            self.tokens_per_second.set(tokens / seconds)
