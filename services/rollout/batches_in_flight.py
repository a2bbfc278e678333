"""Leased batches played at once, up to a limit: the worker leases and starts the next batch while the last episodes
of the one before still play, so the engine's continuous batcher is never left with only a batch's slowest
episodes. With a limit of 1, the next batch is leased only when the last one has been played, as between_batches
weight updates need (a batch started on version v ends on v)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from zerobubble.common.config import ConfigError

Lease = TypeVar("Lease")


def check_batches_in_flight(batches: int, weight_updates: str, *, field: str = "generation.batches_in_flight"
                            ) -> None:
    """Refuse, before the engine loads, overlapping batches in a run that takes weights only between batches: no
    moment would be between two batches."""
    if batches > 1 and weight_updates == "between_batches":
        raise ConfigError(f"{field}: {batches} batches at once never leave a moment between "
                          "batches, where run.weight_updates between_batches takes new weights: set it to 1, or "
                          "weight_updates to between_turns or in_flight")


class BatchesInFlight(Generic[Lease]):
    def __init__(self, limit: int, play: Callable[[Lease], object], done: Callable[[object], None]):
        """`play(lease)` on a thread of its own for each batch started; `done(result)` with each result as its
        batch finishes (in the order they finish)."""
        self.limit = limit
        self._play = play
        self._done = done
        self._slots = threading.Semaphore(limit)
        self._playing: set[threading.Thread] = set()
        self._lock = threading.Lock()
        self.error: BaseException | None = None

    def take_slot(self, stop: threading.Event, poll_seconds: float = 0.2) -> bool:
        """Wait for room for one more batch; False when `stop` was set first. Each slot taken is given back by
        start() or by give_back()."""
        while not stop.is_set():
            if self._slots.acquire(timeout=poll_seconds):
                return True
        return False

    def give_back(self) -> None:
        """The slot of a batch that was not started after all (nothing was leased)."""
        self._slots.release()

    def start(self, lease: Lease) -> None:
        thread = threading.Thread(target=self._run, args=(lease,), name="rollout-batch", daemon=True)
        with self._lock:
            self._playing.add(thread)
        thread.start()

    def _run(self, lease: Lease) -> None:
        try:
            self._done(self._play(lease))
        except BaseException as exc:
            self.error = self.error or exc
        finally:
            with self._lock:
                self._playing.discard(threading.current_thread())
            self._slots.release()

    @property
    def playing(self) -> int:
        with self._lock:
            return len(self._playing)

    def drain(self) -> None:
        """Wait until every batch started has been played and handed on."""
        while True:
            with self._lock:
                playing = list(self._playing)
            if not playing:
                return
            for thread in playing:
                thread.join()
