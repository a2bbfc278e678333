"""Runs untrusted Python programs for the code reward, each in a fresh, locked-down process tree.

A run takes a slot (slot i runs as uid = gid = uid_base + i, so process limits are per run), writes the
program into a fresh working directory and starts sandbox_entry.py, which isolates the program
(namespaces, read-only filesystem, rlimits, dropped privileges) and executes it. This side feeds stdin,
collects output up to a cap, enforces the wall-clock limit and classifies the outcome.
"""

from __future__ import annotations

import os
import queue
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from zerobubble.reward.config import SandboxConfig

_ENTRY = str(Path(__file__).with_name("sandbox_entry.py"))
_PATH = "/usr/bin:/bin"  # the programs' PATH, also where a bare interpreter name is looked up
_CHUNK = 64 * 1024
_STATUS_CAP = 64 * 1024  # the launcher's own report is a few short lines
_PROBE_SOURCE = 'print("ok")'
# Run as a slot's uid, kill(-1) reaches exactly the processes that uid owns (and never the caller).
_KILL_ALL = "import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept ProcessLookupError:\n    pass"


@dataclass(frozen=True)
class RunResult:
    status: str  # "ok" | "runtime_error" | "time_limit" | "memory_limit" | "output_limit" | "sandbox_error"
    exit_code: int | None  # -N when killed by signal N; None when the sandbox stopped or never ran it
    stdout: str
    stderr: str  # capped; for sandbox_error the reason
    seconds: float


@dataclass(frozen=True)
class TestReport:
    __test__ = False  # not a pytest class

    passed: int
    total: int
    status: str  # the first failing run's status ("wrong_answer" if it ran but printed otherwise), or "ok"


@dataclass(frozen=True)
class Isolation:
    namespaces: bool  # mount, network and pid namespaces, read-only filesystem, private /proc
    separate_user: bool  # running as root, so programs run as the slot uids
    reason: str  # "" with full isolation, else what is missing

    @property
    def full(self) -> bool:
        return self.namespaces and self.separate_user


class SandboxUnavailable(RuntimeError):
    """Full isolation is required but cannot be had; the message says why."""


@dataclass(frozen=True)
class _Report:
    """What the launcher wrote on its status pipe."""

    failures: list[str]
    error: str
    exit_code: int | None
    cpu_seconds: float

    @classmethod
    def parse(cls, raw: bytes) -> _Report:
        failures, error, exit_code, cpu = [], "", None, 0.0
        for line in raw.decode(errors="replace").splitlines():
            kind, _, rest = line.partition(" ")
            if kind == "fail":
                failures.append(rest)
            elif kind == "error" and not error:
                error = rest
            elif kind == "exit":
                code, cpu_text = rest.split()
                exit_code, cpu = int(code), float(cpu_text)
        return cls(failures, error, exit_code, cpu)


