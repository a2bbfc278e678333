"""Which prompt of which epoch is handed out, to whom, until when, and which are finished.

A prompt is finished when a group for it is accepted (stored or filtered). Lease state is not
persisted: after a restart every unfinished prompt is available again, in its epoch's order, so the
epoch position is exactly the set of finished prompts, which the write-ahead log does keep.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from zerobubble.buffer.prompts import PromptSource
from zerobubble.common.errors import InvalidInput

PromptKey = tuple[int, int]  # (epoch, position in the prompt file)
MAX_LEASE_ID_CHARS = 40  # "incarnation.number": two 64-bit numbers and the dot


@dataclass
class Lease:
    lease_id: str
    worker_id: str
    expires_at: float
    # Insertion-ordered, so a worker gets its prompts in the epoch's order.
    prompts: dict[PromptKey, None] = field(default_factory=dict)


class EpochState:
    def __init__(self, order: np.ndarray, done: np.ndarray | None = None):
        self.order = order
        self.cursor = 0
        self.requeued: deque[int] = deque()
        self.done = np.zeros(len(order), dtype=bool) if done is None else done
        self.done_count = int(self.done.sum())
        self.leased: dict[int, str] = {}

    def available(self, index: int) -> bool:
        return not self.done[index] and index not in self.leased

    def take(self) -> int | None:
        """The next prompt to hand out: returned ones first, then onwards in the epoch's order."""
        while self.requeued:
            index = self.requeued.popleft()
            if self.available(index):
                return index
        while self.cursor < len(self.order):
            index = int(self.order[self.cursor])
            self.cursor += 1
            if self.available(index):
                return index
        return None

    @property
    def finished(self) -> bool:
        return self.done_count == len(self.order)


