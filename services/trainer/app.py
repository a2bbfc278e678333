"""Assembles the trainer: strategy, reference model, weight broadcaster, training loop, servicer, host.

Under a launcher with WORLD_SIZE > 1 (torchrun) every rank trains its share; rank 0 also serves the
RPCs on the configured address, hosts the weight-sync store and talks to the buffer for the group.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable

import grpc
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from zerobubble.common.clients.buffer import BufferClient
from zerobubble.common.clients.teacher import TeacherClient
from zerobubble.common.errors import InvalidInput, Unavailable
from zerobubble.common.server import ServiceHost
from zerobubble.common.tokenizer_fingerprint import tokenizer_fingerprint, tokenizer_name
from zerobubble.trainer.broadcaster import WeightBroadcaster
from zerobubble.trainer.config import TrainerServiceConfig
from zerobubble.trainer.loop import TrainingLoop, write_config
from zerobubble.trainer.metrics import TrainerMetrics
from zerobubble.trainer.servicer import FINISHED, SERVICE, TrainerServicer
from zerobubble.trainer.strategies import make_strategy
from zerobubble.trainer.teacher_scores import TeacherContext, TeacherScores
from zerobubble.trainer.update import PolicyUpdate, UpdateSettings
from zerobubble.v1 import trainer_pb2_grpc

log = logging.getLogger(__name__)

CONFIG_SCHEMA = TrainerServiceConfig
MAX_TAG_CHARS = 256
# A step in progress is the longest the loop can take to reach a safe point.
CHECKPOINT_WAIT_S = 600.0


def reference_model(config: TrainerServiceConfig, device: torch.device, dtype: torch.dtype):
    """The frozen starting policy for the KL term; loaded only when beta > 0."""
    model = AutoModelForCausalLM.from_pretrained(config.model, dtype=dtype).to(device).eval()
    model.requires_grad_(False)
    return model


class TrainerControl:
    """What the Status and SaveCheckpoint RPCs see of the loop."""

    def __init__(self, loop: TrainingLoop, state: Callable[[], str]):
        self.loop = loop
        self.state = state

    def status(self) -> dict:
        return {"step": self.loop.step, "policy_version": self.loop.policy_version,
                "last_checkpoint": self.loop.last_checkpoint, "state": self.state()}

    def save_checkpoint(self, tag: str) -> tuple[str, int]:
        """The checkpoint taken at the loop's next safe point: at once while it waits for data, else once the step
        in progress is trained."""
        if len(tag) > MAX_TAG_CHARS:
            raise InvalidInput(f"{len(tag)} characters are over the limit of {MAX_TAG_CHARS}", field="tag")
        if self.loop.strategy.world_size > 1:
            # Every rank must save together, and only this rank hears the call.
            raise Unavailable("SaveCheckpoint needs a single trainer process; with several, checkpoints follow "
                              "checkpoint.interval_steps")
        try:
            return self.loop.request_checkpoint(tag, timeout=CHECKPOINT_WAIT_S)
        except OSError as exc:
            raise Unavailable(f"the checkpoint could not be written: {exc}") from None
        except grpc.RpcError as exc:
            raise Unavailable(f"the checkpoint is written but the buffer did not take its commit "
                              f"({exc.code().name}); the next checkpoint commits") from None


class TrainerHost(ServiceHost):
    """Serves the trainer's RPCs and runs training on a thread; the process exits 0 when training is
    done, 1 if it failed, and 128 + the signal's number when a signal stopped it before the end (the shell's
    convention): a launcher then knows the run is not over."""

    def __init__(self, config: TrainerServiceConfig):
        # Before the model loads: a trainer that disagrees with the run must not train on its groups.
        self.buffer = BufferClient(config.buffer)
        try:
            self.spec = self.buffer.agreed_run_spec(config.expectations(), model=config.model, model_field="model")
        except BaseException:
            self.buffer.close()
            raise
        # Before the model loads too: a teacher whose ids mean other tokens is refused, naming both tokenizers.
        self.teacher = None
        self.teacher_routes: dict[str, TeacherClient] = {}
        try:
            tokenizer = AutoTokenizer.from_pretrained(config.model)
            fingerprint, name = tokenizer_fingerprint(tokenizer), tokenizer_name(tokenizer, config.model)
            if config.teacher is not None:
                self.teacher = TeacherClient(config.teacher, fingerprint, name, retries=False)
                self.teacher.connect(field="teacher")
            for source, route in config.teachers_by_data_source.items():
                self.teacher_routes[source] = TeacherClient(route, fingerprint, name, retries=False)
                self.teacher_routes[source].connect(field=f"teachers_by_data_source.{source}")
        except BaseException:
            self._close_clients()
            raise
        rank = int(os.environ.get("RANK", "0"))
        config.batch.groups_per_rank(int(os.environ.get("WORLD_SIZE", "1")))
        server = config.server if rank == 0 else config.server.model_copy(
            update={"listen": "127.0.0.1:0", "metrics_port": None})
        super().__init__("trainer", server)
        torch.manual_seed(config.seed + rank)
        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)
        self.trainer_config = config
        write_config(config, config.run_dir)
        self.strategy = make_strategy(config.training_strategy(), config.model, config.lora)
        algorithm = config.algorithm
        reference = None
        if algorithm.beta > 0:
            reference = reference_model(config, self.strategy.device, self.strategy.dtype)
        batch = config.batch
        settings = UpdateSettings(batch.mini_batches, batch.micro_batch_samples, self.spec.max_new_tokens,
                                  max_tokens_per_micro_batch=batch.max_tokens_per_micro_batch,
                                  logprob_chunk_tokens=batch.logprob_chunk_tokens, packing=batch.packing)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.broadcaster = None
        if config.weight_sync is not None and self.strategy.rank == 0:
            self.broadcaster = WeightBroadcaster(config.weight_sync, self.registry).start()
        self.teacher_scores = None
        if self.teacher is not None:
            context = TeacherContext(tokenizer, config.teacher_context) if config.teacher_context else None
            self.teacher_scores = TeacherScores(self.teacher, self.teacher_routes, context)
        # Published weights are copied while the next step's forward and backward run; its update waits for the
        # copy before it changes the live weights the copy reads.
        update = PolicyUpdate(self.strategy, algorithm, settings, reference,
                              before_step=self.broadcaster.wait_copied if self.broadcaster else lambda: None,
                              teacher=self.teacher_scores)
        self.loop = TrainingLoop(config, self.strategy, update, self.buffer, pad_id=pad_id,
                                 metrics=TrainerMetrics(self.registry), broadcaster=self.broadcaster)
        self.add(trainer_pb2_grpc.add_TrainerServiceServicer_to_server,
                 TrainerServicer(self.broadcaster, TrainerControl(self.loop, lambda: self.state)), SERVICE.full_name)
        self.state = "training"
        self._thread = threading.Thread(target=self._train, name="trainer-loop", daemon=True)

    def _train(self) -> None:
        try:
            if self.trainer_config.resume:
                self.loop.resume()
            self.loop.run()
        except BaseException as exc:
            log.exception("training failed")
            self.state = f"failed: {exc!r}"
            self.exit(1, f"training failed: {exc!r}")
            return
        where = f"at step {self.loop.step} (policy version {self.loop.policy_version})"
        if self.loop.stopping.is_set():
            # Only a signal (or stop() from a caller that owns this host) stops the loop before its end.
            reason = signal.Signals(self.stopped_by).name if self.stopped_by else "a stop request"
            self.state = f"stopped by {reason}"
            log.warning("training stopped by %s %s, before the end of the run", reason, where)
            return
        self.state = FINISHED
        self.exit(0, f"training finished {where}")

    def run_until_signal(self) -> int:
        code = super().run_until_signal()
        if code == 0 and self.state != FINISHED and self.stopped_by:
            return 128 + self.stopped_by
        return code

    def start(self) -> TrainerHost:
        super().start()
        self._thread.start()
        return self

    def stop(self, grace: float | None = None) -> None:
        """Within the grace: the server's calls end and the loop finishes its step (and last checkpoint),
        side by side; a loop still busy at the end of the grace is left to die with the process."""
        deadline = time.monotonic() + (self.config.grace_seconds if grace is None else grace)
        self.loop.stop()
        if self.teacher_scores is not None:
            # A step waiting for a teacher that is down ends now, untrained (its groups come back on resume).
            self.teacher_scores.close()
        if self.broadcaster is not None:
            # Watch streams last as long as the broadcaster: closed first, they end now, not at the grace.
            self.broadcaster.close()
        super().stop(grace)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=max(0.0, deadline - time.monotonic()))
            if self._thread.is_alive():
                # Closing what it uses would only make it fail; it holds no lock the exit needs.
                log.warning("the training loop did not finish within the grace; it ends with the process")
                return
        try:
            self.strategy.close()
        except RuntimeError as exc:
            # A data-parallel peer died (its agent then stops this rank): there is no group left to close.
            log.warning("the data-parallel group did not close: %s", str(exc).splitlines()[0])
        self._close_clients()

    def _close_clients(self) -> None:
        self.buffer.close()
        for teacher in [self.teacher, *self.teacher_routes.values()]:
            if teacher is not None:
                teacher.close()


def build(config: TrainerServiceConfig) -> TrainerHost:
    """The trainer with its model loaded, not yet started (call `start()`)."""
    return TrainerHost(config)
