"""Experience held between rollout workers and the trainer: a bounded queue, who pushed what, and
what was delivered but not yet committed."""

from __future__ import annotations

import heapq
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from zerobubble.buffer.wal import Location
from zerobubble.common.errors import InvalidInput


@dataclass
class _SequenceWindow:
    floor: int = -1
    high: int = -1
    above: set[int] = field(default_factory=set)
    heap: list[int] = field(default_factory=list)  # `above` again, to find its smallest quickly


class ProducerDedup:
    """Which (producer_id, sequence) pairs were accepted, in bounded memory.

    Per producer: every sequence up to `floor` counts as seen, plus a set above it. Sequences
    normally arrive nearly in order, so the set stays small; a sequence older than the newest minus
    `window` counts as seen, which bounds the set, and past `max_producers` the least recently seen
    producer is forgotten (a prompt still gets one group per epoch: the prompt itself is deduplicated).
    """

    def __init__(self, *, window: int, max_producers: int):
        self.window = window
        self.max_producers = max_producers
        self._producers: OrderedDict[str, _SequenceWindow] = OrderedDict()

    def seen(self, producer_id: str, sequence: int) -> bool:
        entry = self._producers.get(producer_id)
        return entry is not None and (sequence <= max(entry.floor, entry.high - self.window)
                                      or sequence in entry.above)

    def record(self, producer_id: str, sequence: int) -> None:
        entry = self._producers.pop(producer_id, None) or _SequenceWindow()
        self._producers[producer_id] = entry
        if sequence > entry.floor and sequence not in entry.above:
            entry.above.add(sequence)
            heapq.heappush(entry.heap, sequence)
        entry.high = max(entry.high, sequence)
        entry.floor = max(entry.floor, entry.high - self.window)
        while entry.heap and entry.heap[0] <= entry.floor + 1:
            smallest = heapq.heappop(entry.heap)
            entry.above.discard(smallest)
            entry.floor = max(entry.floor, smallest)
        while len(self._producers) > self.max_producers:
            self._producers.popitem(last=False)

    def snapshot(self) -> dict[str, list]:
        return {p: [w.floor, w.high, sorted(w.above)] for p, w in self._producers.items()}

    def restore(self, state: dict[str, list]) -> None:
        self._producers = OrderedDict(
            (producer, _SequenceWindow(floor, high, set(above), sorted(above)))
            for producer, (floor, high, above) in state.items()
        )


@dataclass
class StoredGroup:
    gid: int
    size: int
    version: int
    location: Location
    payload: bytes | None  # None when it is to be read from the log: delivered, or recovered from a snapshot

    def entry(self) -> list[int]:
        """The group as a snapshot holds it: everything but its bytes."""
        return [self.gid, self.size, self.version, self.location.segment, self.location.offset]

    @classmethod
    def from_entry(cls, entry: list[int], payload: bytes | None = None) -> StoredGroup:
        gid, size, version, segment, offset = entry
        return cls(gid, size, version, Location(segment, offset), payload)


