"""The rollout worker loop: lease prompts, generate, score, push, complete the lease.

Scoring and pushing a batch run on a second thread while the next batch generates, so the engine does
not wait on the reward service. New weights are applied at the safe point before each lease, and within a batch as
the run's weight_updates allow. Episodes played in loops over a continuously batching engine may overlap batches
(generation.batches_in_flight): the next batch is leased and started while the last one's slowest episodes play.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Hashable
from contextlib import nullcontext
from dataclasses import dataclass

import grpc

from zerobubble.common.clients.buffer import BufferClient
from zerobubble.common.clients.reward import RewardClient
from zerobubble.common.not_stored import not_stored_label
from zerobubble.common.persistence import Stopped, until_done
from zerobubble.common.run_spec import RunSpec
from zerobubble.common.trajectory import Trajectory
from zerobubble.common.version import oldest_fresh_version
from zerobubble.rollout.batches_in_flight import BatchesInFlight
from zerobubble.rollout.config import RolloutServiceConfig
from zerobubble.rollout.engine import Engine, Sample, SamplingSettings
from zerobubble.rollout.episodes.failures import FailureWatch
from zerobubble.rollout.episodes.play import Player
from zerobubble.rollout.experience import experience_group
from zerobubble.rollout.in_flight import WeightUpdatePolicy
from zerobubble.rollout.metrics import RolloutMetrics
from zerobubble.v1 import buffer_pb2, common_pb2

log = logging.getLogger(__name__)


@dataclass
class GeneratedBatch:
    lease: buffer_pb2.LeaseReply
    prompt_ids: list[list[int]]
    samples: list[list[Trajectory]]


class RolloutWorker:
    def __init__(self, config: RolloutServiceConfig, spec: RunSpec, engine: Engine, buffer: BufferClient,
                 reward: RewardClient, *, player: Player, metrics: RolloutMetrics, receiver=None,
                 evaluator=None):
        self.config = config
        self.spec = spec
        self.engine = engine
        self.buffer = buffer
        self.reward = reward
        self.metrics = metrics
        self.receiver = receiver
        self.evaluator = evaluator
        self.player = player
        self.prompts = player.prompts.default
        # One engine, shared with the Generate RPC: whoever holds this lock is generating or loading weights.
        self.engine_lock = threading.Lock()
        self.stopping = threading.Event()     # no more leases
        self.abandoning = threading.Event()   # nor the scoring and pushing of batches already played
        self.running = threading.Event()
        self.running.set()
        self.finished = threading.Event()
        self.drained = threading.Event()
        self.error: BaseException | None = None
        self.groups_pushed = 0
        self.training_finished = False
        self.tokens_per_second = 0.0
        # Sequence numbers start again with every process, and a restarted worker keeps its worker_id: the
        # incarnation keeps its groups from passing for retries of the ones its previous life pushed.
        self.incarnation = uuid.uuid4().hex
        self._sequence = 0
        self._batches = 0
        self._scoring: queue.Queue[GeneratedBatch | None] = queue.Queue(maxsize=1)
        # Overlapping batches need a batch's play not to hold the engine: only loops over a continuous batcher.
        overlap = config.generation.batches_in_flight if player.plays_loops(engine) else 1
        self.batches: BatchesInFlight[tuple[buffer_pb2.LeaseReply, SamplingSettings]] = BatchesInFlight(
            overlap, self._generate, self._scoring.put)
        self.weight_updates = WeightUpdatePolicy(spec.weight_updates, engine, receiver, self._loaded)
        self.failures = FailureWatch(config.worker_id, spec.episodes.max_failed_batches, config.failure_log)

    # -- control ---------------------------------------------------------------------------------
    def pause(self) -> None:
        self.running.clear()

    def resume(self) -> None:
        self.running.set()

    def stop(self) -> None:
        """Lease no more. Batches already playing play to their end and are scored and pushed, their leases
        completed, until abandon(): work done is not thrown away because a stop came while it was under way."""
        self.stopping.set()
        self.running.set()

    def abandon(self) -> None:
        """Stop, and give up scoring and pushing too (the stop's grace is over): an unpushed batch's prompts go
        back to the queue when its lease expires."""
        self.abandoning.set()
        self.stop()

    @property
    def paused(self) -> bool:
        return not self.running.is_set()

    # -- the loop --------------------------------------------------------------------------------
    def run(self) -> None:
        """Work until stop() is called. After the end of the data the worker idles at its safe point, still
        loading new weights and running due evaluations, since the trainer goes on with the last groups."""
        finisher = threading.Thread(target=self._finish_batches, name="rollout-finisher", daemon=True)
        finisher.start()
        try:
            self._generate_batches()
        except Stopped:
            pass
        except BaseException as exc:
            self.error = exc
            log.exception("rollout worker failed")
        finally:
            self.batches.drain()
            self._scoring.put(None)
            finisher.join()
            self.finished.set()

    def _generate_batches(self) -> None:
        if self.config.openai.exclusive:
            # Groups come from the OpenAI endpoint's sessions; the loop only keeps the weights fresh.
            while not self.stopping.wait(self.config.lease_wait_seconds):
                self.safe_point()
            return
        while self.batches.take_slot(self.stopping):
            # A batch that failed to play, or to be scored and pushed, stops the worker before its next lease.
            if self.batches.error is not None:
                raise self.batches.error
            if self.error is not None:
                raise self.error
            started_batch = False
            try:
                started_batch = self._lease_and_start()
            finally:
                if not started_batch:
                    self.batches.give_back()
            if self.drained.is_set():
                while not self.stopping.wait(self.config.lease_wait_seconds):
                    self.safe_point()
                return

    def _lease_and_start(self) -> bool:
        """Lease the next batch and start playing it; False when nothing was started."""
        self.safe_point()
        started = time.monotonic()
        lease = self.persist(lambda: self.buffer.lease(self.config.worker_id,
                                                        self.config.generation.prompts_per_batch),
                              "lease", self.buffer, stop=self.stopping)
        self.metrics.buffer_wait.inc(time.monotonic() - started)
        if lease.end_of_data:
            log.info("the buffer has no more prompts: generation is done")
            self.batches.drain()
            self.drained.set()
            return False
        if lease.training_finished != self.training_finished:
            self.training_finished = lease.training_finished
            log.info("training has finished: this worker generates nothing more until a trainer trains again"
                     if lease.training_finished else "training goes on: generating again")
        if not lease.prompts:
            self.stopping.wait(self.config.lease_wait_seconds)
            return False
        self._catch_up(lease.policy_version)
        self.batches.start((lease, self._sampling(lease)))
        return True

    def safe_point(self) -> None:
        """Between generate calls: wait while paused, load new weights, run a due evaluation."""
        while not self.running.wait(0.2):
            pass
        if self.receiver is not None:
            with self.weight_updates.loading(), self.engine_lock:
                if self.receiver.apply_to(self.engine):
                    self._loaded()
        if self.evaluator is not None and self.evaluator.due(self.engine.policy_version):
            # An evaluation scores one version: no batch playing may take weights meanwhile.
            self.batches.drain()
            with self.engine_lock, self.weight_updates.one_version():
                self.evaluator.maybe_run(self.engine)

    def _loaded(self) -> None:
        self.metrics.policy_version.set(self.engine.policy_version)
        log.info("loaded weights of policy version %d", self.engine.policy_version)

    def _catch_up(self, consuming_version: int) -> None:
        """Wait until the engine's weights are fresh enough for the run's staleness bound."""
        if self.spec.max_staleness is None or self.receiver is None:
            return
        wanted = oldest_fresh_version(consuming_version, self.spec.max_staleness)
        while self.engine.policy_version < wanted and not self.stopping.is_set():
            self.receiver.wait_for(wanted, timeout=1.0)
            with self.engine_lock:
                self.receiver.apply_to(self.engine)
        self.metrics.policy_version.set(self.engine.policy_version)

    def _sampling(self, lease: buffer_pb2.LeaseReply) -> SamplingSettings:
        gen, spec = self.config.generation, self.spec
        progress = lease.epoch_finished / lease.epoch_size if lease.epoch_size else 0.0
        temperature = spec.sampling.temperature_at(lease.prompts[0].epoch, progress)
        seed = gen.seed + self._batches
        self._batches += 1
        return SamplingSettings(
            n=spec.num_generations, temperature=temperature, top_p=gen.top_p, top_k=gen.top_k,
            max_new_tokens=spec.max_new_tokens, stop=tuple(gen.stop), seed=seed,
        )

    def _generate(self, leased: tuple[buffer_pb2.LeaseReply, SamplingSettings]) -> GeneratedBatch:
        lease, sampling = leased
        started = time.monotonic()
        # One batch at a time holds the engine while it plays; overlapping ones share it with the Generate RPC.
        with self.engine_lock if self.batches.limit == 1 else nullcontext():
            prompt_ids, samples = self.player.play(self.engine, list(lease.prompts), sampling,
                                                   at_turn=self.weight_updates.at_turn)
        seconds = time.monotonic() - started
        # Before the batch is trained on: a worker whose environments fail every episode stops here.
        self.failures.observe(samples)
        tokens = sum(len(s.response_ids) for group in samples for s in group)
        self.tokens_per_second = tokens / seconds if seconds > 0 else 0.0
        self.metrics.observe_batch(tokens=tokens, prompts=len(prompt_ids), seconds=seconds)
        return GeneratedBatch(lease, prompt_ids, samples)

    def _finish_batches(self) -> None:
        while (batch := self._scoring.get()) is not None:
            if self.error is not None:
                continue
            try:
                self._finish(batch)
            except Stopped:
                self.stopping.set()
            except BaseException as exc:
                self.error = exc
                log.exception("scoring or pushing a batch failed")
                self.stopping.set()

    def _finish(self, batch: GeneratedBatch) -> None:
        decode = self.engine.tokenizer.decode
        started = time.monotonic()
        results = self.player.score(
            lambda requests: self.persist(lambda: self.reward.score_batch(requests), "score", self.reward),
            batch.lease.prompts, batch.samples, partial_credit=self.config.reward.partial_credit,
            prompt_texts=[decode(ids) for ids in batch.prompt_ids])
        self.metrics.reward_wait.inc(time.monotonic() - started)
        groups = []
        for prompt, ids, samples, scores in zip(batch.lease.prompts, batch.prompt_ids, batch.samples, results,
                                                strict=True):
            self.metrics.observe_episodes(samples)
            self._sequence += 1
            groups.append(experience_group(
                prompt, ids, samples, scores, producer_id=self.config.worker_id,
                producer_incarnation=self.incarnation, sequence=self._sequence, lease_id=batch.lease.lease_id,
            ))
        started = time.monotonic()
        self.push_groups(groups)
        self.persist(lambda: self.buffer.complete(batch.lease.lease_id), "complete lease", self.buffer)
        self.metrics.buffer_wait.inc(time.monotonic() - started)

    def push_groups(self, groups: list[common_pb2.ExperienceGroup]) -> None:
        """Push until every group is acknowledged; a broken stream resends the rest with the same
        sequence numbers, which the buffer stores once. A group refused for now (the buffer cannot write
        its log) is sent again after a pause."""
        pending = {g.sequence: g for g in groups}

        def attempt() -> int:
            deferred = 0
            for ack in self.buffer.push(list(pending.values())):
                if ack.code == grpc.StatusCode.UNAVAILABLE.value[0]:
                    deferred += 1
                    log.warning("the buffer cannot take group %s now: %s", ack.sequence, ack.error)
                    continue
                group = pending.pop(ack.sequence, None)
                if ack.code:
                    log.error("the buffer refused group %s of prompt %s: %s", ack.sequence,
                              group.prompt.prompt_id if group else "?", ack.error)
                elif ack.stored:
                    self.groups_pushed += 1
                    self.metrics.groups_pushed.inc()
                else:
                    self.metrics.groups_not_stored.labels(reason=not_stored_label(ack.not_stored)).inc()
            return deferred

        backoff = 0.1
        while pending:
            if self.persist(attempt, "push", self.buffer):
                if self.abandoning.wait(backoff):
                    raise Stopped("push")
                backoff = min(self.config.backoff_max_seconds, backoff * 2)

    def persist(self, call, what: str, peer, stop: threading.Event | None = None):
        """`call` to `peer` (a client), retried for as long as that client's retry_seconds allow, or until `stop`
        (by default: until the worker abandons its work)."""
        return until_done(call, what=what, stop=stop or self.abandoning, max_backoff=self.config.backoff_max_seconds,
                          give_up_seconds=peer.config.retry_seconds)

    # -- for the Generate RPC, the OpenAI endpoint and Status -------------------------------------
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingSettings) -> tuple[list[list[Sample]], int]:
        with self.engine_lock:
            return self.engine.generate(prompt_ids, sampling), self.engine.policy_version

    def complete(self, prompt_ids: list[int], sampling: SamplingSettings, key: Hashable) -> tuple[Sample, list[int]]:
        """One response to one prompt, with the policy version that drew each of its tokens. Through the engine's
        continuous batcher where it has one: concurrent calls share its decode steps instead of queueing for the
        engine lock, and a call under the `key` of an earlier one reuses that call's cache for the prefix they
        share (an agent's next turn). Weights loaded meanwhile reach the tokens after the load, each token
        carrying its version, only where the run takes weights in flight (otherwise a load waits for the call).
        Otherwise one generate call under the engine lock, on one version."""
        if hasattr(self.engine, "continuous"):
            with self.weight_updates.call():
                sample = self.engine.continuous().submit(prompt_ids, sampling, key=key).result()
            return sample, [int(v) for v in sample.versions]
        samples, version = self.generate([prompt_ids], sampling)
        return samples[0][0], [version] * len(samples[0][0].token_ids)

    def forget(self, key: Hashable) -> None:
        """`key` will call complete() no more: the batcher may free the cache it keeps for it."""
        batcher = getattr(self.engine, "started_batcher", None)
        if batcher is not None:
            batcher.forget(key)
