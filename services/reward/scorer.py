"""RewardScorer: the reward service's core. Validates requests, admits them within a bounded
backlog, runs them on the right lane (math workers or code sandbox) and prices the verdict.

Scoring runs on threads (the verifiers block on worker processes and sandboxes); callers await it
from an event loop, so a caller that waits holds no thread."""

from __future__ import annotations

import asyncio
import json
import reprlib
import threading
import time
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from zerobubble.common.errors import InvalidInput, Overloaded, TooLarge, Unavailable, check_size
from zerobubble.reward.config import RewardServiceConfig
from zerobubble.reward.metrics import RewardMetrics
from zerobubble.reward.verifiers import ScoreItem, Verdict, price

_TIME_LIMITS = {"timeout", "time_limit"}


@dataclass(frozen=True)
class Score:
    id: str
    reward: float
    verdict: Verdict
    seconds: float


class FairLane:
    """Runs work on `workers` threads, taking turns between the sources that submit it (a stream, a
    batch, a single call): each free thread takes the oldest item of the next source in turn, so a
    source with many items waiting delays another's single item by at most one item each, instead
    of by its whole backlog."""

    def __init__(self, workers: int, name: str):
        self._queues: dict[object, deque[tuple[Future, Callable, tuple]]] = {}
        self._turns: deque[object] = deque()
        self._cond = threading.Condition()
        self._closed = False
        # Daemon threads: a verifier stuck past its own time limit must not hold the process's exit.
        for index in range(workers):
            threading.Thread(target=self._work, name=f"{name}-{index}", daemon=True).start()

    def submit(self, source: object, fn: Callable, *args: Any) -> Future:
        future: Future = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("the lane is closed")
            queue = self._queues.get(source)
            if queue is None:
                queue = self._queues[source] = deque()
                self._turns.append(source)
            queue.append((future, fn, args))
            self._cond.notify()
        return future

    def _take(self) -> tuple[Future, Callable, tuple] | None:
        with self._cond:
            self._cond.wait_for(lambda: self._turns or self._closed)
            if self._closed:
                return None
            source = self._turns.popleft()
            queue = self._queues[source]
            work = queue.popleft()
            if queue:
                self._turns.append(source)
            else:
                del self._queues[source]
            return work

    def _work(self) -> None:
        while (work := self._take()) is not None:
            future, fn, args = work
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to whoever awaits the future
                future.set_exception(exc)
            else:
                future.set_result(result)

    def close(self) -> None:
        """Cancel what has not started; what runs finishes on its own."""
        with self._cond:
            self._closed = True
            waiting = [future for queue in self._queues.values() for future, _, _ in queue]
            self._queues.clear()
            self._turns.clear()
            self._cond.notify_all()
        for future in waiting:
            future.cancel()


def lane_widths(config: RewardServiceConfig) -> dict[str, int]:
    """Threads per lane. Math and custom verifiers share the worker processes; the reward model's lane holds
    two batches of waiting items, so the next batch fills while one runs; a combination waits on its parts'
    lanes' resources, so it may have as many items going as they have."""
    widths = {"math": config.math.workers, "code": config.sandbox.slots}
    if config.reward_model is not None:
        widths["model"] = 2 * config.reward_model.batch_size
    if config.combined_verifiers:
        widths["combined"] = sum(widths.values())
    return widths


def check_batch_size(count: int, limit: int, field: str = "items") -> None:
    """Refuse a batch by its item count; callers check it before any per-item work."""
    if count > limit:
        raise TooLarge(f"{count} items exceed limits.max_batch_items={limit}", field=field)


