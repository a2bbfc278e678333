"""The training loop: pull experience, update the policy, publish the new weights, checkpoint, commit.

One step: pull `groups_per_step` groups for this data-parallel rank, collate, update (PolicyUpdate), bump
the policy version, hand the weights to the broadcaster (which sends them while the next step trains),
tell the buffer the new version, write the step's figures, among them where the step's time went (waiting
for its groups, collating, updating, publishing). With `batch.prefetch` the next step's groups are pulled on
a thread of their own while a step trains, once the buffer counts staleness from the weights that will train
them; the loop waits only for what has not arrived by the end of the step. Every `interval_steps` a checkpoint is
written and the buffer told that everything delivered so far is consumed (Commit).

What is committed is what was trained (or refused as unusable): groups pulled for a step that never
trains (the end of the data, a stop) are not, so a resumed run gets them again. With several data-parallel
ranks each pulls its share; they agree before each step that every one has it, and rank 0 records the step
(every rank's figures and groups) and commits the newest delivery any rank trained.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from transformers import AutoConfig

from zerobubble.common.clients.buffer import BufferClient, PullResult
from zerobubble.common.errors import Unavailable
from zerobubble.common.persistence import Stopped, until_done
from zerobubble.common.version import next_version, staleness, token_staleness
from zerobubble.trainer.checkpoints import Checkpoints, TrainerState
from zerobubble.trainer.collate import ExperienceBatch, collate, unusable
from zerobubble.trainer.config import TrainerServiceConfig
from zerobubble.trainer.figures import combine_ranks
from zerobubble.trainer.lora import adapter_weights
from zerobubble.trainer.metrics import TrainerMetrics
from zerobubble.trainer.strategies.base import Strategy
from zerobubble.trainer.tracking import Tracker, add_counts, episode_endings
from zerobubble.trainer.update import PolicyUpdate
from zerobubble.v1 import buffer_pb2, common_pb2

log = logging.getLogger(__name__)
PULL_BACKOFF_MAX_SECONDS = 2.0


def experience_figures(batch: ExperienceBatch, policy_version: int) -> dict[str, float]:
    """What the step trained on: accuracy, lengths, truncation, and how stale the samples were."""
    lengths = batch.response_lengths.float()
    behind = staleness(batch.versions, policy_version).float()
    tokens_behind = token_staleness(batch.token_versions, policy_version).float()
    return {
        "answer_accuracy": float(batch.answer_ok.float().mean()),
        "format_accuracy": float(batch.format_ok.float().mean()),
        "response_length_mean": float(lengths.mean()),
        "response_length_max": float(lengths.max()),
        "truncation_rate": float(batch.truncated.float().mean()),
        "staleness_mean": float(behind.mean()),
        "staleness_max": float(behind.max()),
        "staleness_token_mean": float((tokens_behind * batch.response_mask).sum() / batch.response_mask.sum()),
        "samples": float(batch.size),
        "tokens": float(batch.sequence_lengths.sum()),
        # Of multi-turn episodes (single-turn samples count one turn, no tool call).
        "turns_mean": float(batch.turns.mean()),
        "tool_calls_mean": float(batch.tool_calls.mean()),
    }


def group_name(group: common_pb2.ExperienceGroup) -> str:
    """A group's identity in metrics.jsonl: its prompt and the epoch it was generated for."""
    return f"{group.prompt.prompt_id}@{group.prompt.epoch}"