class CodeSandbox:
    def __init__(self, config: SandboxConfig):
        """Probes what isolation this machine allows. Raises SandboxUnavailable when even the probe's
        trivial program cannot run (no interpreter, a working directory its user cannot reach...)."""
        self.config = config
        self._root = os.geteuid() == 0
        self.python = config.python if os.sep in config.python else shutil.which(config.python, path=_PATH)
        self._slots: queue.SimpleQueue[int] = queue.SimpleQueue()
        for slot in range(config.slots):
            self._slots.put(slot)
        self._lock = threading.Lock()
        self._kills = 0
        self.isolation = self._probe()

    @property
    def kills(self) -> int:
        """Process trees killed for the wall-clock or output limit."""
        with self._lock:
            return self._kills

    def run(self, source: str, stdin: str) -> RunResult:
        """Runs one program on one input; blocks until a slot is free."""
        if not self.isolation.full and self.config.require_isolation:
            raise SandboxUnavailable(self.isolation.reason)
        result, _ = self._run(source, stdin, "require" if self.isolation.namespaces else "off")
        return result

    def run_tests(self, source: str, inputs: list[str], outputs: list[str], *,
                  stop_at_first_failure: bool) -> TestReport:
        if len(inputs) != len(outputs):
            raise ValueError(f"{len(inputs)} inputs but {len(outputs)} outputs")
        passed, status = 0, "ok"
        for stdin, expected in zip(inputs, outputs, strict=True):
            result = self.run(source, stdin)
            if result.status == "ok" and _lines(result.stdout) == _lines(expected):
                passed += 1
                continue
            if status == "ok":
                status = "wrong_answer" if result.status == "ok" else result.status
            if stop_at_first_failure:
                break
        return TestReport(passed=passed, total=len(inputs), status=status)

    def _probe(self) -> Isolation:
        """Runs a trivial program with every isolation step tried, and records what failed."""
        if self.python is None:
            raise SandboxUnavailable(f"interpreter {self.config.python!r} not found on {_PATH}")
        result, failures = self._run(_PROBE_SOURCE, "", "try")
        if (result.status, result.stdout) != ("ok", "ok\n"):
            detail = result.stderr.strip()[-500:]
            raise SandboxUnavailable(f"the probe program failed ({result.status}): {detail}")
        user = [] if self._root else ["not running as root, so programs cannot run under their own user ids"]
        return Isolation(namespaces=not failures, separate_user=self._root, reason="; ".join(failures + user))

    def _run(self, source: str, stdin: str, mode: str) -> tuple[RunResult, list[str]]:
        slot = self._slots.get()
        try:
            uid = self.config.uid_base + slot if self._root else None
            workdir = tempfile.mkdtemp(prefix="zb-run-", dir=self.config.workdir_root)
            try:
                program = os.path.join(workdir, "main.py")
                with open(program, "w", encoding="utf-8", errors="replace") as f:
                    f.write(source)
                if uid is not None:
                    os.chown(workdir, uid, uid)
                    os.chown(program, uid, uid)
                return self._execute(workdir, uid, stdin.encode(errors="replace"), mode)
            finally:
                if uid is not None and mode == "off":
                    self._kill_user(uid)  # no pid namespace took the leftovers down
                shutil.rmtree(workdir, ignore_errors=True)
        finally:
            self._slots.put(slot)

    def _execute(self, workdir: str, uid: int | None, stdin: bytes, mode: str) -> tuple[RunResult, list[str]]:
        cfg = self.config
        spec = {"workdir": workdir, "python": self.python, "uid": "" if uid is None else uid, "mode": mode,
                "cpu_seconds": cfg.cpu_seconds, "memory_bytes": cfg.memory_bytes,
                "max_processes": cfg.max_processes, "max_file_bytes": cfg.max_file_bytes,
                "max_open_files": cfg.max_open_files}
        args = [f"{key}={value}" for key, value in spec.items()]
        env = {"PATH": _PATH, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}  # HOME: set by the launcher
        status_read, status_write = os.pipe()
        started = time.monotonic()
        try:
            # No preexec_fn (unsafe with threads): the launcher does all process setup itself.
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", _ENTRY, str(status_write), *args],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                pass_fds=(status_write,), start_new_session=True, env=env, cwd="/")
        except OSError as exc:
            os.close(status_read)
            return RunResult("sandbox_error", None, "", f"cannot start the launcher: {exc}", 0.0), []
        finally:
            os.close(status_write)
        try:
            killed_for, out, err, status = self._communicate(proc, status_read, stdin)
        finally:
            _kill_group(proc.pid)  # session leader: its pid is the group's id
            proc.wait()
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                stream.close()
            os.close(status_read)
        seconds = time.monotonic() - started
        if killed_for:
            with self._lock:
                self._kills += 1
        report = _Report.parse(status)
        return self._verdict(killed_for, report, proc.returncode, out, err, seconds), report.failures

    def _communicate(self, proc: subprocess.Popen, status_fd: int, stdin: bytes,
                     ) -> tuple[str | None, bytes, bytes, bytes]:
        """Feeds stdin and collects output until the launcher exits. Returns why the tree must be killed
        (None when it ended by itself), stdout, stderr and the launcher's report."""
        cap = self.config.max_output_bytes
        out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
        caps = {out_fd: cap, err_fd: cap, status_fd: _STATUS_CAP}
        bufs = {fd: bytearray() for fd in caps}
        pending = memoryview(stdin)
        deadline = time.monotonic() + self.config.wall_seconds
        killed_for = None

        def over_cap() -> bool:
            return len(bufs[out_fd]) > cap or len(bufs[err_fd]) > cap

        pidfd = os.pidfd_open(proc.pid)
        try:
            with selectors.DefaultSelector() as selector:
                for fd in caps:
                    os.set_blocking(fd, False)
                    selector.register(fd, selectors.EVENT_READ)
                selector.register(pidfd, selectors.EVENT_READ)
                if pending:
                    os.set_blocking(proc.stdin.fileno(), False)
                    selector.register(proc.stdin.fileno(), selectors.EVENT_WRITE)
                else:
                    proc.stdin.close()
                exited = False
                while not exited and not killed_for:
                    timeout = deadline - time.monotonic()
                    if timeout <= 0:
                        killed_for = "time_limit"
                        break
                    for key, _ in selector.select(timeout):
                        if key.fd == pidfd:
                            exited = True
                        elif key.fd in bufs:
                            if not _drain(key.fd, bufs[key.fd], caps[key.fd]):
                                selector.unregister(key.fd)
                        else:
                            pending = _feed(key.fd, pending)
                            if not pending:
                                selector.unregister(key.fd)
                                proc.stdin.close()
                    if over_cap():
                        killed_for = "output_limit"
        finally:
            os.close(pidfd)
        if not killed_for:  # the launcher has exited: take what its processes left in the pipes
            for fd, buf in bufs.items():
                _drain(fd, buf, caps[fd])
            if over_cap():
                killed_for = "output_limit"
        return killed_for, bytes(bufs[out_fd][:cap]), bytes(bufs[err_fd][:cap]), bytes(bufs[status_fd])

    def _verdict(self, killed_for: str | None, report: _Report, returncode: int, out: bytes, err: bytes,
                 seconds: float) -> RunResult:
        stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
        if killed_for:
            return RunResult(killed_for, None, stdout, stderr, seconds)
        if report.error or report.exit_code is None:
            reason = report.error or f"the launcher exited with {returncode}: {stderr.strip()[-500:]}"
            return RunResult("sandbox_error", None, stdout, reason, seconds)
        code = report.exit_code
        if code == 0:
            status = "ok"
        elif code == -signal.SIGXCPU or (code == -signal.SIGKILL
                                         and report.cpu_seconds >= self.config.cpu_seconds):
            status = "time_limit"
        elif "MemoryError" in stderr:
            status = "memory_limit"
        else:
            status = "runtime_error"
        return RunResult(status, code, stdout, stderr, seconds)

    def _kill_user(self, uid: int) -> None:
        subprocess.run([self.python, "-I", "-S", "-c", _KILL_ALL], user=uid, group=uid, extra_groups=[],
                       env={}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, cwd="/", check=False)


def _lines(text: str) -> list[str]:
    """Output as compared: trailing whitespace of each line and trailing blank lines do not count."""
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _drain(fd: int, buf: bytearray, cap: int) -> bool:
    """Reads what the pipe holds now, up to one byte past cap; False once every writer has closed it."""
    while len(buf) <= cap:
        try:
            data = os.read(fd, min(_CHUNK, cap + 1 - len(buf)))
        except BlockingIOError:
            return True
        if not data:
            return False
        buf += data
    return True


def _feed(fd: int, pending: memoryview) -> memoryview:
    """Writes what the pipe takes now; returns the rest (nothing once the program stopped reading)."""
    try:
        return pending[os.write(fd, pending[:_CHUNK]):]
    except BlockingIOError:
        return pending
    except BrokenPipeError:
        return pending[:0]


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