class RewardScorer:
    def __init__(self, config: RewardServiceConfig, verifiers: dict, metrics: RewardMetrics,
                 unavailable: dict[str, str] | None = None):
        self.config = config
        self.verifiers = verifiers
        self.unavailable = unavailable or {}
        self.metrics = metrics
        self._lanes = {name: FairLane(width, name) for name, width in lane_widths(config).items()}
        self._pending = 0
        self._lock = threading.Lock()
        metrics.queue_depth.set_function(lambda: self._pending)

    # -- validation ---------------------------------------------------------------------------
    def validate(self, item: ScoreItem, where: str = "") -> None:
        """Raise InvalidInput/TooLarge naming the field (prefixed by `where`, e.g. 'items[3].'). Sizes are checked
        before anything else reads the item, and no message repeats more than a few characters of it."""
        limits = self.config.limits
        check_size(item.id, limits.max_id_bytes, f"{where}id", "limits.max_id_bytes")
        check_size(item.response, limits.max_response_bytes, f"{where}response", "limits.max_response_bytes")
        check_size(item.prompt, limits.max_prompt_bytes, f"{where}prompt", "limits.max_prompt_bytes")
        if item.metadata is not None:
            check_size(json.dumps(item.metadata, separators=(",", ":")), limits.max_metadata_bytes,
                       f"{where}metadata", "limits.max_metadata_bytes")
        if item.verifier in self.unavailable:
            raise Unavailable(self.unavailable[item.verifier], field=f"{where}verifier")
        verifier = self.verifiers.get(item.verifier)
        if verifier is None:
            known = ", ".join(sorted([*self.verifiers, *self.unavailable]))
            raise InvalidInput(f"unknown verifier {reprlib.repr(item.verifier)} (known: {known})",
                               field=f"{where}verifier")
        if verifier.ground_truth == "none":
            return
        if verifier.ground_truth == "gt_answer":
            if not item.gt_answer or not item.gt_answer.strip():
                raise InvalidInput(f"verifier {item.verifier!r} needs a ground-truth answer", field=f"{where}gt_answer")
            check_size(item.gt_answer, limits.max_answer_bytes, f"{where}gt_answer", "limits.max_answer_bytes")
            return
        self._validate_tests(item, where)

    def _validate_tests(self, item: ScoreItem, where: str) -> None:
        limits = self.config.limits
        field = f"{where}test_cases"
        if item.test_inputs is None or item.test_outputs is None:
            raise InvalidInput(f"verifier {item.verifier!r} needs test cases (inputs and outputs)", field=field)
        if not item.test_inputs:
            raise InvalidInput("no test cases given", field=f"{field}.inputs")
        if len(item.test_inputs) != len(item.test_outputs):
            raise InvalidInput(
                f"{len(item.test_inputs)} inputs but {len(item.test_outputs)} outputs", field=f"{field}.outputs"
            )
        if len(item.test_inputs) > limits.max_test_cases:
            raise TooLarge(f"{len(item.test_inputs)} tests exceed the limit of {limits.max_test_cases}", field=field)
        size = sum(len(s.encode()) for s in (*item.test_inputs, *item.test_outputs))
        if size > limits.max_test_bytes:
            raise TooLarge(f"{size} bytes of tests exceed the limit of {limits.max_test_bytes} "
                           "(limits.max_test_bytes)", field=field)

    # -- admission ----------------------------------------------------------------------------
    def _admit(self, count: int) -> None:
        with self._lock:
            if self._pending + count > self.config.limits.max_pending_items:
                self.metrics.rejected.labels("overloaded").inc(count)
                raise Overloaded(
                    f"{self._pending} items in progress; {count} more would exceed "
                    f"limits.max_pending_items={self.config.limits.max_pending_items}, retry later"
                )
            self._pending += count

    def _release(self, _future: Future) -> None:
        with self._lock:
            self._pending -= 1

    @property
    def pending(self) -> int:
        return self._pending

    # -- scoring ------------------------------------------------------------------------------
    def _run(self, item: ScoreItem) -> Score:
        verifier = self.verifiers[item.verifier]
        start = time.perf_counter()
        verdict = verifier.check(item)
        seconds = time.perf_counter() - start
        reward = price(verdict, self.config.rewards, item.partial_credit)
        outcome = "correct" if verdict.answer_ok else (verdict.reason or "wrong")
        self.metrics.requests.labels(item.verifier, outcome).inc()
        self.metrics.latency.labels(item.verifier).observe(seconds)
        if verdict.reason in _TIME_LIMITS:
            self.metrics.timeouts.labels(item.verifier).inc()
        return Score(item.id, reward, verdict, seconds)

    def _submit(self, item: ScoreItem, source: object) -> asyncio.Future:
        """Run an admitted item on its lane, in `source`'s turn. Awaitable on the running loop;
        cancelling it before it starts takes it off the lane."""
        future = self._lanes[self.verifiers[item.verifier].lane].submit(source, self._run, item)
        future.add_done_callback(self._release)
        return asyncio.wrap_future(future)

    async def score(self, item: ScoreItem) -> Score:
        self.validate(item)
        self._admit(1)
        return await self._submit(item, source=object())

    async def score_batch(self, items: list[ScoreItem]) -> list[Score]:
        """All items are validated before any is accepted, so a bad item refuses the whole batch. The
        batch takes its turns on the lanes as one source."""
        check_batch_size(len(items), self.config.limits.max_batch_items)
        for index, item in enumerate(items):
            self.validate(item, where=f"items[{index}].")
        self._admit(len(items))
        source = object()
        return list(await asyncio.gather(*(self._submit(item, source) for item in items)))

    async def score_stream(self, items: AsyncIterable[ScoreItem], window: int) -> AsyncIterator[Score]:
        """Scores as they finish. At most `window` items of this stream are in progress, so a fast
        sender is slowed down rather than queued without bound; the stream takes its turns on the
        lanes as one source. A bad item ends the stream with its error only after every item accepted
        before it has been answered. Closing the generator early takes the stream's items that have
        not started off the lanes."""
        source = object()
        room = asyncio.Semaphore(window)
        finished: asyncio.Queue[asyncio.Future] = asyncio.Queue()
        in_progress: set[asyncio.Future] = set()

        async def feed() -> None:
            index = 0
            async for item in items:
                self.validate(item, where=f"stream item {index}{f' (id {item.id!r})' if item.id else ''}: ")
                index += 1
                await room.acquire()
                self._admit(1)
                future = self._submit(item, source)
                in_progress.add(future)
                future.add_done_callback(finished.put_nowait)

        feeder = asyncio.create_task(feed())
        # The feeder's end is an event of the same queue, so the loop below never waits past it.
        feeder.add_done_callback(finished.put_nowait)
        try:
            while not (feeder.done() and not in_progress):
                done = await finished.get()
                if done is not feeder:
                    in_progress.discard(done)
                    room.release()
                    yield done.result()
            feeder.result()
        finally:
            feeder.cancel()
            for future in in_progress:
                future.cancel()

    def close(self) -> None:
        for lane in self._lanes.values():
            lane.close()
