"""The buffer itself: prompts out as leases, experience in, batches out to the trainer's ranks.

Knows nothing of gRPC. Every change of durable state is one write-ahead-log record that is written
first and then applied by `_apply`, the same function that replays the log after a restart, so the
state after a crash is by construction the state that was acknowledged.

The log rolls to a new segment once the active one holds `wal.segment_bytes`; each segment begins
with a snapshot of the whole state (the groups in it by their log locations, not their bytes), so
a segment can be released as soon as none of its groups is queued or awaiting a commit, and replay
still ends in the same state. Nothing is ever copied forward.

A group sent to a trainer rank is only the receiver's once it is acknowledged: a stream can be cut after
the buffer wrote a group and before the receiver read it. Unacknowledged deliveries go back to the head of
the queue `pull.ack_timeout_seconds` after their stream ended, when the trainer resumes, and when the
buffer restarts (no stream outlives it), so a cut stream loses nothing.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import numpy as np

from zerobubble.buffer.config import BufferServiceConfig
from zerobubble.buffer.filters import accuracy_rejection, group_version
from zerobubble.buffer.leases import PromptLeases
from zerobubble.buffer.prompts import PromptFileError, PromptSource
from zerobubble.buffer.store import ExperienceStore, ProducerDedup, StoredGroup
from zerobubble.buffer.validation import check_group
from zerobubble.buffer.wal import Location, Record, WriteAheadLog
from zerobubble.common.conditions import AwaitableCondition
from zerobubble.common.errors import InvalidInput, NotYours, TemporarilyUnavailable, TooLarge
from zerobubble.common.version import is_stale
from zerobubble.v1 import buffer_pb2, common_pb2

log = logging.getLogger(__name__)

class Kind(IntEnum):
    START = 1      # a new incarnation of the service: leases of earlier ones are void
    GROUP = 2      # a stored group (blob: the serialized ExperienceGroup)
    FILTERED = 3   # a group dropped by the accuracy filter: its prompt is finished
    DELIVERED = 4  # a queued group went to a trainer rank under a delivery number
    STALE = 5      # a queued group was dropped at pull time as too old
    COMMIT = 6
    RESUME = 7     # the trainer restarted from a checkpoint: later deliveries come again
    VERSION = 8    # the consuming version the trainer set (common/version.py)
    SNAPSHOT = 9   # the whole state, first in every segment after the first
    ACKED = 10     # deliveries the receiver acknowledged: now awaiting its commit
    RETURNED = 11  # unacknowledged deliveries whose time ran out: back at the head of the queue


@dataclass
class LeaseGrant:
    lease_id: str
    prompts: list[common_pb2.Prompt]
    expires_in_seconds: float
    end_of_data: bool
    policy_version: int
    epoch_size: int = 0
    epoch_finished: int = 0
    training_finished: bool = False


@dataclass
class PushOutcome:
    stored: bool
    filtered: str = ""
    not_stored: int = buffer_pb2.NOT_STORED_UNSPECIFIED


# What one PullStream.take_all gathers at most (beyond one group).
TAKE_ALL_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class PreparedGroup:
    """A checked group and what storing it takes."""

    payload: bytes
    prompt_id: str
    meta: dict[str, Any]  # of its log record
    rejection: str        # why the accuracy filter drops it ("" to keep it)
    version: int


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
    returned: int = 0


def producer_key(producer_id: str, incarnation: str) -> str:
    """Who made a group, for deduplication: a restarted producer is another one. Without an incarnation the key
    is the bare id, as in logs written before incarnations; ids are printable, so the newline never collides."""
    return f"{producer_id}\n{incarnation}" if incarnation else producer_id


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
        # Threads wait on it as on any Condition; the servicer's coroutines wait on it holding no thread.
        self._cond = AwaitableCondition()
        self.leases = PromptLeases(
            self.source, epochs=config.prompts.epochs, timeout_seconds=config.leases.timeout_seconds,
            clock=clock,
        )
        self.store = ExperienceStore(max_groups=config.capacity.max_groups,
                                     max_bytes=config.capacity.max_bytes)
        self.dedup = ProducerDedup(window=config.capacity.dedup_window,
                                   max_producers=config.capacity.max_producers)
        self.counters = Counters()
        self.training_finished = False
        self.policy_version = 0  # the consuming version (common/version.py)
        # When each unacknowledged delivery goes back to the queue (by `clock`); not logged, as no stream that
        # could still acknowledge one outlives the process.
        self._ack_deadlines: dict[int, float] = {}
        # Which rank's stream each unacknowledged delivery went to: only that rank may claim it. In memory, as the
        # deadlines are: a restart sends every unacknowledged delivery again.
        self._receivers: dict[int, int] = {}
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

    def _log(self, kind: Kind, meta: dict[str, Any], blob: bytes = b"", *, sync: bool = True) -> Location:
        """Write and apply one record; with `sync` False, `_sync_through` its location (the lock let go) before
        anyone is told of it."""
        try:
            location = self.wal.append(kind, meta, blob, sync=sync)
        except OSError as exc:
            # A full disk: nothing was applied, and the caller may try again once there is room.
            raise TemporarilyUnavailable(f"the write-ahead log cannot be written: {exc}") from exc
        self._apply(Record(kind, meta, blob, location))
        self._release_dead_segments()
        return location

    def _sync_through(self, location: Location) -> None:
        """Called without the lock: pushes that logged meanwhile share this fsync (fsync "always")."""
        try:
            self.wal.sync_through(location)
        except OSError as exc:
            # Written and applied, but perhaps not on disk: sent again, the group is a duplicate, stored once.
            raise TemporarilyUnavailable(f"the write-ahead log cannot be synced: {exc}") from exc

    def _roll_when_due(self) -> None:
        """Start a new log segment once the active one is full. Called outside the lock: the segment's
        records must be on disk before a snapshot that refers to them is, and most of that fsync then
        happens while pushes and pulls go on."""
        if self.wal.active_bytes < self.config.wal.segment_bytes:
            return
        try:
            if self.wal.fsync != "never":
                self.wal.sync()
            with self._cond:
                if self.wal.active_bytes >= self.config.wal.segment_bytes:
                    self.wal.roll(Kind.SNAPSHOT, self._snapshot())
                    self._release_dead_segments()
        except OSError as exc:
            # What was asked is done and logged; the segment only grows past its size until a roll succeeds.
            log.warning("cannot start a new write-ahead log segment (%s); trying again later", exc)

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
            self.store.drop_delivered(gone)
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
            self._give_back(sorted(self.store.unacked))
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
            # Logs written before deliveries were acknowledged counted a group the receiver's once sent.
            self.store.deliver(meta["gid"], meta["delivery"], acked=not meta.get("unacked", False))
            self.counters.groups_out += not copy
        elif kind is Kind.STALE:
            self.store.remove(meta["gid"])
            self.counters.stale_dropped += 1
        elif kind is Kind.COMMIT:
            self.store.commit(meta["delivery"])
        elif kind is Kind.RESUME:
            # The trainer holds nothing but what its checkpoint covers: everything else comes again.
            self.store.commit(meta["delivery"])
            self._give_back(list(self.store.delivered))
        elif kind is Kind.ACKED:
            for delivery in meta["deliveries"]:
                self.store.acknowledge(delivery)
        elif kind is Kind.RETURNED:
            self._give_back(meta["deliveries"])
        elif kind is Kind.VERSION:
            self.policy_version = meta["version"]
            self.training_finished = meta.get("training_finished", False)
        elif kind is Kind.SNAPSHOT:
            self._restore(meta)

    def _give_back(self, deliveries: list[int]) -> None:
        self.counters.returned += sum(d in self.store.unacked for d in deliveries)
        self.store.give_back(deliveries)
        for delivery in deliveries:
            self._ack_deadlines.pop(delivery, None)
            self._receivers.pop(delivery, None)

    def _finish_prompt(self, meta: dict[str, Any]) -> None:
        key = (meta["epoch"], meta["index"])
        if not self.leases.is_done(key):
            self.leases.mark_done(key)
        self.dedup.record(producer_key(meta["producer"], meta.get("incarnation", "")), meta["sequence"])

    def _snapshot(self) -> dict[str, Any]:
        next_epoch, done = self.leases.snapshot()
        return {
            "incarnation": self.leases.incarnation,
            "next_epoch": next_epoch,
            "done": {str(e): base64.b64encode(np.packbits(bits)).decode() for e, bits in done.items()},
            "producers": self.dedup.snapshot(),
            "counters": vars(self.counters),
            "policy_version": self.policy_version,
            "training_finished": self.training_finished,
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
        self.training_finished = meta.get("training_finished", False)
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
            full = self.store.full or room <= 0 or self.training_finished
            lease = None if full else self.leases.lease(worker_id, min(count, room))
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
                training_finished=self.training_finished,
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

    def prepare_push(self, group: common_pb2.ExperienceGroup, payload: bytes | None = None) -> PreparedGroup:
        """Check a group (InvalidInput or TooLarge refuse it whole) and work out what storing it needs; no lock.

        `payload` is the group's serialized form when the caller already has it."""
        payload = group.SerializeToString() if payload is None else payload
        check_group(group, len(payload), self.config, policy_version=self.policy_version)
        if group.lease_id:
            self.leases.check_lease_id(group.lease_id)
        epoch, index = self.leases.key_of(group.prompt.prompt_id, group.prompt.epoch)
        meta = {"producer": group.producer_id, "sequence": group.sequence, "epoch": epoch, "index": index}
        if group.producer_incarnation:
            meta["incarnation"] = group.producer_incarnation
        return PreparedGroup(payload, group.prompt.prompt_id, meta,
                             accuracy_rejection(group, self.config.run_spec.filter_range), group_version(group))

    def try_push(self, prepared: PreparedGroup) -> PushOutcome | None:
        """Store a prepared group exactly once; None while the buffer has no room for it (`has_room` says when
        to try again). TemporarilyUnavailable when the log cannot be written: worth sending again later."""
        meta = prepared.meta
        with self._cond:
            self.leases.expire()
            if self.dedup.seen(producer_key(meta["producer"], meta.get("incarnation", "")), meta["sequence"]):
                return PushOutcome(False, "duplicate: this producer and sequence were already accepted",
                                   buffer_pb2.NOT_STORED_DUPLICATE)
            if self.leases.is_done((meta["epoch"], meta["index"])):
                return PushOutcome(False, f"duplicate: prompt {prepared.prompt_id!r} of epoch {meta['epoch']} "
                                          "already has a group", buffer_pb2.NOT_STORED_PROMPT_DONE)
            if prepared.rejection:
                location = self._log(Kind.FILTERED, meta, sync=False)
                outcome = PushOutcome(False, prepared.rejection, buffer_pb2.NOT_STORED_ACCURACY)
            elif not self.has_room(prepared):
                return None
            else:
                location = self._log(Kind.GROUP, {**meta, "gid": self.store.next_gid, "version": prepared.version},
                                     prepared.payload, sync=False)
                outcome = PushOutcome(True)
                self._cond.notify_all()
        # Acknowledged only once on disk as wal.fsync promises; concurrent pushes share the fsync (group commit).
        # A puller may take the group before that: its delivery record's own fsync covers the group's record.
        self._sync_through(location)
        self._roll_when_due()
        return outcome

    def has_room(self, prepared: PreparedGroup) -> bool:
        """Cheap, for a waiter's predicate (the lock held)."""
        return self.store.has_room(len(prepared.payload))

    def push(self, group: common_pb2.ExperienceGroup, payload: bytes | None = None) -> PushOutcome:
        """prepare_push and try_push, waiting in this thread while the buffer is full."""
        prepared = self.prepare_push(group, payload)
        while (outcome := self.try_push(prepared)) is None:
            with self._cond:
                self._cond.wait_for(lambda: self.has_room(prepared))
        return outcome

    # Experience out.

    def open_pull(self, rank: int, world_size: int, max_groups: int, wait_seconds: float) -> PullStream:
        """A PullBatch's progress: up to `max_groups` groups, each as soon as it is there, for at most
        `wait_seconds`, ending with the end-of-data mark once every prompt is finished and nothing is left to
        deliver. Close it when the stream ends."""
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
        return PullStream(self, rank, max_groups, self.clock() + wait_seconds)

    def pull(self, rank: int, world_size: int, max_groups: int, wait_seconds: float) -> Iterator[Pulled]:
        """open_pull's groups, waiting in this thread."""
        stream = self.open_pull(rank, world_size, max_groups, wait_seconds)
        try:
            while stream.wanted:
                with self._cond:
                    while (item := stream.take()) is None and stream.may_wait():
                        self._cond.wait(stream.wait_seconds())
                if item is None:
                    return
                yield item
                if item.payload is None:
                    return
        finally:
            stream.close()

    def stream_ended(self, sent: list[int]) -> None:
        """The receiver has what it will get of this stream: what it does not acknowledge soon was lost."""
        with self._cond:
            due = self.clock() + self.config.pull.ack_timeout_seconds
            for delivery in sent:
                if delivery in self._ack_deadlines:
                    self._ack_deadlines[delivery] = min(self._ack_deadlines[delivery], due)

    def next_ack_due(self) -> float:
        return min(self._ack_deadlines.values(), default=float("inf"))

    def _return_overdue(self) -> None:
        """Called under the lock: unacknowledged deliveries whose time ran out go back to the queue."""
        now = self.clock()
        if self.next_ack_due() > now:
            return
        overdue = sorted(d for d, due in self._ack_deadlines.items() if due <= now)
        self._log(Kind.RETURNED, {"deliveries": overdue})
        log.info("%d groups sent to the trainer were not acknowledged in time; they will be sent again",
                 len(overdue))
        self._cond.notify_all()

    def take_for(self, stream: PullStream) -> Pulled | None:
        """The stream's next group, its end-of-data mark, or None for now."""
        with self._cond:
            return self._take(stream)

    def _take(self, stream: PullStream) -> Pulled | None:
        self._return_overdue()
        group = self.store.peek()
        max_staleness = self.config.run_spec.max_staleness
        dropped: list[int] = []
        while group is not None and is_stale(group.version, self.policy_version, max_staleness):
            self._log(Kind.STALE, {"gid": group.gid})
            dropped.append(group.version)
            group = self.store.peek()
        if dropped:
            # One line a batch, not a group: a worker that ran on after its trainer can leave hundreds.
            log.info("dropped %d groups as stale (policy versions %d to %d, more than run.max_staleness=%d behind "
                     "%d); %d dropped so far", len(dropped), min(dropped), max(dropped), max_staleness,
                     self.policy_version, self.counters.stale_dropped)
        if group is not None:
            payload = group.payload if group.payload is not None else self.wal.read(group.location).blob
            delivery = self.store.next_delivery
            self._log(Kind.DELIVERED, {"gid": group.gid, "delivery": delivery, "unacked": True})
            # Until the stream ends (at the latest when its wait does) and its receiver had time to answer.
            self._ack_deadlines[delivery] = max(self.clock(), stream.deadline) + self.config.pull.ack_timeout_seconds
            self._receivers[delivery] = stream.rank
            self._cond.notify_all()
            return Pulled(payload, delivery)
        if self.finished_for(stream):
            return Pulled(None)
        return None

    def finished_for(self, stream: PullStream) -> bool:
        # Deliveries still unacknowledged elsewhere may yet come back to the queue; those of this very stream
        # reach its receiver before the mark does.
        return self.leases.end_of_data and not self.store.queue and self.store.unacked.issubset(stream.sent)

    async def wait_until(self, predicate: Callable[[], bool], timeout: float | None) -> bool:
        """For event-loop callers: wait until `predicate()` (cheap: it runs with the lock held) or `timeout`
        seconds, holding no thread."""
        return await self._cond.wait_for_async(predicate, timeout)

    def acknowledge(self, deliveries: Sequence[int], rank: int = 0) -> list[int]:
        """The receiver, trainer rank `rank`, has these deliveries; returns those it may not keep (they went back
        to the queue, or were never its own in this buffer's life), which will be delivered again. A delivery
        still out to another rank is refused whole (nothing acknowledged): its own rank may yet claim it."""
        limit = self.config.pull.max_groups
        if len(deliveries) > limit:
            raise TooLarge(f"{len(deliveries)} deliveries, over the limit of {limit}", field="deliveries")
        with self._cond:
            for i, delivery in enumerate(deliveries):
                if delivery < 1:
                    raise InvalidInput(f"must be at least 1, got {delivery}", field=f"deliveries[{i}]")
                self.store.check_delivery(delivery, field=f"deliveries[{i}]")
            self._return_overdue()
            for i, delivery in enumerate(deliveries):
                receiver = self._receivers.get(delivery, rank)
                if receiver != rank:
                    raise NotYours(f"delivery {delivery} went to rank {receiver}'s stream, not rank {rank}'s: "
                                         f"only its receiver may acknowledge it", field=f"deliveries[{i}]")
            fresh = sorted({d for d in deliveries if d in self.store.unacked})
            if fresh:
                self._log(Kind.ACKED, {"deliveries": fresh})
                for delivery in fresh:
                    del self._ack_deadlines[delivery]
                    del self._receivers[delivery]
            return [d for d in deliveries if d not in self.store.delivered]

    def commit(self, delivery: int, *, resume: bool = False) -> None:
        with self._cond:
            self.store.check_delivery(delivery)
            if resume:
                self._log(Kind.RESUME, {"delivery": delivery})
                self._cond.notify_all()
            elif delivery > self.store.committed:
                self._log(Kind.COMMIT, {"delivery": delivery})
        self._roll_when_due()

    def set_policy_version(self, version: int, training_finished: bool = False) -> None:
        """Going back is allowed: a trainer that resumed from an older checkpoint counts from there again.
        `training_finished`: the trainer made its last step, so no more leases go out until a trainer sets a
        version without it (logged, so a restarted buffer keeps it)."""
        with self._cond:
            highest = self.policy_version + self.config.validation.max_version_jump
            if not 0 <= version <= highest:
                raise InvalidInput(f"expected 0 to {highest} (the current {self.policy_version} plus "
                                   f"validation.max_version_jump), got {version}", field="version")
            if training_finished and not self.training_finished:
                log.info("the trainer has finished: no more prompts are leased until a trainer trains again")
            if (version, training_finished) != (self.policy_version, self.training_finished):
                self._log(Kind.VERSION, {"version": version, "training_finished": training_finished})
                self._cond.notify_all()
            # Weights the trainer does not have made these: it went back to an older checkpoint, or it is another
            # run's trainer on this buffer's log (a run folder reused without --resume). They are dropped as the
            # pushes of such groups are refused (validation.max_version_ahead).
            ahead = [group for group in list(self.store.queue.values())
                     if group.version > version + self.config.validation.max_version_ahead]
            for group in ahead:
                self._log(Kind.STALE, {"gid": group.gid})
        if ahead:
            log.warning("dropped %d queued groups sampled by policy versions up to %d, ahead of the trainer's %d "
                        "(weights it does not have)", len(ahead), max(group.version for group in ahead), version)

    def stats(self) -> dict[str, Any]:
        with self._cond:
            self.leases.expire()
            self._return_overdue()
            return {
                "unacknowledged": len(self.store.unacked),
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


class PullStream:
    """One PullBatch: what it sent, how many groups it still wants, until when it may wait for them."""

    def __init__(self, buffer: Buffer, rank: int, wanted: int, deadline: float):
        self.buffer = buffer
        self.rank = rank
        self.wanted = wanted
        self.deadline = deadline  # by the buffer's clock, as every deadline of the buffer is
        self.sent: list[int] = []

    def take(self) -> Pulled | None:
        """The next group or the end-of-data mark; None when there is neither for now."""
        item = self.buffer.take_for(self)
        if item is not None and item.payload is not None:
            self.sent.append(item.delivery)
            self.wanted -= 1
        return item

    def take_all(self) -> list[Pulled]:
        """What take() gives now, up to what the stream still wants, its end-of-data mark, or about
        TAKE_ALL_BYTES (groups sent again are read from the log: a stream holds no more of them unsent)."""
        items, size = [], 0
        while self.wanted and size < TAKE_ALL_BYTES and (item := self.take()) is not None:
            items.append(item)
            if item.payload is None:
                break
            size += len(item.payload)
        return items

    def ready(self) -> bool:
        """Whether take() may give something now; cheap, for a waiter's predicate (the lock held)."""
        buffer = self.buffer
        return bool(buffer.store.queue) or buffer.finished_for(self) or buffer.next_ack_due() <= buffer.clock()

    def may_wait(self) -> bool:
        return self.buffer.clock() < self.deadline

    def wait_seconds(self) -> float:
        """How long to wait before looking again: until the wait is over or a delivery falls due."""
        now = self.buffer.clock()
        return max(0.0, min(self.deadline, self.buffer.next_ack_due()) - now)

    def close(self) -> None:
        self.buffer.stream_ended(self.sent)