class ExperienceStore:
    """Groups in arrival order, each delivered to exactly one puller; the bytes of delivered groups are
    dropped from memory and read back from the log only if they have to go out again.

    A delivered group is `unacked` until its receiver acknowledges it; until then it may never have
    arrived, so a commit passes over it and `give_back` returns it to the queue.

    `live_segments` counts, per log segment, the groups in it that are queued or delivered and not
    committed: a segment whose count is zero holds nothing that is still needed."""

    def __init__(self, *, max_groups: int, max_bytes: int):
        self.max_groups = max_groups
        self.max_bytes = max_bytes
        self.queue: OrderedDict[int, StoredGroup] = OrderedDict()
        self.queued_bytes = 0
        self.delivered: OrderedDict[int, StoredGroup] = OrderedDict()
        self.unacked: set[int] = set()
        self.uncommitted_bytes = 0
        self.next_gid = 1
        self.next_delivery = 1
        self.committed = 0
        self.live_segments: Counter[int] = Counter()

    def has_room(self, size: int) -> bool:
        """Room for one more group of `size` bytes; an empty queue takes any group so none waits forever."""
        if not self.queue:
            return True
        return len(self.queue) < self.max_groups and self.queued_bytes + size <= self.max_bytes

    @property
    def full(self) -> bool:
        return len(self.queue) >= self.max_groups or self.queued_bytes >= self.max_bytes

    def add(self, group: StoredGroup) -> None:
        """A new group, at the end of the queue."""
        self._enqueue(group)
        self.live_segments[group.location.segment] += 1
        self.next_gid = max(self.next_gid, group.gid + 1)

    def _enqueue(self, group: StoredGroup, *, front: bool = False) -> None:
        self.queue[group.gid] = group
        if front:
            self.queue.move_to_end(group.gid, last=False)
        self.queued_bytes += group.size

    def _dequeue(self, gid: int) -> StoredGroup:
        group = self.queue.pop(gid)
        self.queued_bytes -= group.size
        return group

    def _forget(self, group: StoredGroup) -> None:
        segment = group.location.segment
        self.live_segments[segment] -= 1
        if not self.live_segments[segment]:
            del self.live_segments[segment]

    def peek(self) -> StoredGroup | None:
        return next(iter(self.queue.values()), None)

    def remove(self, gid: int) -> StoredGroup:
        """Drop a queued group for good."""
        group = self._dequeue(gid)
        self._forget(group)
        return group

    def deliver(self, gid: int, delivery: int, *, acked: bool = False) -> StoredGroup:
        """Hand a queued group out under delivery number `delivery`; returns it with its bytes."""
        group = self._dequeue(gid)
        self._add_delivered(delivery, group)
        if not acked:
            self.unacked.add(delivery)
        return group

    def _add_delivered(self, delivery: int, group: StoredGroup) -> None:
        self.delivered[delivery] = StoredGroup(group.gid, group.size, group.version, group.location, None)
        self.uncommitted_bytes += group.size
        self.next_delivery = max(self.next_delivery, delivery + 1)

    def check_delivery(self, delivery: int, field: str = "delivery") -> None:
        if not 0 <= delivery < self.next_delivery:
            raise InvalidInput(f"delivery {delivery} was never made (the last is {self.next_delivery - 1})",
                               field=field)

    def acknowledge(self, delivery: int) -> None:
        self.unacked.discard(delivery)

    def commit(self, delivery: int) -> None:
        """Every acknowledged delivery up to `delivery` is consumed for good."""
        for number in [d for d in self.delivered if d <= delivery and d not in self.unacked]:
            self._drop_delivered(number)
        self.committed = max(self.committed, delivery)

    def drop_delivered(self, deliveries: list[int]) -> None:
        """Forget deliveries whatever their state (their log segment is gone)."""
        for number in deliveries:
            self.unacked.discard(number)
            self._drop_delivered(number)

    def _drop_delivered(self, delivery: int) -> None:
        group = self.delivered.pop(delivery)
        self.uncommitted_bytes -= group.size
        self._forget(group)

    def give_back(self, deliveries: list[int]) -> None:
        """Put these delivered groups back at the head of the queue, in delivery order (their bytes are read
        from the log when they go out again)."""
        for number in sorted(deliveries, reverse=True):
            group = self.delivered.pop(number)
            self.unacked.discard(number)
            self.uncommitted_bytes -= group.size
            self._enqueue(group, front=True)

    def snapshot(self) -> dict[str, list]:
        return {
            "queued": [group.entry() for group in self.queue.values()],
            "delivered": [[delivery, *group.entry()] for delivery, group in self.delivered.items()],
            "unacked": sorted(self.unacked),
        }

    def restore(self, state: dict[str, list], payloads: dict[int, bytes | None]) -> None:
        """The groups of a snapshot (taken by `snapshot`), with the bytes in `payloads` where known."""
        for entry in state["queued"]:
            self.add(StoredGroup.from_entry(entry, payloads.get(entry[0])))
        for delivery, *entry in state["delivered"]:
            group = StoredGroup.from_entry(entry)
            self._add_delivered(delivery, group)
            self.live_segments[group.location.segment] += 1
            self.next_gid = max(self.next_gid, group.gid + 1)
        # Snapshots written before deliveries were acknowledged hold only deliveries counted as received.
        self.unacked = set(state.get("unacked", []))
