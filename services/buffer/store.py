"""Experience held between rollout workers and the trainer: a bounded queue, who pushed what, and
what was delivered but not yet committed."""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable
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
    payload: bytes | None  # None once delivered: the write-ahead log keeps it until the commit


class ExperienceStore:
    """Groups in arrival order, each delivered to exactly one puller; the bytes of delivered groups are
    dropped from memory and read back from the log only if a restarted trainer asks for them again."""

    def __init__(self, *, max_groups: int, max_bytes: int):
        self.max_groups = max_groups
        self.max_bytes = max_bytes
        self.queue: OrderedDict[int, StoredGroup] = OrderedDict()
        self.queued_bytes = 0
        self.delivered: OrderedDict[int, StoredGroup] = OrderedDict()
        self.uncommitted_bytes = 0
        self.next_gid = 1
        self.next_delivery = 1
        self.committed = 0

    def has_room(self, size: int) -> bool:
        """Room for one more group of `size` bytes; an empty queue takes any group so none waits forever."""
        if not self.queue:
            return True
        return len(self.queue) < self.max_groups and self.queued_bytes + size <= self.max_bytes

    @property
    def full(self) -> bool:
        return len(self.queue) >= self.max_groups or self.queued_bytes >= self.max_bytes

    def add(self, group: StoredGroup, *, front: bool = False) -> None:
        self.queue[group.gid] = group
        if front:
            self.queue.move_to_end(group.gid, last=False)
        self.queued_bytes += group.size
        self.next_gid = max(self.next_gid, group.gid + 1)

    def peek(self) -> StoredGroup | None:
        return next(iter(self.queue.values()), None)

    def remove(self, gid: int) -> StoredGroup:
        group = self.queue.pop(gid)
        self.queued_bytes -= group.size
        return group

    def deliver(self, gid: int, delivery: int) -> StoredGroup:
        """Hand a queued group out under delivery number `delivery`; returns it with its bytes."""
        group = self.remove(gid)
        self.delivered[delivery] = StoredGroup(group.gid, group.size, group.version, group.location, None)
        self.uncommitted_bytes += group.size
        self.next_delivery = max(self.next_delivery, delivery + 1)
        return group

    def check_delivery(self, delivery: int, field: str = "delivery") -> None:
        if not 0 <= delivery < self.next_delivery:
            raise InvalidInput(f"delivery {delivery} was never made (the last is {self.next_delivery - 1})",
                               field=field)

    def commit(self, delivery: int) -> None:
        """Every delivery up to `delivery` is consumed for good."""
        while self.delivered and next(iter(self.delivered)) <= delivery:
            _, group = self.delivered.popitem(last=False)
            self.uncommitted_bytes -= group.size
        self.committed = max(self.committed, delivery)

    def redeliver_after(self, delivery: int, load: Callable[[Location], bytes]) -> int:
        """Put every group delivered after `delivery` back at the head of the queue, in delivery order."""
        again = [d for d in self.delivered if d > delivery]
        for number in reversed(again):
            group = self.delivered.pop(number)
            self.uncommitted_bytes -= group.size
            group.payload = load(group.location)
            self.add(group, front=True)
        return len(again)
