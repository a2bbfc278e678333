"""RewardScorer: the reward service's core. Validates requests, admits them within a bounded
backlog, runs them on the right lane (math workers or code sandbox) and prices the verdict."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from zerobubble.common.errors import InvalidInput, Overloaded, TooLarge, Unavailable
from zerobubble.reward.config import RewardServiceConfig
from zerobubble.reward.metrics import RewardMetrics
from zerobubble.reward.verifiers import ScoreItem, Verdict

_TIME_LIMITS = {"timeout", "time_limit"}


@dataclass(frozen=True)
class Score:
    id: str
    reward: float
    verdict: Verdict
    seconds: float


class RewardScorer:
    def __init__(self, config: RewardServiceConfig, verifiers: dict, metrics: RewardMetrics,
                 unavailable: dict[str, str] | None = None):
        self.config = config
        self.verifiers = verifiers
        self.unavailable = unavailable or {}
        self.metrics = metrics
        self._lanes = {
            "math": ThreadPoolExecutor(config.math.workers, thread_name_prefix="math"),
            "code": ThreadPoolExecutor(config.sandbox.slots, thread_name_prefix="code"),
        }
        self._pending = 0
        self._lock = threading.Lock()
        metrics.queue_depth.set_function(lambda: self._pending)

    # -- validation ---------------------------------------------------------------------------
    def validate(self, item: ScoreItem, where: str = "") -> None:
        """Raise InvalidInput/TooLarge naming the field (prefixed by `where`, e.g. 'items[3].')."""
        limits = self.config.limits
        if item.verifier in self.unavailable:
            raise Unavailable(self.unavailable[item.verifier], field=f"{where}verifier")
        verifier = self.verifiers.get(item.verifier)
        if verifier is None:
            known = ", ".join(sorted([*self.verifiers, *self.unavailable]))
            raise InvalidInput(f"unknown verifier {item.verifier!r} (known: {known})", field=f"{where}verifier")
        if len(item.response) > limits.max_response_chars:
            raise TooLarge(
                f"{len(item.response)} characters exceed the limit of {limits.max_response_chars}",
                field=f"{where}response",
            )
        if verifier.ground_truth == "gt_answer":
            if not item.gt_answer or not item.gt_answer.strip():
                raise InvalidInput(f"verifier {item.verifier!r} needs a ground-truth answer", field=f"{where}gt_answer")
            if len(item.gt_answer) > limits.max_answer_chars:
                raise TooLarge(f"longer than {limits.max_answer_chars} characters", field=f"{where}gt_answer")
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
        size = sum(len(s) for s in item.test_inputs) + sum(len(s) for s in item.test_outputs)
        if size > limits.max_test_bytes:
            raise TooLarge(f"{size} characters of tests exceed the limit of {limits.max_test_bytes}", field=field)

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
        rewards = self.config.rewards
        # Format never adds reward (as in the reference); code with partial credit pays per test.
        share = verdict.fraction if item.partial_credit else float(verdict.answer_ok)
        reward = rewards.wrong + (rewards.correct - rewards.wrong) * share
        outcome = "correct" if verdict.answer_ok else (verdict.reason or "wrong")
        self.metrics.requests.labels(item.verifier, outcome).inc()
        self.metrics.latency.labels(item.verifier).observe(seconds)
        if verdict.reason in _TIME_LIMITS:
            self.metrics.timeouts.labels(item.verifier).inc()
        return Score(item.id, reward, verdict, seconds)

    def _submit(self, item: ScoreItem) -> Future:
        future = self._lanes[self.verifiers[item.verifier].lane].submit(self._run, item)
        future.add_done_callback(self._release)
        return future

    def score(self, item: ScoreItem) -> Score:
        self.validate(item)
        self._admit(1)
        return self._submit(item).result()

    def start_batch(self, items: list[ScoreItem]) -> list[Future]:
        """Validate, admit and start every item without waiting for any; a caller on an event loop awaits
        the futures. All items are validated before any is accepted, so a bad item refuses the whole batch."""
        if len(items) > self.config.limits.max_batch_items:
            raise TooLarge(f"{len(items)} items exceed limits.max_batch_items", field="items")
        for index, item in enumerate(items):
            self.validate(item, where=f"items[{index}].")
        self._admit(len(items))
        return [self._submit(item) for item in items]

    def score_batch(self, items: list[ScoreItem]) -> list[Score]:
        return [future.result() for future in self.start_batch(items)]

    def score_stream(self, items: Iterable[ScoreItem], window: int) -> Iterator[Score]:
        """Scores as they finish. At most `window` items of this stream are in progress, so a fast
        sender is slowed down rather than queued without bound. A bad item ends the stream with its
        error only after every item accepted before it has been answered."""
        in_flight: set[Future] = set()
        done = threading.Condition()
        finished: list[Future] = []
        failure: list[Exception] = []

        def on_done(future: Future) -> None:
            with done:
                finished.append(future)
                done.notify_all()

        def feed() -> None:
            try:
                for index, item in enumerate(items):
                    where = f"stream item {index}{f' (id {item.id!r})' if item.id else ''}: "
                    self.validate(item, where=where)
                    with done:
                        done.wait_for(lambda: len(in_flight) - len(finished) < window)
                    self._admit(1)
                    future = self._submit(item)
                    with done:
                        in_flight.add(future)
                    future.add_done_callback(on_done)
            except Exception as exc:  # noqa: BLE001 - handed to the consumer below
                failure.append(exc)
            finally:
                with done:
                    feeding.clear()
                    done.notify_all()

        feeding = threading.Event()
        feeding.set()
        threading.Thread(target=feed, name="score-stream-feed", daemon=True).start()
        answered = 0
        while True:
            with done:
                done.wait_for(lambda seen=answered: len(finished) > seen or not feeding.is_set())
                ready = finished[answered:]
                over = not feeding.is_set() and answered + len(ready) == len(in_flight)
            for future in ready:
                yield future.result()
            answered += len(ready)
            if over:
                break
        if failure:
            raise failure[0]

    def close(self) -> None:
        for lane in self._lanes.values():
            lane.shutdown(wait=False, cancel_futures=True)
