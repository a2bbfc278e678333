"""The buffer itself: prompts out as leases, experience in, batches out to the trainer's ranks.

Knows nothing of gRPC. Every change of durable state is one write-ahead-log record that is written
first and then applied by `_apply`, the same function that replays the log after a restart, so the
state after a crash is by construction the state that was acknowledged.

The log rolls to a new segment once the active one holds `wal.segment_bytes`; each segment begins
with a snapshot of the whole state (the groups in it by their log locations, not their bytes), so
a segment can be released as soon as none of its groups is queued or awaiting a commit, and replay
still ends in the same state. Nothing is ever copied forward.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import numpy as np

from zerobubble.buffer.config import BufferServiceConfig
from zerobubble.buffer.filters import accuracy_rejection, group_version, is_stale
from zerobubble.buffer.leases import PromptLeases
from zerobubble.buffer.prompts import PromptFileError, PromptSource
from zerobubble.buffer.store import ExperienceStore, ProducerDedup, StoredGroup
from zerobubble.buffer.validation import check_group
from zerobubble.buffer.wal import Record, WriteAheadLog
from zerobubble.common.errors import InvalidInput, Overloaded
from zerobubble.v1 import common_pb2

log = logging.getLogger(__name__)

# How often a waiting push or pull looks whether its caller is still there.
POLL_SECONDS = 0.25


class Kind(IntEnum):
    START = 1      # a new incarnation of the service: leases of earlier ones are void
    GROUP = 2      # a stored group (blob: the serialized ExperienceGroup)
    FILTERED = 3   # a group dropped by the accuracy filter: its prompt is finished
    DELIVERED = 4  # a queued group went to a trainer rank under a delivery number
    STALE = 5      # a queued group was dropped at pull time as too old
    COMMIT = 6
    RESUME = 7     # the trainer restarted from a checkpoint: later deliveries come again
    VERSION = 8    # the trainer's current policy version
    SNAPSHOT = 9   # the whole state, first in every segment after the first


@dataclass
class LeaseGrant:
    lease_id: str
    prompts: list[common_pb2.Prompt]
    expires_in_seconds: float
    end_of_data: bool
    policy_version: int
    epoch_size: int = 0
    epoch_finished: int = 0


@dataclass
class PushOutcome:
    stored: bool
    filtered: str = ""


@dataclass
class Pulled:
    """One group for a rank (its serialized bytes), or the end-of-data mark when `payload` is None."""

    payload: bytes | None
    delivery: int = 0


@dataclass
class Counters:
    groups_in: int = 0
    groups_out: int = 0
    filtered: int = 0
    stale_dropped: int = 0


def _never() -> bool:
    return False


class Buffer:
    def __init__(
        self,
        config: BufferServiceConfig,
        *,
        source: PromptSource | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.config = config
        self.source = source or PromptSource.from_config(config.prompts)
        self.clock = clock
        self._cond = threading.Condition()
        self.leases = PromptLeases(
            self.source, epochs=config.prompts.epochs, timeout_seconds=config.leases.timeout_seconds,
            clock=clock,
        )
        self.store = ExperienceStore(max_groups=config.capacity.max_groups,
                                     max_bytes=config.capacity.max_bytes)
        self.dedup = ProducerDedup(window=config.capacity.dedup_window,
                                   max_producers=config.capacity.max_producers)
        self.counters = Counters()
        self.policy_version = 0
        self.wal = WriteAheadLog(config.wal.directory, fsync=config.wal.fsync,
                                 interval_seconds=config.wal.interval_seconds, reuse_files=config.wal.reuse_files)
        with self._cond:
            records = 0
            for record in self.wal.replay():
                self._apply(record)
                records += 1
            self._forget_released_groups()
            self._log(Kind.START, {"incarnation": self.leases.incarnation + 1, "prompts": self.source.fingerprint})
        log.info("buffer recovered %d log records: %d groups queued, %d delivered and not committed, "
                 "epoch %d", records, len(self.store.queue), len(self.store.delivered), self.leases.epoch)

    # Durable state: every change goes through _log, and _apply is also the replay.

    def _log(self, kind: Kind, meta: dict[str, Any], blob: bytes = b"") -> None:
        location = self.wal.append(kind, meta, blob)
        self._apply(Record(kind, meta, blob, location))
        self._release_dead_segments()

    def _roll_when_due(self) -> None:
        """Start a new log segment once the active one is full. Called outside the lock: the segment's
        records must be on disk before a snapshot that refers to them is, and most of that fsync then
        happens while pushes and pulls go on."""
        if self.wal.active_bytes < self.config.wal.segment_bytes:
            return
        if self.wal.fsync != "never":
            self.wal.sync()
        with self._cond:
            if self.wal.active_bytes >= self.config.wal.segment_bytes:
                self.wal.roll(Kind.SNAPSHOT, self._snapshot())
                self._release_dead_segments()

    def _release_dead_segments(self) -> None:
        dead = [segment for segment in self.wal.segments[:-1] if not self.store.live_segments[segment]]
        if dead:
            self.wal.release(dead)

    def _forget_released_groups(self) -> None:
        """A segment is released only once its groups are consumed, but after a machine crash the record
        that consumed them may be lost while the release was not: those groups are gone for good."""
        present = set(self.wal.segments)
        gone = [d for d, group in self.store.delivered.items() if group.location.segment not in present]
        if gone:
            self.store.commit(max(gone))  # commits are cumulative: everything up to it was consumed
        lost = [gid for gid, group in self.store.queue.items() if group.location.segment not in present]
        for gid in lost:
            self.store.remove(gid)
        if gone or lost:
            log.warning("the log had released the segments of %d delivered and %d queued groups whose "
                        "consumption it did not record (a machine crash): they are forgotten", len(gone), len(lost))

    def _apply(self, record: Record) -> None:
        kind, meta = Kind(record.kind), record.meta
        copy = meta.get("copy", False)
        if kind is Kind.START:
            if meta["prompts"] != self.source.fingerprint:
                raise PromptFileError(
                    f"{self.config.wal.directory} holds the log of a different prompt set than "
                    f"{self.config.prompts.path}; use another wal.directory for it"
                )
            self.leases.incarnation = meta["incarnation"]
        elif kind is Kind.GROUP:
            if not copy:
                self._finish_prompt(meta)
                self.counters.groups_in += 1
            blob = record.blob
            self.store.add(StoredGroup(meta["gid"], len(blob), meta["version"], record.location, blob))
        elif kind is Kind.FILTERED:
            self._finish_prompt(meta)
            self.counters.filtered += 1
        elif kind is Kind.DELIVERED:
            self.store.deliver(meta["gid"], meta["delivery"])
            self.counters.groups_out += not copy
        elif kind is Kind.STALE:
            self.store.remove(meta["gid"])
            self.counters.stale_dropped += 1
        elif kind is Kind.COMMIT:
            self.store.commit(meta["delivery"])
        elif kind is Kind.RESUME:
            self.store.commit(meta["delivery"])
            self.store.redeliver_after(meta["delivery"])
        elif kind is Kind.VERSION:
            self.policy_version = meta["version"]
        elif kind is Kind.SNAPSHOT:
            self._restore(meta)

    def _finish_prompt(self, meta: dict[str, Any]) -> None:
        key = (meta["epoch"], meta["index"])
        if not self.leases.is_done(key):
            self.leases.mark_done(key)
        self.dedup.record(meta["producer"], meta["sequence"])

    def _snapshot(self) -> dict[str, Any]:
        next_epoch, done = self.leases.snapshot()
        return {
            "incarnation": self.leases.incarnation,
            "next_epoch": next_epoch,
            "done": {str(e): base64.b64encode(np.packbits(bits)).decode() for e, bits in done.items()},
            "producers": self.dedup.snapshot(),
            "counters": vars(self.counters),
            "policy_version": self.policy_version,
            "next_gid": self.store.next_gid,
            "next_delivery": self.store.next_delivery,
            "committed": self.store.committed,
            "groups": self.store.snapshot(),
        }

    def _restore(self, meta: dict[str, Any]) -> None:
        size = len(self.source)
        done = {
            int(e): np.unpackbits(np.frombuffer(base64.b64decode(bits), np.uint8), count=size).astype(bool)
            for e, bits in meta["done"].items()
        }
        self.leases.incarnation = meta["incarnation"]
        self.leases.restore(meta["next_epoch"], done)
        self.dedup.restore(meta["producers"])
        self.counters = Counters(**meta["counters"])
        self.policy_version = meta["policy_version"]
        # Replaying the segment before this snapshot may have read the bytes of groups still queued.
        payloads = {gid: group.payload for gid, group in self.store.queue.items()}
        self.store = ExperienceStore(max_groups=self.store.max_groups, max_bytes=self.store.max_bytes)
        # Snapshots written by compaction (before the log rolled) were followed by copies of the groups instead.
        self.store.restore(meta.get("groups", {"queued": [], "delivered": []}), payloads)
        self.store.next_gid = meta["next_gid"]
        self.store.next_delivery = meta["next_delivery"]
        self.store.committed = meta["committed"]

    # Prompts.

    def lease_prompts(self, worker_id: str, count: int) -> LeaseGrant:
        if not worker_id:
            raise InvalidInput("must not be empty", field="worker_id")
        if not 0 < count <= self.config.leases.max_prompts:
            raise InvalidInput(f"expected 1 to {self.config.leases.max_prompts}, got {count}", field="count")
        with self._cond:
            self.leases.expire()
            # A full queue means the trainer is behind: more prompts would only make more waiting groups. Prompts
            # out on lease count as groups on their way, so a strictly on-policy worker does not start its next
            # batch on weights the trainer is about to replace while its last batch is still being scored.
            room = self.store.max_groups - len(self.store.queue) - self.leases.outstanding
            lease = None if self.store.full or room <= 0 else self.leases.lease(worker_id, min(count, room))
            prompts = [] if lease is None else [
                self.source.rows[index].to_message(epoch) for epoch, index in lease.prompts
            ]
            return LeaseGrant(
                lease_id="" if lease is None else lease.lease_id,
                prompts=prompts,
                expires_in_seconds=0.0 if lease is None else self.config.leases.timeout_seconds,
                end_of_data=self.leases.end_of_data,
                policy_version=self.policy_version,
                epoch_size=len(self.source),
                epoch_finished=self.leases.finished_in(prompts[0].epoch if prompts else self.leases.epoch),
            )

    def complete_lease(self, lease_id: str, prompt_ids: Sequence[str] = ()) -> None:
        indices = []
        for i, prompt_id in enumerate(prompt_ids):
            if prompt_id not in self.source.index_of:
                raise InvalidInput(f"unknown prompt id {prompt_id!r}", field=f"prompt_ids[{i}]")
            indices.append(self.source.index_of[prompt_id])
        with self._cond:
            self.leases.expire()
            self.leases.complete(lease_id, indices or None)

    # Experience in.

    def push(
        self, group: common_pb2.ExperienceGroup, payload: bytes | None = None, *,
        cancelled: Callable[[], bool] = _never,
    ) -> PushOutcome:
        """Store one group exactly once, waiting while the buffer is full; InvalidInput refuses it whole.

        `payload` is the group's serialized form when the caller already has it."""
        payload = group.SerializeToString() if payload is None else payload
        check_group(group, len(payload), num_generations=self.config.filters.num_generations,
                    max_bytes=self.config.capacity.max_group_bytes)
        epoch, index = self.leases.key_of(group.prompt.prompt_id, group.prompt.epoch)
        producer, sequence = group.producer_id, group.sequence
        rejection = accuracy_rejection(group, self.config.filters.accuracy_range)
        with self._cond:
            if group.lease_id:
                self.leases.check_lease_id(group.lease_id)
            while True:
                self.leases.expire()
                if self.dedup.seen(producer, sequence):
                    return PushOutcome(False, "duplicate: this producer and sequence were already accepted")
                if self.leases.is_done((epoch, index)):
                    return PushOutcome(False, f"duplicate: prompt {group.prompt.prompt_id!r} of epoch "
                                              f"{epoch} already has a group")
                meta = {"producer": producer, "sequence": sequence, "epoch": epoch, "index": index}
                if rejection:
                    self._log(Kind.FILTERED, meta)
                    return PushOutcome(False, rejection)
                if self.store.has_room(len(payload)):
                    break
                if cancelled():
                    raise Overloaded("the push was abandoned while waiting for room in the buffer")
                self._cond.wait(POLL_SECONDS)
            meta.update(gid=self.store.next_gid, version=group_version(group))
            self._log(Kind.GROUP, meta, payload)
            self._cond.notify_all()
        self._roll_when_due()
        return PushOutcome(True)

    # Experience out.

    def pull(
        self, rank: int, world_size: int, max_groups: int, wait_seconds: float,
        cancelled: Callable[[], bool] = _never,
    ) -> Iterator[Pulled]:
        """Up to `max_groups` groups, each as soon as it is there, for at most `wait_seconds`; ends with the
        end-of-data mark once every prompt is finished and nothing is left to deliver."""
        if world_size < 1:
            raise InvalidInput(f"must be at least 1, got {world_size}", field="world_size")
        if not 0 <= rank < world_size:
            raise InvalidInput(f"expected 0 <= rank < {world_size}, got {rank}", field="rank")
        if not 0 < max_groups <= self.config.pull.max_groups:
            raise InvalidInput(f"expected 1 to {self.config.pull.max_groups}, got {max_groups}",
                               field="max_groups")
        if not 0 <= wait_seconds <= self.config.pull.max_wait_seconds:
            raise InvalidInput(f"expected 0 to {self.config.pull.max_wait_seconds}, got {wait_seconds}",
                               field="wait_seconds")
        deadline = time.monotonic() + wait_seconds
        for _ in range(max_groups):
            item = self._take(deadline, cancelled)
            if item is None:
                return
            yield item
            if item.payload is None:
                return

    def _take(self, deadline: float, cancelled: Callable[[], bool]) -> Pulled | None:
        with self._cond:
            while True:
                group = self.store.peek()
                while group is not None and is_stale(group.version, self.policy_version,
                                                     self.config.filters.max_staleness):
                    self._log(Kind.STALE, {"gid": group.gid})
                    group = self.store.peek()
                if group is not None:
                    payload = group.payload if group.payload is not None else self.wal.read(group.location).blob
                    delivery = self.store.next_delivery
                    self._log(Kind.DELIVERED, {"gid": group.gid, "delivery": delivery})
                    self._cond.notify_all()
                    return Pulled(payload, delivery)
                if self.leases.end_of_data:
                    return Pulled(None)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or cancelled():
                    return None
                self._cond.wait(min(remaining, POLL_SECONDS))

    def commit(self, delivery: int, *, resume: bool = False) -> None:
        with self._cond:
            self.store.check_delivery(delivery)
            if resume:
                self._log(Kind.RESUME, {"delivery": delivery})
                self._cond.notify_all()
            elif delivery > self.store.committed:
                self._log(Kind.COMMIT, {"delivery": delivery})
        self._roll_when_due()

    def set_policy_version(self, version: int) -> None:
        if version < 0:
            raise InvalidInput(f"must not be negative, got {version}", field="version")
        with self._cond:
            if version != self.policy_version:
                self._log(Kind.VERSION, {"version": version})
                self._cond.notify_all()

    def stats(self) -> dict[str, Any]:
        with self._cond:
            self.leases.expire()
            return {
                "queued_groups": len(self.store.queue),
                "queued_bytes": self.store.queued_bytes,
                **vars(self.counters),
                "lease_expirations": self.leases.expirations,
                "epoch": self.leases.epoch,
                "policy_version": self.policy_version,
                "end_of_data": self.leases.end_of_data,
            }

    def close(self) -> None:
        with self._cond:
            self.wal.close()
