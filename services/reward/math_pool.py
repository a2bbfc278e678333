"""A pool of verification worker processes with a per-item time limit: math_verify, and the custom verifiers
users bring (services/reward/custom.py), never run in the server process.

A verification that hangs is killed when its time is up and one that crashes its process is answered with a
reason; either way the worker is replaced and the pool keeps serving. Workers and the pool speak JSON over
the pipe, and a reply is read only up to a bounded size, so whatever a worker's code does, the server
unpickles nothing from it and never holds more than that bound of its output.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from zerobubble.common.config import ConfigError

log = logging.getLogger(__name__)

_STARTUP_SECONDS = 120.0
_READY = "ready"
# A reply is a verdict: a few flags, a reason and an extracted answer (bounded by the worker).
_MAX_REPLY_BYTES = 1024 * 1024


@dataclass(frozen=True)
class CustomSpec:
    """What a worker imports at start: the callable `function` (module:name), from `path` when given. `field`
    names its config entry in errors."""

    name: str
    function: str
    path: str | None
    field: str


@dataclass(frozen=True)
class MathVerdict:
    answer_ok: bool
    reason: str = ""


@dataclass(frozen=True)
class CustomVerdict:
    """A custom verifier's result; answer_ok/format_ok are None when the callable returned a bare number."""

    reward: float
    answer_ok: bool | None
    format_ok: bool | None
    extracted: str
    reason: str


class WorkerFailed(Exception):
    """The worker hung, died or answered out of contract; `reason` is the item's reason."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _worker_main(conn, specs: Sequence[CustomSpec], max_extracted_bytes: int) -> None:
    from zerobubble.reward.custom import call_custom, import_callable
    from zerobubble.reward.math_judge import judge

    callables = {}
    for spec in specs:
        try:
            callables[spec.name] = import_callable(spec.function, spec.path)
        except Exception as exc:  # noqa: BLE001 - reported to the pool, which refuses to start
            conn.send_bytes(json.dumps(["import_error", spec.field, str(exc)]).encode())
            return
    conn.send_bytes(json.dumps([_READY]).encode())
    while True:
        try:
            kind, *args = json.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        if kind == "math":
            gold, answer = args
            try:
                reply = judge(gold, answer)
            except Exception as exc:  # noqa: BLE001 - any failure of the parser is a verdict, not a crash
                reply = (False, "parse_error")
                log.debug("math judge failed on %r: %s", answer[:80], exc)
        else:
            name, response, ground_truth, metadata = args
            reply = call_custom(callables[name], response, ground_truth, metadata, max_extracted_bytes)
        conn.send_bytes(json.dumps(reply).encode())


class _Worker:
    # Spawned, not forked: the parent is a threaded gRPC server.
    _context = multiprocessing.get_context("spawn")

    def __init__(self, specs: Sequence[CustomSpec], max_extracted_bytes: int):
        self._conn, child = self._context.Pipe()
        self.process = self._context.Process(target=_worker_main, args=(child, list(specs), max_extracted_bytes),
                                             daemon=True)
        self.process.start()
        child.close()
        self._ready = False

    def wait_ready(self, timeout: float) -> None:
        if self._ready:
            return
        try:
            if not self._conn.poll(timeout):
                raise TimeoutError("verification worker did not start")
            first = json.loads(self._conn.recv_bytes(_MAX_REPLY_BYTES))
        except (EOFError, OSError):
            raise WorkerExited(f"verification worker exited at start (exit code {self.process.exitcode})") from None
        if first[0] == "import_error":
            _, field, message = first
            raise ConfigError(f"{field}: cannot import it: {message}")
        self._ready = True

    def ask(self, message: list, timeout: float) -> Any:
        self.wait_ready(_STARTUP_SECONDS)
        self._conn.send_bytes(json.dumps(message).encode())
        if not self._conn.poll(timeout):
            raise TimeoutError
        try:
            return json.loads(self._conn.recv_bytes(_MAX_REPLY_BYTES))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise WorkerFailed("bad_result: the worker's reply is not JSON") from None

    def kill(self) -> None:
        self.process.kill()
        self.process.join(5)
        self._conn.close()


class WorkerExited(RuntimeError):
    """A worker died before it was ready (a start that cannot import is a ConfigError instead)."""


def _fields(reply: Any, *types: tuple[type, ...]) -> list:
    """The reply's fields, checked against `types`; a reply of another shape is out of contract."""
    if not isinstance(reply, list) or len(reply) != len(types) or not all(
            isinstance(value, kinds) for value, kinds in zip(reply, types, strict=True)):
        raise WorkerFailed("bad_result: the worker's reply is out of contract")
    return reply


class VerifierPool:
    """verify(gold, answer) and custom(name, ...) from any thread; at most `workers` run at once."""

    def __init__(self, workers: int, timeout_seconds: float, custom: Sequence[CustomSpec] = (),
                 max_extracted_bytes: int = 16 * 1024):
        self.timeout_seconds = timeout_seconds
        self._specs = list(custom)
        self._max_extracted_bytes = max_extracted_bytes
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._all: set[_Worker] = set()
        self._lock = threading.Lock()
        self.replaced = 0
        for _ in range(workers):
            self._idle.put(self._spawn())

    def _spawn(self) -> _Worker:
        worker = _Worker(self._specs, self._max_extracted_bytes)
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
        """Raise ConfigError naming the entry whose callable a worker could not import."""
        with self._lock:
            workers = list(self._all)
        for worker in workers:
            worker.wait_ready(timeout)

    def worker_pids(self) -> list[int]:
        with self._lock:
            return [worker.process.pid for worker in self._all]

    def _ask(self, message: list, what: str) -> Any:
        worker = self._idle.get()
        try:
            reply = worker.ask(message, self.timeout_seconds)
        except TimeoutError:
            log.warning("%s exceeded %.1fs; replacing its worker", what, self.timeout_seconds)
            self._replace(worker)
            raise WorkerFailed("timeout") from None
        except (EOFError, OSError, WorkerExited):
            # WorkerExited: killed before it was ready. OSError also when the reply is over _MAX_REPLY_BYTES: the
            # pipe is left mid-message.
            log.warning("%s: worker died or overflowed its pipe (exit code %s); replacing it", what,
                        worker.process.exitcode)
            self._replace(worker)
            raise WorkerFailed("worker_crash") from None
        except WorkerFailed:
            self._replace(worker)
            raise
        self._idle.put(worker)
        return reply

    def verify(self, gold: str, answer: str) -> MathVerdict:
        try:
            ok, reason = _fields(self._ask(["math", gold, answer], "math verification"), (bool,), (str,))
        except WorkerFailed as failed:
            return MathVerdict(False, failed.reason)
        return MathVerdict(ok, reason)

    def custom(self, name: str, response: str, ground_truth: Any, metadata: dict | None) -> CustomVerdict:
        """Run custom verifier `name`; what it does wrong comes back as the verdict's reason."""
        try:
            reply = self._ask(["custom", name, response, ground_truth, metadata], f"custom verifier {name!r}")
            fields = _fields(reply, (int, float), (bool, type(None)), (bool, type(None)), (str,), (str,))
        except WorkerFailed as failed:
            return CustomVerdict(0.0, False, False, "", failed.reason)
        return CustomVerdict(float(fields[0]), *fields[1:])

    def close(self) -> None:
        with self._lock:
            workers, self._all = list(self._all), set()
        for worker in workers:
            worker.kill()
