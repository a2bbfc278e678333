"""A pool of math-verification worker processes with a per-item time limit.

A verification that hangs is killed when its time is up and one that crashes its process is
answered with a reason; either way the worker is replaced and the pool keeps serving.
"""

from __future__ import annotations

import logging
import multiprocessing
import queue
import threading
from dataclasses import dataclass

log = logging.getLogger(__name__)

_STARTUP_SECONDS = 120.0
_READY = "ready"


@dataclass(frozen=True)
class MathVerdict:
    answer_ok: bool
    reason: str = ""


def _worker_main(conn) -> None:
    from zerobubble.reward.math_judge import judge

    conn.send(_READY)
    while True:
        try:
            gold, answer = conn.recv()
        except (EOFError, OSError):
            return
        try:
            result = judge(gold, answer)
        except Exception as exc:  # noqa: BLE001 - any failure of the parser is a verdict, not a crash
            result = (False, "parse_error")
            log.debug("math judge failed on %r: %s", answer[:80], exc)
        conn.send(result)


class _Worker:
    # Spawned, not forked: the parent is a threaded gRPC server.
    _context = multiprocessing.get_context("spawn")

    def __init__(self):
        self._conn, child = self._context.Pipe()
        self.process = self._context.Process(target=_worker_main, args=(child,), daemon=True)
        self.process.start()
        child.close()
        self._ready = False

    def wait_ready(self, timeout: float) -> None:
        if self._ready:
            return
        if not self._conn.poll(timeout) or self._conn.recv() != _READY:
            raise TimeoutError("math worker did not start")
        self._ready = True

    def ask(self, gold: str, answer: str, timeout: float) -> tuple[bool, str]:
        self.wait_ready(_STARTUP_SECONDS)
        self._conn.send((gold, answer))
        if not self._conn.poll(timeout):
            raise TimeoutError
        return self._conn.recv()

    def kill(self) -> None:
        self.process.kill()
        self.process.join(5)
        self._conn.close()


class MathVerifierPool:
    """verify(gold, answer) from any thread; at most `workers` verifications run at once."""

    def __init__(self, workers: int, timeout_seconds: float):
        self.timeout_seconds = timeout_seconds
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._all: set[_Worker] = set()
        self._lock = threading.Lock()
        self.replaced = 0
        for _ in range(workers):
            self._idle.put(self._spawn())

    def _spawn(self) -> _Worker:
        worker = _Worker()
        with self._lock:
            self._all.add(worker)
        return worker

    def _replace(self, worker: _Worker) -> None:
        with self._lock:
            self._all.discard(worker)
            self.replaced += 1
        worker.kill()
        self._idle.put(self._spawn())

    def wait_ready(self, timeout: float = _STARTUP_SECONDS) -> None:
        with self._lock:
            workers = list(self._all)
        for worker in workers:
            worker.wait_ready(timeout)

    def worker_pids(self) -> list[int]:
        with self._lock:
            return [worker.process.pid for worker in self._all]

    def verify(self, gold: str, answer: str) -> MathVerdict:
        worker = self._idle.get()
        try:
            ok, reason = worker.ask(gold, answer, self.timeout_seconds)
        except TimeoutError:
            log.warning("math verification exceeded %.1fs; replacing its worker", self.timeout_seconds)
            self._replace(worker)
            return MathVerdict(False, "timeout")
        except (EOFError, OSError):
            log.warning("math worker died (exit code %s); replacing it", worker.process.exitcode)
            self._replace(worker)
            return MathVerdict(False, "worker_crash")
        self._idle.put(worker)
        return MathVerdict(ok, reason)

    def close(self) -> None:
        with self._lock:
            workers, self._all = list(self._all), set()
        for worker in workers:
            worker.kill()