class PromptLeases:
    """Hands prompts out epoch by epoch; an epoch opens once the previous one has nothing left to hand out."""

    def __init__(
        self,
        source: PromptSource,
        *,
        epochs: int,
        timeout_seconds: float,
        incarnation: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.source = source
        self.total_epochs = epochs
        self.timeout_seconds = timeout_seconds
        self.incarnation = incarnation
        self.clock = clock
        self.epochs: dict[int, EpochState] = {}
        self.next_epoch = 0
        self.leases: dict[str, Lease] = {}
        self._expiries: list[tuple[float, str]] = []
        self._issued = 0
        self.expirations = 0

    def _open(self, epoch: int) -> None:
        while self.next_epoch <= epoch:
            self.epochs[self.next_epoch] = EpochState(self.source.order(self.next_epoch))
            self.next_epoch += 1

    def restore(self, next_epoch: int, done: dict[int, np.ndarray]) -> None:
        """State from a snapshot: epochs below `next_epoch` not in `done` are finished."""
        self.next_epoch = next_epoch
        self.epochs = {e: EpochState(self.source.order(e), bits) for e, bits in done.items()}

    def snapshot(self) -> tuple[int, dict[int, np.ndarray]]:
        return self.next_epoch, {e: state.done.copy() for e, state in self.epochs.items()}

    @property
    def epoch(self) -> int:
        """The oldest epoch with unfinished prompts (the total when all are finished)."""
        return min(self.epochs, default=self.next_epoch)

    @property
    def end_of_data(self) -> bool:
        return self.next_epoch == self.total_epochs and not self.epochs

    def finished_in(self, epoch: int) -> int:
        """Prompts of `epoch` already finished (for schedules over an epoch, such as temperature annealing)."""
        if epoch in self.epochs:
            return self.epochs[epoch].done_count
        return len(self.source) if epoch < self.next_epoch else 0

    def key_of(self, prompt_id: str, epoch: int, field_prefix: str = "prompt") -> PromptKey:
        index = self.source.index_of.get(prompt_id)
        if index is None:
            raise InvalidInput(f"unknown prompt id {prompt_id!r}", field=f"{field_prefix}.prompt_id")
        if not 0 <= epoch < self.total_epochs:
            raise InvalidInput(f"epoch {epoch} is not in [0, {self.total_epochs})",
                               field=f"{field_prefix}.epoch")
        return epoch, index

    def is_done(self, key: PromptKey) -> bool:
        epoch, index = key
        if epoch >= self.next_epoch:
            return False
        state = self.epochs.get(epoch)
        return state is None or bool(state.done[index])

    def mark_done(self, key: PromptKey) -> None:
        """Finish a prompt (whoever holds it); the caller has checked `is_done` first."""
        epoch, index = key
        self._open(epoch)
        state = self.epochs[epoch]
        holder = state.leased.pop(index, None)
        if holder is not None:
            self.leases[holder].prompts.pop(key, None)
        state.done[index] = True
        state.done_count += 1
        if state.finished:
            del self.epochs[epoch]

    @property
    def outstanding(self) -> int:
        """Prompts out on lease: groups on their way to the queue."""
        return sum(len(lease.prompts) for lease in self.leases.values())

    def lease(self, worker_id: str, count: int) -> Lease | None:
        """Up to `count` prompts under a new lease, or None when none is available now."""
        taken: list[PromptKey] = []
        epoch = min(self.epochs, default=self.next_epoch)
        while len(taken) < count and epoch < self.total_epochs:
            if epoch not in self.epochs:
                if epoch >= self.next_epoch:
                    self._open(epoch)
                else:
                    epoch += 1
                    continue
            index = self.epochs[epoch].take()
            if index is None:
                epoch += 1
            else:
                taken.append((epoch, index))
        if not taken:
            return None
        lease = Lease(f"{self.incarnation}.{self._issued}", worker_id, self.clock() + self.timeout_seconds)
        self._issued += 1
        for key in taken:
            self.epochs[key[0]].leased[key[1]] = lease.lease_id
            lease.prompts[key] = None
        self.leases[lease.lease_id] = lease
        heapq.heappush(self._expiries, (lease.expires_at, lease.lease_id))
        return lease

    def check_lease_id(self, lease_id: str, field: str = "lease_id") -> None:
        """Refuse an id this buffer never issued; expired, completed and pre-restart ones are fine."""
        incarnation, dot, number = lease_id.partition(".")
        # isdigit() admits characters int() refuses ("²"), and int() refuses thousands of digits.
        if not (dot and incarnation.isdecimal() and number.isdecimal() and len(lease_id) <= MAX_LEASE_ID_CHARS):
            raise InvalidInput(f"{lease_id[:MAX_LEASE_ID_CHARS]!r} is not a lease id", field=field)
        if int(incarnation) > self.incarnation or (
            int(incarnation) == self.incarnation and int(number) >= self._issued
        ):
            raise InvalidInput(f"unknown lease {lease_id!r}", field=field)

    def complete(self, lease_id: str, indices: Iterable[int] | None = None) -> None:
        """The worker is finished with these prompts (positions in the file; all when None): unfinished
        ones go back to the queue. Completing an expired or already completed lease does nothing."""
        self.check_lease_id(lease_id)
        lease = self.leases.get(lease_id)
        if lease is None:
            return
        wanted = None if indices is None else set(indices)
        for key in [k for k in lease.prompts if wanted is None or k[1] in wanted]:
            self._release(lease, key)
        if not lease.prompts:
            del self.leases[lease_id]

    def _release(self, lease: Lease, key: PromptKey) -> None:
        del lease.prompts[key]
        state = self.epochs[key[0]]
        del state.leased[key[1]]
        state.requeued.append(key[1])

    def expire(self) -> int:
        """Return the prompts of every lease past its time to the queue; how many leases expired."""
        now = self.clock()
        expired = 0
        while self._expiries and self._expiries[0][0] <= now:
            _, lease_id = heapq.heappop(self._expiries)
            lease = self.leases.pop(lease_id, None)
            if lease is None:
                continue
            for key in list(lease.prompts):
                self._release(lease, key)
            expired += 1
        self.expirations += expired
        return expired
