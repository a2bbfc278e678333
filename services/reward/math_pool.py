"""A pool of verification worker processes with a per-item time limit: math_verify, and the custom verifiers
users bring (services/reward/custom.py), never run in the server process.

A verification that hangs is killed when its time is up and one that crashes its process is answered with a
reason; either way the worker is replaced and the pool keeps serving, as it is after a run of verifier errors
(a verifier that leaks files or memory spoils its worker, not the next items). Each worker is a process of its
own session, started with only the environment the configuration passes and its own memory and open-file
limits; killing it kills its session, so whatever a verifier started dies with it. Workers and the pool speak JSON over
the pipe, and a reply is read only up to a bounded size, so whatever a worker's code does, the server
unpickles nothing from it and never holds more than that bound of its output.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from typing import Any

from zerobubble.common.config import ConfigError
from zerobubble.common.user_code import BASIC_ENV

log = logging.getLogger(__name__)

_STARTUP_SECONDS = 120.0
_READY = "ready"
# A reply is a verdict: a few flags, a reason and an extracted answer (bounded by the worker).
_MAX_REPLY_BYTES = 1024 * 1024


@dataclass(frozen=True)
class WorkerLimits:
    """Per worker process: address space and open files (rlimits), the environment variables it gets beside
    BASIC_ENV, and how many verifier errors in a row replace it."""

    memory_bytes: int = 2 * 1024 ** 3
    max_open_files: int = 256
    env: tuple[str, ...] = ()
    max_consecutive_errors: int = 3

    def environment(self) -> dict[str, str]:
        return {name: os.environ[name] for name in (*BASIC_ENV, *self.env) if name in os.environ}


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
    from zerobubble.common.user_code import import_callable
    from zerobubble.reward.custom import call_custom
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


# How often a worker looks whether the service is still its parent.
_ORPHAN_CHECK_SECONDS = 1.0


def _die_with_the_service(service_pid: int) -> None:
    """When the service dies, even by SIGKILL (which runs none of its cleanup), the worker is re-parented: it
    then kills its whole session. (PR_SET_PDEATHSIG would fire when the service's thread that started the
    worker ends, not the service.)"""

    def watch() -> None:
        while os.getppid() == service_pid:
            time.sleep(_ORPHAN_CHECK_SECONDS)
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, name="orphan-watch", daemon=True).start()


def _serve(fd: int, service_pid: int) -> None:
    """A worker process: take its settings from the pool, bound itself, then serve."""
    _die_with_the_service(service_pid)
    conn = Connection(fd)
    specs, max_extracted_bytes, memory_bytes, max_open_files = json.loads(conn.recv_bytes())
    # Hard limits too, before any verifier is imported: its code cannot raise them again.
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_NOFILE, (max_open_files, max_open_files))
    _worker_main(conn, [CustomSpec(**spec) for spec in specs], max_extracted_bytes)
    # The service closed the connection (or died): nothing the verifiers started may outlive the worker.
    os.killpg(0, signal.SIGKILL)


class _Worker:
    """A fresh interpreter (not a fork of the threaded server) in a session of its own, talking over a socket
    pair so that what a verifier prints cannot garble the replies."""

    def __init__(self, specs: Sequence[CustomSpec], max_extracted_bytes: int, limits: WorkerLimits):
        ours, theirs = socket.socketpair()
        with theirs:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "zerobubble.reward.math_pool", str(theirs.fileno()), str(os.getpid())],
                env=limits.environment(), pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                start_new_session=True)
        self._conn = Connection(ours.detach())
        self._conn.send_bytes(json.dumps([[asdict(spec) for spec in specs], max_extracted_bytes,
                                          limits.memory_bytes, limits.max_open_files]).encode())
        self._ready = False
        self.errors = 0

    def wait_ready(self, timeout: float) -> None:
        if self._ready:
            return
        try:
            if not self._conn.poll(timeout):
                raise TimeoutError("verification worker did not start")
            first = json.loads(self._conn.recv_bytes(_MAX_REPLY_BYTES))
        except (EOFError, OSError):
            raise WorkerExited(f"verification worker exited at start (exit code {self.process.poll()})") from None
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
        """Kill its whole session. The group outlives a leader that died by itself as long as a child of it
        lives, and its id is not reused meanwhile, so this reaches the orphans of a crashed worker too."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            log.warning("verification worker %d did not exit after SIGKILL", self.process.pid)
        self._conn.close()


class WorkerExited(RuntimeError):
    """A worker died before it was ready (a start that cannot import is a ConfigError instead)."""


def _fields(reply: Any, *types: tuple[type, ...]) -> list:
    """The reply's fields, checked against `types`; a reply of another shape is out of contract."""
    if not isinstance(reply, list) or len(reply) != len(types) or not all(
            isinstance(value, kinds) for value, kinds in zip(reply, types, strict=True)):
        raise WorkerFailed("bad_result: the worker's reply is out of contract")
    return reply


def _verifier_error(reply: Any) -> bool:
    return isinstance(reply, list) and bool(reply) and str(reply[-1]).startswith("verifier_error")


class VerifierPool:
    """verify(gold, answer) and custom(name, ...) from any thread; at most `workers` run at once."""

    def __init__(self, workers: int, timeout_seconds: float, custom: Sequence[CustomSpec] = (),
                 max_extracted_bytes: int = 16 * 1024, limits: WorkerLimits = WorkerLimits()):
        self.timeout_seconds = timeout_seconds
        self._specs = list(custom)
        self._max_extracted_bytes = max_extracted_bytes
        self._limits = limits
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._all: set[_Worker] = set()
        self._lock = threading.Lock()
        self.replaced = 0
        for _ in range(workers):
            self._idle.put(self._spawn())

    def _spawn(self) -> _Worker:
        worker = _Worker(self._specs, self._max_extracted_bytes, self._limits)
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

    def _ask(self, message: list, what: str, erred: Callable[[Any], bool] | None = None) -> Any:
        """The worker's reply. When `erred(reply)` says the verifier itself failed, a run of
        limits.max_consecutive_errors such replies replaces the worker once it has answered."""
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
                        worker.process.poll())
            self._replace(worker)
            raise WorkerFailed("worker_crash") from None
        except WorkerFailed:
            self._replace(worker)
            raise
        worker.errors = worker.errors + 1 if erred is not None and erred(reply) else 0
        if worker.errors >= self._limits.max_consecutive_errors:
            log.warning("%s failed %d times in a row; replacing its worker", what, worker.errors)
            self._replace(worker)
        else:
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
            reply = self._ask(["custom", name, response, ground_truth, metadata], f"custom verifier {name!r}",
                              _verifier_error)
            fields = _fields(reply, (int, float), (bool, type(None)), (bool, type(None)), (str,), (str,))
        except WorkerFailed as failed:
            return CustomVerdict(0.0, False, False, "", failed.reason)
        return CustomVerdict(float(fields[0]), *fields[1:])

    def close(self) -> None:
        with self._lock:
            workers, self._all = list(self._all), set()
        for worker in workers:
            worker.kill()


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]))
