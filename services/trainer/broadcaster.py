"""Trainer side of the weight sync: the membership of the broadcast group (join, watch, drop) and the sender
(re-forming the group at a new epoch, the bucketed broadcast, the acknowledgements) on a thread of its own; the
copier (services/trainer/weight_copier.py) gives it each published version. The states and transitions of all
three are the table in services/common/sync_protocol.py. No gRPC here: the servicer calls join/watch and hands the
announcements to the streams.

Publishes that come while a broadcast is in flight coalesce: the newest version is the next one sent.
"""

from __future__ import annotations

import logging
import reprlib
import socket
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta

import torch
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from torch.distributed import DistError, DistStoreError, TCPStore

from zerobubble.common.conditions import AwaitableCondition
from zerobubble.common.config import is_loopback
from zerobubble.common.errors import InvalidInput, NotFound, Overloaded, TemporarilyUnavailable
from zerobubble.common.names import check_name
from zerobubble.common.sync_protocol import Machine, Membership, Sender
from zerobubble.common.weight_sync import (
    ABORT,
    ACK_OK,
    GO,
    MIB,
    Manifest,
    arrived_key,
    backend_for,
    broken_key,
    done_key,
    form_group,
    go_key,
    retire_group,
    start_broadcast,
    wait_broadcast,
)
from zerobubble.trainer.sync_config import WeightSyncConfig
from zerobubble.trainer.weight_copier import Snapshot, WeightCopier
from zerobubble.v1 import trainer_pb2

log = logging.getLogger(__name__)
# Written into the key the sender thread awaits of a member that left (or of every member, at close), so that
# its wait ends now instead of at its timeout.
LEFT = b"left"


class SyncMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.seconds = Histogram(
            "zerobubble_trainer_weight_sync_seconds", "from taking a version off the queue to the last member's ack",
            registry=registry, buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        )
        self.bytes = Counter("zerobubble_trainer_weight_sync_bytes", "weight bytes acknowledged by members",
                             registry=registry)
        self.members = Gauge("zerobubble_trainer_sync_members", "workers in the current broadcast group",
                             registry=registry)
        self.dropped = Counter("zerobubble_trainer_sync_dropped", "members dropped (dead, stalled or disconnected)",
                               registry=registry)


@dataclass(frozen=True)
class JoinInfo:
    rank: int
    world_size: int
    group_epoch: int
    store_host: str
    store_port: int
    backend: str
    member_timeout_s: float


@dataclass
class _Member:
    worker_id: str
    device: str
    outbox: deque = field(default_factory=deque)
    watch: int = 0      # number of the current watch stream; an older one ends
    state: Machine = field(default_factory=lambda: Machine(Membership.JOINED))

    @property
    def gone(self) -> bool:
        return self.state.state is Membership.GONE


class Watch:
    """One watch stream of one member: its announcements in order, until the member is dropped, joins
    again or starts another watch."""

    def __init__(self, owner: WeightBroadcaster, member: _Member, number: int):
        self._owner = owner
        self._member = member
        self._number = number
        self._closed = False

    def _over(self) -> bool:
        m = self._member
        return self._closed or m.gone or m.watch != self._number or self._owner.closed

    async def next(self) -> trainer_pb2.WeightAnnouncement | None:
        """The next announcement, awaited without holding a thread; None once the watch has ended."""
        cond = self._owner._cond
        await cond.wait_for_async(lambda: self._over() or bool(self._member.outbox))
        with cond:
            return None if self._over() else self._member.outbox.popleft()

    def close(self) -> None:
        """The stream ended on the worker's side: a current member leaves the group."""
        with self._owner._cond:
            current = not self._closed and not self._member.gone and self._member.watch == self._number
            self._closed = True
            self._owner._cond.notify_all()
        if current:
            self._owner.drop(self._member.worker_id, "its watch stream closed", member=self._member)


