"""Worker side of the weight sync: a background thread joins the trainer's broadcast group, follows its
announcements, forms each new group epoch and receives every version into bucket buffers that are
reused across versions. The engine takes a complete version at its next safe point (`apply_to`).

If the trainer goes away, or drops this worker, the thread joins again with backoff; a rejoined
worker gets the next full broadcast. A trainer that says training has finished is asked again only every
`finished_pause_s` (a later trainer may train again), not at the pace of a restart.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

import grpc
import torch
from prometheus_client import CollectorRegistry, Counter, Histogram
from torch.distributed import TCPStore

from zerobubble.common.clients.trainer import TrainerClient
from zerobubble.common.sync_protocol import Machine, Member
from zerobubble.common.weight_sync import (
    ACK_FAILED,
    ACK_OK,
    GO,
    Manifest,
    arrived_key,
    broken_key,
    done_key,
    form_group,
    go_key,
    local_address_towards,
    retire_group,
    start_broadcast,
    wait_broadcast,
)
from zerobubble.v1 import trainer_pb2

log = logging.getLogger(__name__)
# A wrong or missing token, or a full group: the worker keeps trying, but the log must say why it gets no weights.
REFUSALS = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.RESOURCE_EXHAUSTED)
# What the trainer ends a watch and refuses a join with once training has finished (TrainerServicer), or when it
# broadcasts no weights at all: nothing a prompt retry changes.
NOT_SYNCING = grpc.StatusCode.FAILED_PRECONDITION


class WeightTaker(Protocol):
    """What `apply_to` needs of an engine (zerobubble.rollout.engine.Engine has it)."""

    policy_version: int

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None: ...


class ReceiverMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.loads = Counter("zerobubble_rollout_weight_loads", "weight versions loaded into the engine",
                             registry=registry)
        self.receive_seconds = Histogram(
            "zerobubble_rollout_weight_receive_seconds", "from an announcement to its last bucket received",
            registry=registry, buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.joins = Counter("zerobubble_rollout_weight_sync_joins", "JoinWeightSync calls made (first and again)",
                             registry=registry)


@dataclass(frozen=True)
class ReceiveTimes:
    """Wall-clock times of one version's receive, to set beside the trainer's (`last_sync_times`) on one host."""

    version: int
    announced: float  # the announcement arrived
    ready: float      # the group is formed and the buffers are posted for the broadcast
    received: float   # the last bucket is in
    acknowledging: float  # the acknowledgement is about to be written


class WeightReceiver:
    def __init__(self, trainer: TrainerClient, worker_id: str, device: str = "cpu", *,
                 registry: CollectorRegistry | None = None, first_backoff_s: float = 0.1, max_backoff_s: float = 5.0,
                 finished_pause_s: float = 60.0):
        self.trainer = trainer
        self.worker_id = worker_id
        self.device = device
        self.metrics = ReceiverMetrics(registry or CollectorRegistry())
        self.first_backoff_s = first_backoff_s
        self.max_backoff_s = max_backoff_s
        self.finished_pause_s = finished_pause_s
        # Whether the trainer said it syncs no weights (training has finished); until a join succeeds again.
        self.not_syncing = False
        self._closed = threading.Event()
        # Held while buckets are written and while an engine loads from them.
        self._buffers_lock = threading.Lock()
        self._changed = threading.Condition()
        self._manifest: Manifest | None = None
        self._buffers: list[torch.Tensor] = []
        self._views: list[tuple[str, torch.Tensor]] = []
        self._complete: int | None = None
        # Whether there is nothing to load: the engine has the last received weights, or the buffers are being
        # overwritten. Not "is the version newer": a trainer restarted from a checkpoint publishes lower versions
        # than the ones a worker already has, and they are the truth.
        self._loaded = True
        self._group = None
        self._buffer_device = torch.device("cpu")
        self._epoch: int | None = None
        self._call = None
        self._call_lock = threading.Lock()
        self.recent_times: deque[ReceiveTimes] = deque(maxlen=64)
        # This member's side of the protocol (services/common/sync_protocol.py).
        self.state = Machine(Member.JOINING)
        self._thread = threading.Thread(target=self._run, name=f"weights-{worker_id}", daemon=True)

    def start(self) -> WeightReceiver:
        self._thread.start()
        return self

    @property
    def latest_version(self) -> int | None:
        """The newest version fully received and not yet being overwritten; None before the first."""
        return self._complete

    @property
    def buffers(self) -> list[torch.Tensor]:
        return list(self._buffers)

    def wait_for(self, version: int, timeout: float) -> bool:
        """Wait until `version` or a newer one is complete."""
        with self._changed:
            return self._changed.wait_for(
                lambda: self._complete is not None and self._complete >= version, timeout)

    def apply_to(self, engine: WeightTaker) -> bool:
        """Load the last version received into `engine` unless it has it already. Never waits for a receive
        in progress (those bytes are half new): it then returns False; try later."""
        if not self._buffers_lock.acquire(blocking=False):
            return False
        try:
            if self._loaded:
                return False
            engine.load_weights(iter(self._views), self._complete)
            self._loaded = True
            self.metrics.loads.inc()
            return True
        finally:
            self._buffers_lock.release()

    def close(self) -> None:
        self._closed.set()
        with self._call_lock:
            if self._call is not None:
                self._call.cancel()
        self._thread.join(timeout=30)

    # -- the receiving thread --

    def _run(self) -> None:
        backoff = self.first_backoff_s
        while not self._closed.is_set():
            received_before = self._complete
            try:
                self._session()
            except grpc.RpcError as exc:
                if exc.code() == NOT_SYNCING:
                    if not self.not_syncing:
                        log.info("%s: %s; asking the trainer again every %.0f s", self.worker_id, exc.details(),
                                 self.finished_pause_s)
                    self.not_syncing = True
                elif exc.code() in REFUSALS:
                    log.warning("%s: the trainer refused the weight sync (%s: %s); trying again", self.worker_id,
                                exc.code().name, exc.details())
                elif not self._closed.is_set():
                    log.info("%s: trainer stream ended (%s); joining again", self.worker_id, exc.code())
            except Exception:
                log.exception("%s: weight sync session failed; joining again", self.worker_id)
            finally:
                self._leave_group()
                self.state.to(Member.JOINING)
            if self._complete != received_before:
                backoff = self.first_backoff_s
            if self.not_syncing:
                # Also once that trainer is gone: nothing trains until a trainer starts again.
                self._closed.wait(self.finished_pause_s)
                continue
            self._closed.wait(backoff * random.uniform(0.5, 1.0))
            backoff = min(self.max_backoff_s, backoff * 2)

    def _session(self) -> None:
        self.metrics.joins.inc()
        reply = self.trainer.join(self.worker_id, self.device, retry=False)
        self.not_syncing = False
        store = TCPStore(reply.store_host, reply.store_port, is_master=False, wait_for_workers=False,
                         timeout=timedelta(seconds=reply.member_timeout_seconds))
        address = local_address_towards(reply.store_host)
        with self._call_lock:
            if self._closed.is_set():
                return
            self._call = self.trainer.watch(self.worker_id)
        self.state.to(Member.WATCHING)
        try:
            for announcement in self._call:
                self._follow(announcement, store, reply, address)
        finally:
            with self._call_lock:
                self._call = None
        log.info("%s: dropped by the trainer; joining again", self.worker_id)

    def _follow(self, announcement: trainer_pb2.WeightAnnouncement, store: TCPStore, reply: trainer_pb2.JoinReply,
                address: str) -> None:
        epoch = announcement.group_epoch
        announced = time.time()
        try:
            if epoch != self._epoch:
                self._leave_group()
                rank = announcement.ranks.get(self.worker_id)
                if rank is None:
                    self._watching()
                    return
                store.set(arrived_key(epoch, self.worker_id), b"1")
                self.state.to(Member.ARRIVED)
                # The trainer decides within its arrival window; waiting twice that never misses a "go".
                store.wait([go_key(epoch)], timedelta(seconds=2 * reply.member_timeout_seconds))
                if store.get(go_key(epoch)) != GO:
                    self._watching()
                    return
                self._buffer_device = torch.device(self.device if reply.backend == "nccl" else "cpu")
                self._group = form_group(store, epoch, rank, announcement.world_size, backend=reply.backend,
                                         timeout_s=reply.member_timeout_seconds, address=address)
                self._epoch = epoch
                self.state.to(Member.IN_GROUP)
            self.state.to(Member.RECEIVING)
            ready, received = self._receive(announcement, lambda: store.check([broken_key(epoch)]))
        except RuntimeError as exc:
            # The group broke (a peer died, the trainer re-forms it): wait for the next announcement.
            log.warning("%s: version %d not received at group epoch %d: %s", self.worker_id,
                        announcement.version, epoch, exc)
            in_group = self._epoch == epoch
            self._leave_group()
            self._watching()
            if in_group:
                store.set(done_key(epoch, announcement.version, self.worker_id), ACK_FAILED)
            return
        self.recent_times.append(ReceiveTimes(announcement.version, announced, ready, received, time.time()))
        store.set(done_key(epoch, announcement.version, self.worker_id), ACK_OK)
        self.state.to(Member.IN_GROUP)

    def _watching(self) -> None:
        """Out of any group, following announcements (already so when a newer epoch leaves it out again)."""
        if self.state.state is not Member.WATCHING:
            self.state.to(Member.WATCHING)

    def _receive(self, announcement: trainer_pb2.WeightAnnouncement,
                 abandoned: Callable[[], bool]) -> tuple[float, float]:
        """Receive a version into the buffers; the wall-clock times its receive was posted and done."""
        started = time.perf_counter()
        manifest = Manifest.from_proto(announcement.buckets)
        with self._buffers_lock:
            # A version received but not loaded yet is being overwritten: there is nothing to load until this receive
            # completes (if it fails, the buffers hold parts of two versions).
            self._complete = None
            self._loaded = True
            if manifest != self._manifest:
                self._buffers = manifest.allocate(self._buffer_device)
                self._views = manifest.views(self._buffers)
                self._manifest = manifest
            try:
                ready = time.time()
                wait_broadcast(start_broadcast(self._group, self._buffers), abandoned=abandoned,
                               cuda_device=self._buffer_device if self._buffer_device.type == "cuda" else None)
                received = time.time()
            except RuntimeError:
                # An abandoned receive may still be pending inside gloo: never reuse the buffers it targets.
                self._manifest = None
                raise
            self._complete = announcement.version
            self._loaded = False
        self.metrics.receive_seconds.observe(time.perf_counter() - started)
        with self._changed:
            self._changed.notify_all()
        return ready, received

    def _leave_group(self) -> None:
        retire_group(self._group)
        self._group = None
        self._epoch = None
