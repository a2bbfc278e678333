"""Assembles the reward service: worker pool, sandbox, verifiers (built-in, custom, reward model, combined),
scorer, servicer, host."""

from __future__ import annotations

import logging

from zerobubble.common.sandbox.runner import CodeSandbox
from zerobubble.common.server import ServiceHost
from zerobubble.reward.combined import CombinedVerifier
from zerobubble.reward.config import REWARD_MODEL, RewardServiceConfig
from zerobubble.reward.custom import CustomVerifier, custom_specs
from zerobubble.reward.http_server import RewardHttp
from zerobubble.reward.math_pool import VerifierPool, WorkerLimits
from zerobubble.reward.metrics import RewardMetrics
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
        math = config.math
        self.pool = VerifierPool(math.workers, math.timeout_seconds, custom_specs(config.custom_verifiers),
                                 config.limits.max_answer_bytes,
                                 WorkerLimits(math.memory_bytes, math.max_open_files, tuple(math.env),
                                              math.max_consecutive_errors))
        self.sandbox = CodeSandbox(config.sandbox)
        self.reward_model = None
        try:
            verifiers, unavailable = self._verifiers(config)
        except BaseException:
            self._close_parts()
            raise
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

    def _verifiers(self, config: RewardServiceConfig) -> tuple[dict, dict[str, str]]:
        """(name -> verifier, name -> why it is off) of every configured verifier."""
        verifiers = {v.name: v for v in (boxed_verifier(self.pool), think_answer_verifier(self.pool))}
        unavailable = {}
        isolation = self.sandbox.isolation
        if isolation.full:
            verifiers["code"] = CodeVerifier(self.sandbox)
        else:
            unavailable["code"] = f"code sandbox unavailable: {isolation.reason}"
            log.warning("%s; the code verifier is off", unavailable["code"])
        for entry in config.custom_verifiers:
            verifiers[entry.name] = CustomVerifier(entry, self.pool, config.rewards)
        if config.reward_model is not None:
            from zerobubble.reward.reward_model import RewardModelVerifier

            self.reward_model = verifiers[REWARD_MODEL] = RewardModelVerifier(config.reward_model)
        ground_truths = config.ground_truths()
        for entry in config.combined_verifiers:
            off = [part.verifier for part in entry.parts if part.verifier in unavailable]
            if off:
                unavailable[entry.name] = f"its part {off[0]!r} is off: {unavailable[off[0]]}"
            else:
                verifiers[entry.name] = CombinedVerifier(entry, verifiers, ground_truths[entry.name], config.rewards)
        return verifiers, unavailable

    def start(self) -> RewardHost:
        try:
            # A custom verifier that does not import stops the start here, naming its entry.
            self.pool.wait_ready()
        except BaseException:
            self._close_parts()
            raise
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
        self._close_parts()

    def _close_parts(self) -> None:
        self.pool.close()
        self.sandbox.close()
        if self.reward_model is not None:
            self.reward_model.close()


def build(config: RewardServiceConfig) -> RewardHost:
    """The reward service, not yet started (call `start()`)."""
    return RewardHost(config)