class TrainingLoop:
    def __init__(self, config: TrainerServiceConfig, strategy: Strategy, update: PolicyUpdate,
                 buffer: BufferClient, *, pad_id: int, metrics: TrainerMetrics, broadcaster=None):
        self.config = config
        self.strategy = strategy
        self.update = update
        self.buffer = buffer
        self.pad_id = pad_id
        self.metrics = metrics
        self.broadcaster = broadcaster
        self.step = 0
        self.delivered = 0        # the newest buffer delivery this rank has trained on
        # Ids at or above this would index past the embedding (an IndexError mid-step).
        self.vocab_size = AutoConfig.from_pretrained(config.model).get_text_config().vocab_size
        self.last_checkpoint = ""
        self.last_checkpoint_step = -1
        self.checkpoints = Checkpoints(config.run_dir / "checkpoints", keep=config.checkpoint.keep)
        self.stopping = threading.Event()
        self.lock = threading.Lock()   # checkpoints from the RPC and from the loop never interleave
        self._requests: queue.Queue[tuple[str, Future]] = queue.Queue()
        # Set by a checkpoint request and by a pull that is done: what the loop waits on while it waits for data.
        self._wake = threading.Event()
        self.finished = threading.Event()
        self.metrics_path = config.run_dir / "metrics.jsonl"
        self.idle_seconds = 0.0
        self.weight_bytes = 0
        self.started = time.monotonic()
        self.tracker = Tracker(config, active=strategy.rank == 0)

    @property
    def policy_version(self) -> int:
        """The version of the weights: one per training step, however many optimizer updates its mini-batches
        make (services/common/version.py), so the step count is the version."""
        return self.step

    @property
    def groups_per_rank(self) -> int:
        return self.config.batch.groups_per_rank(self.strategy.world_size)

    def resume(self) -> None:
        """Continue from the newest checkpoint: weights, optimizer, RNG, step; the buffer re-delivers what
        was delivered after the checkpoint's commit."""
        state = self.checkpoints.load(self.strategy)
        if state is None:
            log.info("no checkpoint in %s: starting from the model", self.checkpoints.directory)
            if self.strategy.rank == 0:
                # A trainer that died before its first checkpoint took deliveries with it: they come again.
                self.buffer.commit(0, resume=True)
            return
        self.step = state.step
        self.delivered = max(0, state.buffer_delivery)
        self.last_checkpoint, self.last_checkpoint_step = str(self.checkpoints.latest()), state.step
        if self.strategy.rank == 0:
            self.buffer.commit(self.delivered, resume=True)
            self.buffer.set_policy_version(self.policy_version)
        log.info("resumed from %s at step %d (policy version %d)", self.last_checkpoint, self.step,
                 self.policy_version)

    def run(self) -> None:
        """Train until the end of the data, max_steps, or stop()."""
        try:
            self._run()
        finally:
            self.tracker.close()
            self.finished.set()
            self._serve_requests()

    def _run(self) -> None:
        if self.strategy.rank == 0:
            self.buffer.set_policy_version(self.policy_version)
        if self.config.weight_sync is not None:
            self._publish()
        max_steps = self.config.max_steps
        upcoming: Future | None = None
        while max_steps is None or self.step < max_steps:
            # A stopping rank pulls nothing; the ranks agree before the step, as one rank training alone would
            # wait in the step's collectives for ever.
            waited = time.monotonic()
            groups, last_delivery = self._await(upcoming or self._prefetch())
            waited = time.monotonic() - waited
            self.idle_seconds += waited
            if not self._every_rank_has(groups):
                break
            if self.strategy.rank == 0:
                # Groups pushed from now on are consumed by the next version: staleness counts from it,
                # so a strictly on-policy worker waits for the new weights instead of generating for a step
                # already pulled (whose groups the buffer would then drop as stale).
                self.buffer.set_policy_version(next_version(self.policy_version))
            # Every rank is past this step's pulls (they agreed above), so the next step's deliveries all come
            # after this one's, which the commit watermark relies on.
            another = max_steps is None or self.step + 1 < max_steps
            upcoming = self._prefetch() if self.config.batch.prefetch and another else None
            self._train(groups, waited)
            self.delivered = max(self.delivered, last_delivery)
            if self.step % self.config.checkpoint.interval_steps == 0:
                self.save_checkpoint()
            self._serve_requests()
        if self.config.checkpoint.at_end and self.step and self.last_checkpoint_step != self.step:
            self.save_checkpoint()
        if self.strategy.rank == 0 and not self.stopping.is_set():
            # The run's training is over: workers stop making groups that only a later run would drop as stale.
            self.buffer.set_policy_version(self.policy_version, training_finished=True)
        if self.broadcaster is not None and not self.stopping.is_set():
            # At the end of the data the last weights reach the workers before the trainer goes (their evals
            # use them); when stopped, the workers are going too and would only hold the exit up.
            self.broadcaster.wait_synced(self.policy_version, timeout=self.config.weight_sync.member_timeout_s)

    def stop(self) -> None:
        self.stopping.set()

    def _every_rank_has(self, groups: list[common_pb2.ExperienceGroup]) -> bool:
        """Whether every data-parallel rank has its share of a step, so all train it, or none does: a short last
        step would weigh its few groups like a full one. Groups held for a step not trained are committed by no
        checkpoint, and come again on resume."""
        held = self.strategy.gather_objects(len(groups))
        if min(held) == self.groups_per_rank:
            return True
        if sum(held) and self.strategy.rank == 0:
            log.info("end of the data: %d groups left over, fewer than a step's %d", sum(held),
                     self.config.batch.groups_per_step)
        return False

    def _prefetch(self) -> Future:
        """The next step's pull, on a thread of its own; the loop serves checkpoint requests meanwhile."""
        pulled: Future = Future()
        pulled.set_running_or_notify_cancel()
        pulled.add_done_callback(lambda _: self._wake.set())

        def pull() -> None:
            try:
                pulled.set_result(self._pull())
            except BaseException as exc:
                pulled.set_exception(exc)

        threading.Thread(target=pull, name="prefetch", daemon=True).start()
        return pulled

    def _await(self, pulled: Future) -> tuple[list[common_pb2.ExperienceGroup], int]:
        """The pulled groups. Waiting for data is a safe point, so SaveCheckpoint answers at once rather than after
        a pull's wait: what a checkpoint covers stops at what was trained, so groups held for the coming step are
        delivered again on resume."""
        while True:
            # Cleared before serving: a request or a pull that comes meanwhile ends the wait below at once.
            self._wake.clear()
            self._serve_requests(delivery=self.delivered)
            if pulled.done():
                return pulled.result()
            self._wake.wait()

    def _pull(self) -> tuple[list[common_pb2.ExperienceGroup], int]:
        """This rank's groups of the next step and the newest delivery among them (and those refused); fewer at
        the end of the data or when stopping."""
        wanted, groups, last_delivery = self.groups_per_rank, [], 0
        while len(groups) < wanted and not self.stopping.is_set():
            try:
                result = self._pull_once(wanted - len(groups))
            except Stopped:
                break
            for pulled in result.groups:
                if not self._refused(pulled):
                    groups.append(pulled.group)
            last_delivery = max(last_delivery, result.last_delivery)
            if result.end_of_data:
                break
        return groups, last_delivery

    def _refused(self, pulled: buffer_pb2.PulledGroup) -> bool:
        """A group the step must not train on (non-finite values, ids outside the vocabulary) is skipped and
        counted, not stepped on: one such group would make the step NaN or crash it."""
        problem = unusable(pulled.group, self.vocab_size)
        if problem:
            self.metrics.groups_refused.inc()
            log.error("refusing group of prompt %s (delivery %d): %s", pulled.group.prompt.prompt_id,
                      pulled.delivery, problem)
        return bool(problem)

    def _pull_once(self, count: int) -> PullResult:
        """One PullBatch, retried while the buffer is down or restarting (a stream is not retried by the
        client, and a buffer restart must not end the run); then its acknowledgement, retried until the buffer
        answers it, as only its answer says which groups are this trainer's: giving up on a lost reply would
        drop groups the buffer counts as received, and keeping them unanswered would train them twice. Both give up
        after the buffer client's retry_seconds: the training fails, and a restart resumes from the checkpoint,
        before which every group is delivered again."""
        retry = {"stop": self.stopping, "max_backoff": PULL_BACKOFF_MAX_SECONDS,
                 "give_up_seconds": self.config.buffer.retry_seconds}
        received = until_done(
            lambda: self.buffer.receive(self.strategy.rank, self.strategy.world_size, count,
                                        wait_seconds=self.config.batch.pull_wait_seconds),
            what="pull", **retry)
        if not received.groups:
            return received
        # Retried here alone, not inside the client as well.
        refused = until_done(lambda: self.buffer.acknowledge(received.deliveries, rank=received.rank,
                                                                      retry=False), what="acknowledge",
                             **retry)
        return received.keeping(refused)

    def _train(self, groups: list[common_pb2.ExperienceGroup], waited: float) -> None:
        """One step on `groups`, which the loop waited `waited` seconds for."""
        started = time.monotonic()
        batch = collate(groups, self.pad_id)
        collated = time.monotonic()
        figures = self.update(batch, self.policy_version)
        updated = time.monotonic()
        figures.update(experience_figures(batch, self.policy_version))
        # Rank 0 records the step: every rank's share of it, and which groups it trained.
        shares = self.strategy.gather_objects((figures, [group_name(g) for g in groups], episode_endings(groups)))
        figures = combine_ranks([share for share, _, _ in shares])
        trained = [name for _, names, _ in shares for name in names]
        # How the step's episodes ended (counts by failure reason), over every rank's groups.
        figures.update(add_counts([endings for _, _, endings in shares]))
        self.step += 1
        published = time.monotonic()
        if self.config.weight_sync is not None:
            self._publish()
        seconds = time.monotonic() - started
        figures["pull_wait_seconds"] = waited
        figures["collate_seconds"] = collated - started
        figures["update_seconds"] = updated - collated
        figures["publish_seconds"] = time.monotonic() - published
        figures["step_seconds"] = seconds
        figures["tokens_per_second"] = figures["tokens"] / seconds if seconds > 0 else 0.0
        wall = time.monotonic() - self.started
        figures["trainer_idle_fraction"] = self.idle_seconds / wall if wall > 0 else 0.0
        if self.broadcaster is not None:
            seconds = self.broadcaster.status()["last_sync_seconds"]
            figures["weight_sync_seconds"] = seconds
            figures["weight_sync_gbps"] = self.weight_bytes / seconds / 1e9 if seconds > 0 else 0.0
        self._record(figures, groups, trained,
                     lambda: self.update.sample_advantages(batch))

    def _publish(self) -> None:
        """Every rank takes part in gathering the full weights (with lora: the adapters only, the base never
        changes); rank 0 hands them to the broadcaster."""
        if self.config.lora is not None:
            weights = list(adapter_weights(self.strategy.model))
        else:
            weights = list(self.strategy.full_state_dict())
        self.weight_bytes = sum(t.numel() * t.element_size() for _, t in weights)
        if self.broadcaster is not None:
            self.broadcaster.publish(weights, self.policy_version)

    def _record(self, figures: dict[str, float], groups: list[common_pb2.ExperienceGroup],
                trained: list[str], advantages: Callable[[], list[float]]) -> None:
        if self.strategy.rank != 0:
            return
        row = {"step": self.step, "policy_version": self.policy_version, "time": time.time(), **figures,
               "groups": trained}
        self.metrics.observe_step(row)
        self.metrics_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.metrics_path, "a", encoding="utf-8") as out:
            out.write(json.dumps(row) + "\n")
        self.tracker.log_step(row, groups, advantages)
        log.info("step %d: reward %.3f accuracy %.3f staleness %.2f loss %.4f", self.step,
                 figures["reward_mean"], figures["answer_accuracy"], figures["staleness_mean"], figures["loss"])

    def request_checkpoint(self, tag: str, timeout: float) -> tuple[str, int]:
        """For the SaveCheckpoint RPC: saving is collective, so the loop does it at its next safe point (between
        steps, or while it waits for data)."""
        request: Future = Future()
        self._requests.put((tag, request))
        self._wake.set()
        if self.finished.is_set():
            self._serve_requests()
        try:
            return request.result(timeout)
        except TimeoutError:
            if request.cancel():
                raise Unavailable(f"the training loop reached no point to save at within {timeout:.0f} s; "
                                  "nothing was saved") from None
            return request.result()

    def _serve_requests(self, delivery: int | None = None) -> None:
        while True:
            try:
                tag, request = self._requests.get_nowait()
            except queue.Empty:
                return
            if not request.set_running_or_notify_cancel():
                continue
            try:
                request.set_result(self.save_checkpoint(tag, delivery))
            except Exception as exc:
                request.set_exception(exc)

    def save_checkpoint(self, tag: str = "", delivery: int | None = None) -> tuple[str, int]:
        """Write a checkpoint, then commit to the buffer everything delivered before it (up to `delivery`, when
        given)."""
        delivery = self.delivered if delivery is None else delivery
        # Commit is one watermark over the buffer's delivery numbers: the newest delivery any rank trained covers
        # every rank's, as a step's deliveries all come before the next step's (its collectives wait for every
        # rank's pull). One rank commits it, once per checkpoint, so the checkpoint and the buffer agree.
        delivery = max(self.strategy.gather_objects(delivery))
        with self.lock:
            state = TrainerState(step=self.step, policy_version=self.policy_version,
                                 buffer_delivery=delivery, extra={"tag": tag})
            directory = self.checkpoints.save(self.strategy, state)
            self.last_checkpoint, self.last_checkpoint_step = str(directory), self.step
            if self.strategy.rank == 0:
                self.buffer.commit(delivery)
            return str(directory), self.step


def write_config(config: TrainerServiceConfig, run_dir: Path) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "trainer-config.json").write_text(config.model_dump_json(indent=2))
