"""Assembles the reward service: worker pool, sandbox, verifiers, scorer, servicer, host."""

from __future__ import annotations

import logging

from zerobubble.common.server import ServiceHost
from zerobubble.reward.config import RewardServiceConfig
from zerobubble.reward.http_server import RewardHttp
from zerobubble.reward.math_pool import MathVerifierPool
from zerobubble.reward.metrics import RewardMetrics
from zerobubble.reward.sandbox import CodeSandbox
from zerobubble.reward.scorer import RewardScorer
from zerobubble.reward.servicer import RewardServicer
from zerobubble.reward.verifiers import CodeVerifier, boxed_verifier, think_answer_verifier
from zerobubble.v1 import reward_pb2_grpc

log = logging.getLogger(__name__)

CONFIG_SCHEMA = RewardServiceConfig


class RewardHost(ServiceHost):
    """A ServiceHost that also owns the worker pool and sandbox: stopping it stops them too."""

    def __init__(self, config: RewardServiceConfig):
        super().__init__("reward", config.server)
        self.reward_config = config
        self.pool = MathVerifierPool(config.math.workers, config.math.timeout_seconds)
        self.sandbox = CodeSandbox(config.sandbox)
        verifiers = {v.name: v for v in (boxed_verifier(self.pool), think_answer_verifier(self.pool))}
        unavailable = {}
        isolation = self.sandbox.isolation
        if isolation.full:
            verifiers["code"] = CodeVerifier(self.sandbox)
        else:
            unavailable["code"] = f"code sandbox unavailable: {isolation.reason}"
            log.warning("%s; the code verifier is off", unavailable["code"])
        metrics = RewardMetrics(self.registry)
        metrics.expose({
            "zerobubble_reward_sandbox_kills": ("program trees killed by the sandbox", lambda: self.sandbox.kills),
            "zerobubble_reward_math_worker_replacements": ("math workers replaced after a hang or crash",
                                                           lambda: self.pool.replaced),
        })
        self.scorer = RewardScorer(config, verifiers, metrics, unavailable)
        window = 2 * (config.math.workers + config.sandbox.slots)
        self.add(reward_pb2_grpc.add_RewardServiceServicer_to_server, RewardServicer(self.scorer, window),
                      "zerobubble.v1.RewardService")
        self.http = RewardHttp(config, self.scorer, self.registry) if config.http.listen else None

    def start(self) -> RewardHost:
        self.pool.wait_ready()
        super().start()
        if self.http is not None:
            try:
                self.http.start()
            except BaseException:
                self.stop(grace=0)
                raise
        return self

    def stop(self, grace: float | None = None) -> None:
        if self.http is not None:
            self.http.stop()
        super().stop(grace)
        self.scorer.close()
        self.pool.close()
        self.sandbox.close()


def build(config: RewardServiceConfig) -> RewardHost:
    """The reward service, not yet started (call `start()`)."""
    return RewardHost(config)
