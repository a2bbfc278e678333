"""Assembles a rollout worker: engine, clients, weight receiver, evaluator, worker loop, servicer, host."""

from __future__ import annotations

import logging
import threading
import time

import torch

from zerobubble.common.clients.buffer import BufferClient
from zerobubble.common.clients.reward import RewardClient
from zerobubble.common.server import ServiceHost
from zerobubble.rollout.batches_in_flight import check_batches_in_flight
from zerobubble.rollout.config import RolloutServiceConfig
from zerobubble.rollout.engine_factory import make_engine
from zerobubble.rollout.episodes.play import make_player
from zerobubble.rollout.evaluation import Evaluator
from zerobubble.rollout.generate import GenerateCalls
from zerobubble.rollout.in_flight import check_engine
from zerobubble.rollout.metrics import RolloutMetrics
from zerobubble.rollout.servicer import RolloutServicer
from zerobubble.rollout.worker import RolloutWorker
from zerobubble.v1 import rollout_pb2_grpc

log = logging.getLogger(__name__)

CONFIG_SCHEMA = RolloutServiceConfig


class RolloutHost(ServiceHost):
    """Serves the worker's RPCs and runs its loop on a thread; the process ends with 1 if the loop fails."""

    def __init__(self, config: RolloutServiceConfig):
        # Before anything expensive: a worker that disagrees with the run must not start generating.
        # The worker's loop retries its calls itself (common/persistence.py).
        self.buffer = BufferClient(config.buffer, retries=False)
        try:
            self.spec = self.buffer.agreed_run_spec(config.expectations(), model=config.model.path,
                                                    model_field="model.path")
        except BaseException:
            self.buffer.close()
            raise
        model = config.model
        try:
            check_engine(self.spec.weight_updates, model.engine)
            check_batches_in_flight(config.generation.batches_in_flight, self.spec.weight_updates)
        except BaseException:
            self.buffer.close()
            raise
        super().__init__("rollout", config.server)
        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)
        device = model.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.engine = make_engine(model.engine, model.path, device=device, dtype=model.dtype,
                                  seed=config.generation.seed,
                                  prefix_on_new_weights=config.generation.prefix_on_new_weights)
        metrics = RolloutMetrics(self.registry)
        metrics.policy_version.set(self.engine.policy_version)
        metrics.watch_batcher(lambda: getattr(self.engine, "started_batcher", None))
        self.reward = RewardClient(config.reward_service, retries=False)
        self.receiver = None
        if config.trainer is not None:
            from zerobubble.common.clients.trainer import TrainerClient
            from zerobubble.rollout.weight_receiver import WeightReceiver

            self.receiver = WeightReceiver(TrainerClient(config.trainer), config.worker_id, device=device,
                                           registry=self.registry, max_backoff_s=config.backoff_max_seconds)
        # The worker and its evaluator build prompts alike: the run spec's verifier routing and system prompts.
        player = make_player(self.engine.tokenizer, self.spec, system_prompt=config.reward.system_prompt,
                             environment=config.environment)
        evaluator = None
        if config.eval.datasets:
            evaluator = Evaluator(config.eval, player=player, reward=self.reward, metrics=metrics,
                                  max_new_tokens=self.spec.max_new_tokens, stop=tuple(config.generation.stop),
                                  seed=config.generation.seed)
        self.worker = RolloutWorker(config, self.spec, self.engine, self.buffer, self.reward, player=player,
                                    metrics=metrics, receiver=self.receiver, evaluator=evaluator)
        self.generate_calls = GenerateCalls(self.worker, config.generate_limits(self.spec))
        self.add(rollout_pb2_grpc.add_RolloutServiceServicer_to_server,
                 RolloutServicer(self.worker, self.generate_calls, model.engine), "zerobubble.v1.RolloutService")
        self.openai = None
        if config.openai.enabled:
            from zerobubble.rollout.openai_endpoint import OpenAIEndpoint

            self.openai = OpenAIEndpoint(config.openai, self.worker, self.spec.max_new_tokens,
                                         config.server.bearer_token())
        self._worker_thread = threading.Thread(target=self._run_worker, name="rollout-worker", daemon=True)

    def _run_worker(self) -> None:
        self.worker.run()
        if self.worker.error is not None:
            self.exit(1, f"the worker loop failed: {self.worker.error!r}")

    @property
    def endpoints(self) -> dict[str, str]:
        """What else of this service users reach, for its address line: the OpenAI endpoint's URL, when it has one."""
        if self.openai is None:
            return {}
        host = self.openai.config.listen.rsplit(":", 1)[0]
        return {"openai_url": f"http://{'127.0.0.1' if host == '0.0.0.0' else host}:{self.openai.port}/v1"}

    def start(self) -> RolloutHost:
        super().start()
        if self.receiver is not None:
            self.receiver.start()
        self._worker_thread.start()
        if self.openai is not None:
            self.openai.start()
            log.info("the OpenAI-compatible endpoint listens on port %d", self.openai.port)
        return self

    def stop(self, grace: float | None = None) -> None:
        """Within the grace: the server's calls end and the batches already playing finish and are pushed; then
        the worker gives up what is left (its leases expire back to the queue)."""
        deadline = time.monotonic() + (self.config.grace_seconds if grace is None else grace)
        self.worker.stop()
        if self.openai is not None:
            self.openai.stop()
        super().stop(grace)
        self._worker_thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self.worker.abandon()
        if self._worker_thread.is_alive():
            self._worker_thread.join(timeout=60)
        if self.receiver is not None:
            self.receiver.close()
        self.engine.close()
        self.buffer.close()
        self.reward.close()


def build(config: RolloutServiceConfig) -> RolloutHost:
    """A rollout worker with its engine loaded, not yet started (call `start()`)."""
    return RolloutHost(config)