class WeightBroadcaster:
    def __init__(self, config: WeightSyncConfig | None = None, registry: CollectorRegistry | None = None):
        self.config = config or WeightSyncConfig()
        self.metrics = SyncMetrics(registry or CollectorRegistry())
        self.backend = backend_for(self.config.device)
        device = torch.device(self.config.device)
        self._cuda_device = device if device.type == "cuda" else None
        self.closed = False
        self._bucket_bytes = int(self.config.bucket_mb * MIB)
        # Watch streams await it on the server's event loop; the sender thread and the loop wait as usual.
        self._cond = AwaitableCondition()
        self._members: dict[str, _Member] = {}
        self._group = None
        self._group_ids: list[str] = []
        self._epoch = 0
        self._regroup_needed = False
        self._pending = False
        self._published_version = -1
        self._synced_version = -1
        self._sending_version = -1
        self._last_sync_seconds = 0.0
        self._last_sync_times: dict[str, float] = {}
        self._last_copy_seconds = 0.0
        self._sending: Snapshot | None = None
        self._proto_cache: tuple[Manifest, list[trainer_pb2.Bucket]] | None = None
        self._store: TCPStore | None = None
        # The sender thread blocks on the store for its members' keys (`_await_keys`); other threads end that wait
        # through a connection of their own, since a store client is not shared between threads.
        self._waker: TCPStore | None = None
        self._waker_lock = threading.Lock()
        self._awaited: dict[str, str] = {}
        self._spent_keys: list[str] = []
        self._thread = threading.Thread(target=self._run, name="weight-broadcast", daemon=True)
        self.copier = WeightCopier(self._bucket_bytes, self.config.device, self._copied)
        # The sender's part of the protocol (services/common/sync_protocol.py); each member has its own.
        self.sender_state = Machine(Sender.IDLE)

    def start(self) -> WeightBroadcaster:
        timeout = timedelta(seconds=self.config.member_timeout_s)
        self._store = TCPStore(self.config.store_host, self.config.store_port, is_master=True,
                               wait_for_workers=False, timeout=timeout)
        self._thread.start()
        self.copier.start()
        log.info("weight sync store on %s:%d (%s)", self.advertise_host, self.store_port, self.backend)
        if not is_loopback(f"{self.config.store_host}:{self.store_port}"):
            # Joins are authenticated over gRPC, but torch.distributed's store and gloo/NCCL connections are not.
            log.warning("the weight sync store on %s:%d and the %s connections have no authentication: let only "
                        "the rollout workers' network reach them", self.config.store_host, self.store_port,
                        self.backend)
        return self

    @property
    def store_port(self) -> int:
        return self._store.port

    @property
    def advertise_host(self) -> str:
        if self.config.advertise_host:
            return self.config.advertise_host
        if self.config.store_host in ("0.0.0.0", "::", ""):
            return socket.getfqdn()
        return self.config.store_host

    # -- membership (called from gRPC handler threads) --

    def join(self, worker_id: str, device: str) -> JoinInfo:
        check_name(worker_id, "worker_id", required=True)
        device = device or "cpu"
        try:
            backend = backend_for(device)
        except RuntimeError:
            raise InvalidInput(f"{reprlib.repr(device)} is not a torch device (cpu, cuda:N)", field="device") from None
        if self.backend == "nccl" and backend != "nccl":
            raise InvalidInput(f"{device!r}: this trainer broadcasts over NCCL; join with a cuda device",
                               field="device")
        with self._cond:
            if self.closed:
                raise TemporarilyUnavailable(f"{worker_id!r} cannot join: the weight sync has closed (the trainer "
                                             f"is stopping)")
            if worker_id not in self._members and len(self._members) >= self.config.max_members:
                raise Overloaded(f"{worker_id!r} cannot join: the weight sync has {len(self._members)} members, "
                                 f"the most weight_sync.max_members allows")
            old = self._members.pop(worker_id, None)
            if old is not None:
                # The same id from a fresh process: the group it was in is no use to it.
                old.state.to(Membership.GONE)
                self._regroup_needed = True
            self._members[worker_id] = _Member(worker_id, device)
            awaited = self._awaited.get(worker_id) if old is not None else None
            # The last published weights go out again with the newcomer: a worker that joins a trainer
            # which resumed (or is waiting for experience) must not wait for a training step that needs it.
            if self._published_version >= 0:
                self._pending = True
            self._cond.notify_all()
            log.info("%s joined the weight sync (from version %d)", worker_id, self._published_version)
            info = JoinInfo(-1, len(self._group_ids) + 1, self._epoch, self.advertise_host, self.store_port,
                            self.backend, self.config.member_timeout_s)
        if awaited is not None:
            self._stop_awaiting([awaited])  # the sync in flight has its old process among the members
        return info

    def watch(self, worker_id: str) -> Watch:
        with self._cond:
            member = self._members.get(worker_id)
            if member is None:
                raise NotFound(f"{worker_id!r} is not a member: call JoinWeightSync first", field="worker_id")
            member.watch += 1
            member.state.to(Membership.WATCHING)
            self._cond.notify_all()
            return Watch(self, member, member.watch)

    def drop(self, worker_id: str, reason: str, member: _Member | None = None) -> bool:
        """Remove a member (only that one, when `member` is given); the group is re-formed at the next publish."""
        with self._cond:
            current = self._members.get(worker_id)
            if current is None or (member is not None and current is not member):
                return False
            del self._members[worker_id]
            current.state.to(Membership.GONE)
            awaited = self._awaited.get(worker_id)
            self._cond.notify_all()
        if awaited is not None:
            self._stop_awaiting([awaited])
        self.metrics.dropped.inc()
        log.warning("dropped %s from the weight sync: %s", worker_id, reason)
        return True

    @property
    def members(self) -> list[str]:
        with self._cond:
            return list(self._members)

    def status(self) -> dict:
        with self._cond:
            return {
                "members": len(self._group_ids), "joined": len(self._members), "group_epoch": self._epoch,
                "published_version": self._published_version, "sending_version": self._sending_version,
                "synced_version": self._synced_version,
                "last_sync_seconds": self._last_sync_seconds, "last_sync_times": dict(self._last_sync_times),
                "last_copy_seconds": self._last_copy_seconds,
            }

    # -- publishing (called by the training loop) --

    def publish(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Hand the weights over and return: the copier copies them into the spare buffers, and the sender thread
        broadcasts them. Call `wait_copied()` before changing any of the tensors."""
        self.copier.publish(list(named_tensors), version)

    def wait_copied(self) -> None:
        """Wait until the last publish's weights are copied; raises what failed the copy."""
        self.copier.wait_copied()

    def _copied(self, version: int, seconds: float) -> None:
        with self._cond:
            self._pending = True
            self._published_version = version
            self._last_copy_seconds = seconds
            self._cond.notify_all()

    def wait_synced(self, version: int, timeout: float) -> bool:
        """Wait until `version` (or a newer one) went out and every member at that time acknowledged it."""
        with self._cond:
            return self._cond.wait_for(lambda: self._synced_version >= version or self.closed, timeout) and \
                self._synced_version >= version

    def close(self) -> None:
        with self._cond:
            self.closed = True
            for member in self._members.values():
                member.state.to(Membership.GONE)
            awaited = list(self._awaited.values())
            self._cond.notify_all()
        self._stop_awaiting(awaited)
        if self._thread.is_alive():
            self._thread.join(timeout=2 * self.config.member_timeout_s)
        self.copier.close(timeout=self.config.member_timeout_s)
        self._teardown()
        with self._waker_lock:
            self._waker = None
            self._store = None

    # -- the sender thread --

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self.closed)
                if self.closed:
                    return
                self._pending = False
            self._sending = self.copier.newest(self._sending)
            with self._cond:
                self._sending_version = self._sending.version
            try:
                self._sync(self._sending)
            except Exception:
                log.exception("weight sync of version %d failed", self._sending.version)
                self._teardown()
            self.sender_state.to(Sender.IDLE)
            with self._cond:
                self._sending_version = -1
            self._forget_spent_keys()

    def _sync(self, snapshot: Snapshot) -> None:
        started = time.perf_counter()
        failures = 0
        # Who this version goes to: the members of now. Whoever joins (or joins again) meanwhile gets the next sync,
        # so joiners that never arrive hold a version back by one formation timeout, however often they come.
        with self._cond:
            roster = list(self._members.values())
        times: dict[str, float] = {}
        while failures < self.config.max_attempts and not self.closed:
            with self._cond:
                ids = [member.worker_id for member in roster if not member.gone]
                rejoined, self._regroup_needed = self._regroup_needed, False
            if not ids:
                self._teardown()
                break
            # Wall-clock times of the attempt's parts, so a bench can set them beside its workers' own ("announced":
            # as the announcement goes out; after it, a new group epoch is formed first).
            times = {"started": time.time()}
            if rejoined or ids != self._group_ids or self._group is None:
                times["announced"] = time.time()
                self.sender_state.to(Sender.FORMING)
                formed, dropped = self._regroup(snapshot, ids)
                if not formed:
                    failures += 0 if dropped else 1
                    continue
            else:
                times["announced"] = time.time()
                self._announce(snapshot, regroup=False)
            self.sender_state.to(Sender.BROADCASTING)
            try:
                # A close (the trainer is going) ends it at once, not at the member timeout of a member that stalled.
                wait_broadcast(start_broadcast(self._group, snapshot.buffers), abandoned=lambda: self.closed,
                               cuda_device=self._cuda_device)
                times["sent"] = time.time()
                self.sender_state.to(Sender.AWAITING_ACKS)
            except RuntimeError as exc:
                log.warning("broadcast of version %d failed (%s); re-forming the group", snapshot.version, exc)
                self._teardown()
                failures += 1
                continue
            acks, missing = self._await_keys({w: done_key(self._epoch, snapshot.version, w) for w in self._group_ids},
                                             self.config.member_timeout_s)
            times["acknowledged"] = time.time()
            failed = missing + [w for w, ack in acks.items() if ack != ACK_OK]
            if failed:
                # Who is at fault is not known here (a dead peer makes others fail too): re-form the group,
                # which drops whoever does not arrive, and send this version again.
                log.warning("version %d not acknowledged by %s; re-forming the group", snapshot.version,
                            ", ".join(failed))
                self._teardown()
                failures += 1
                continue
            self.metrics.bytes.inc(len(acks) * snapshot.manifest.total_bytes)
            break
        else:
            if not self.closed:
                log.warning("version %d not delivered after %d failed attempts", snapshot.version, failures)
            return
        elapsed = time.perf_counter() - started
        self.metrics.seconds.observe(elapsed)
        with self._cond:
            self._synced_version = snapshot.version
            self._last_sync_seconds = elapsed
            self._last_sync_times = times
            self._cond.notify_all()

    def _regroup(self, snapshot: Snapshot, ids: list[str]) -> tuple[bool, bool]:
        """One try at a new group epoch of `ids`; returns (formed, dropped someone)."""
        self._teardown()
        self._epoch += 1
        epoch = self._epoch
        ranks = {worker_id: rank for rank, worker_id in enumerate(ids, start=1)}
        # The members as announced: one that joins again meanwhile (which ends this wait for its old process) is a
        # new member, and must not be dropped for what the old one did not do.
        with self._cond:
            announced = {worker_id: self._members.get(worker_id) for worker_id in ids}
        self._announce(snapshot, regroup=True, ranks=ranks)
        _, missing = self._await_keys({w: arrived_key(epoch, w) for w in ids}, self.config.formation_timeout_s)
        if missing:
            self._store.set(go_key(epoch), ABORT)
            for worker_id in missing:
                if announced[worker_id] is not None:
                    self.drop(worker_id, f"did not arrive at group epoch {epoch} within "
                              f"{self.config.formation_timeout_s}s", member=announced[worker_id])
            return False, True
        self._store.set(go_key(epoch), GO)
        try:
            group = form_group(self._store, epoch, 0, len(ids) + 1, backend=self.backend,
                               timeout_s=self.config.member_timeout_s, address=self.advertise_host)
        except RuntimeError as exc:
            log.warning("group epoch %d did not form (%s)", epoch, exc)
            return False, False
        self._group, self._group_ids = group, ids
        self.metrics.members.set(len(ids))
        log.info("group epoch %d formed: %s", epoch, ", ".join(ids))
        return True, False

    def _teardown(self) -> None:
        if self._group is not None and self._store is not None:
            self._store.set(broken_key(self._epoch), b"1")
        retire_group(self._group)
        self._group, self._group_ids = None, []
        self.metrics.members.set(0)

    def _announce(self, snapshot: Snapshot, *, regroup: bool, ranks: dict[str, int] | None = None) -> None:
        if ranks is None:
            ranks = {worker_id: rank for rank, worker_id in enumerate(self._group_ids, start=1)}
        if self._proto_cache is None or self._proto_cache[0] != snapshot.manifest:
            self._proto_cache = (snapshot.manifest, snapshot.manifest.to_proto())
        announcement = trainer_pb2.WeightAnnouncement(
            version=snapshot.version, group_epoch=self._epoch, world_size=len(ranks) + 1,
            buckets=self._proto_cache[1], regroup=regroup, ranks=ranks,
        )
        with self._cond:
            for worker_id in ranks:
                member = self._members.get(worker_id)
                if member is not None:
                    member.outbox.append(announcement)
            self._cond.notify_all()

    def _await_keys(self, keys: dict[str, str], timeout_s: float) -> tuple[dict[str, bytes], list[str]]:
        """Wait until every worker's key exists or `timeout_s` passes: (the values found by worker, the workers whose
        key is missing; one that left meanwhile counts as missing at once).

        Blocks in the store, which answers as the last key is written: no polling interval adds to a sync. A member
        that leaves meanwhile has its key written as LEFT by whoever drops it (see `_stop_awaiting`)."""
        with self._cond:
            self._awaited = dict(keys)
            gone = [worker_id for worker_id in keys if worker_id not in self._members]
        try:
            for worker_id in gone:
                self._store.compare_set(keys[worker_id], "", LEFT)
            if self.closed:
                present = []
            else:
                try:
                    self._store.wait(list(keys.values()), timedelta(seconds=timeout_s))
                    present = list(keys)
                except DistStoreError:
                    present = [worker_id for worker_id, key in keys.items() if self._store.check([key])]
        finally:
            with self._cond:
                self._awaited = {}
        values = self._store.multi_get([keys[worker_id] for worker_id in present]) if present else []
        self._spent_keys.extend(keys[worker_id] for worker_id in present)
        found = {worker_id: value for worker_id, value in zip(present, values, strict=True) if value != LEFT}
        return found, [worker_id for worker_id in keys if worker_id not in found]

    def _stop_awaiting(self, keys: list[str]) -> None:
        """End the sender thread's wait for these keys now: each gets LEFT unless its member wrote it already."""
        with self._waker_lock:
            if self._store is None:
                return
            try:
                if self._waker is None:
                    self._waker = self._store.clone()
                for key in keys:
                    self._waker.compare_set(key, "", LEFT)
            except DistError as exc:
                # The wait then ends at its timeout instead; the next wake-up connects afresh.
                log.warning("could not end the wait for %s early (%s)", keys, exc)
                self._waker = None

    def _forget_spent_keys(self) -> None:
        """Delete the keys a sync read, once it is over (not while a version waits for them), so the store does not
        grow with every version."""
        spent, self._spent_keys = self._spent_keys, []
        for key in spent:
            self._store.delete_key(key)
