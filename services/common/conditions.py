"""A threading.Condition that event-loop code can wait on too, so a core can stay threaded while the
gRPC handlers that wait for it are coroutines that hold no thread while they wait."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def _wake(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


class AwaitableCondition(threading.Condition):
    """Threads use it as a threading.Condition (`with cond`, `wait_for`, `notify_all`); coroutines
    `await cond.wait_for_async(predicate, timeout)`, which parks a future instead of a thread, so a
    thousand idle streams cost a thousand futures.

    A core swaps `threading.Condition()` for `AwaitableCondition()` and changes nothing else: every
    `notify`/`notify_all` (made, as always, with the lock held) also wakes the waiting coroutines,
    each of which re-checks its predicate. The predicate runs on the event loop with the lock held,
    so it must be cheap and the core must not hold the lock across slow work (it would stall every
    handler of the service, not one thread).
    """

    def __init__(self, lock: threading.Lock | threading.RLock | None = None):
        super().__init__(lock)
        self._coroutine_waiters: dict[asyncio.Future, asyncio.AbstractEventLoop] = {}

    def notify(self, n: int = 1) -> None:
        super().notify(n)
        # All of them, not n: a coroutine whose predicate is still false simply waits again.
        for future, loop in self._coroutine_waiters.items():
            loop.call_soon_threadsafe(_wake, future)
        self._coroutine_waiters.clear()

    async def wait_for_async(self, predicate: Callable[[], T], timeout: float | None = None) -> T:
        """Await until `predicate()` is true or `timeout` seconds have passed; returns its last value."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            with self:
                result = predicate()
                if result or (deadline is not None and loop.time() >= deadline):
                    return result
                # Registered under the lock: a notify cannot fall between the check and the wait.
                wakeup = loop.create_future()
                self._coroutine_waiters[wakeup] = loop
            try:
                await asyncio.wait([wakeup], timeout=None if deadline is None else deadline - loop.time())
            finally:
                with self:
                    self._coroutine_waiters.pop(wakeup, None)
