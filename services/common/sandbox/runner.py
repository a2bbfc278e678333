"""Runs untrusted Python programs for the code reward, each in a fresh, locked-down process tree.

A run takes a slot: slot i runs as uid = gid = uid_base + i (so process limits are per run) in a memory
cgroup of its own (so the kernel bounds the memory of all the run's processes together, with what they
keep in /tmp and in shared memory). bubblewrap builds the run's world: new mount, pid, network, IPC, UTS
and cgroup namespaces, and a root holding only /usr read-only (the interpreter and its libraries), a fresh
/proc and /dev, a private /tmp with the program, and a seccomp filter (seccomp.py). sandbox_entry.py, started
in there, applies the per-process limits and starts the program under the slot's uid. This side feeds stdin,
collects output up to a cap, enforces the wall-clock limit and classifies the outcome.

With `warm_slots` (the default) a slot's bubblewrap sandbox and launcher interpreter stay up between runs
(warm.py), and each run gets new mount, pid, IPC and cgroup namespaces, a fresh /tmp and /proc inside it.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import queue
import selectors
import shutil
import signal
import subprocess
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from zerobubble.common.sandbox.config import SandboxConfig
from zerobubble.common.sandbox.seccomp import keyring_filter
from zerobubble.common.sandbox.warm import WarmSlot, WarmSlotError

log = logging.getLogger(__name__)

_ENTRY = str(Path(__file__).with_name("sandbox_entry.py"))
_ENTRY_INSIDE = "/sandbox_entry.py"
_PATH = "/usr/bin:/bin"  # the programs' PATH, also where a bare interpreter name is looked up
_ENV = {"PATH": _PATH, "LANG": "C.UTF-8", "HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1"}
_CHUNK = 64 * 1024
_STATUS_CAP = 64 * 1024  # the launcher's own report is a few short lines
_PROBE_SOURCE = 'print("ok")'
# The launcher joins the slot's cgroup before it becomes bubblewrap, so every process of the run is in it.
_JOIN_CGROUP = 'echo $$ > "$0" && exec "$@"'
# Namespaces of its own for all but users (the slot uids are real uids, so that the host's process and file
# checks apply to them), and no capability but the two that sandbox_entry.py needs to change user.
_NAMESPACES = ("--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts")
_ISOLATION = (*_NAMESPACES, "--unshare-cgroup", "--die-with-parent", "--cap-drop", "ALL", "--cap-add", "CAP_SETUID",
              "--cap-add", "CAP_SETGID")
# A warm slot's zygote also makes each run's namespaces and mounts (CAP_SYS_ADMIN) and empties the program's
# capability bounding set (CAP_SETPCAP); programs hold none of the four. It keeps the host's cgroup namespace: a
# run moves into the slot's cgroup before it makes its own, and kernels before 5.16 refuse that move from inside a
# cgroup namespace whose root is not above the slot's.
_ZYGOTE_ISOLATION = (*_NAMESPACES, "--cap-drop", "ALL", *(arg for cap in ("CAP_SETUID", "CAP_SETGID",
                     "CAP_SYS_ADMIN", "CAP_SETPCAP") for arg in ("--cap-add", cap)))
_CGROUP_PREFIX = "zerobubble-sandbox-"  # then the service's pid and the sandbox's number in it
_SANDBOX_NUMBERS = itertools.count()
_EMPTY_SECONDS = 5.0  # for what a run leaves in its cgroup (killed processes, shared memory) to go


@dataclass(frozen=True)
class RunResult:
    # "ok" | "runtime_error" | "time_limit" | "memory_limit" | "output_limit" | "sandbox_error", or "deadline": the
    # caller's deadline passed while it waited for a slot or ran (then killed)
    status: str
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
    missing: tuple[str, ...] = ()  # what this machine lacks to run programs sandboxed

    @property
    def full(self) -> bool:
        return not self.missing

    @property
    def reason(self) -> str:
        return "; ".join(self.missing)


class SandboxUnavailable(RuntimeError):
    """Programs cannot run sandboxed here; the message says why."""


@dataclass(frozen=True)
class _Report:
    """What the launcher wrote on its status pipe."""

    error: str
    exit_code: int | None
    cpu_seconds: float

    @classmethod
    def parse(cls, raw: bytes) -> _Report:
        error, exit_code, cpu = "", None, 0.0
        for line in raw.decode(errors="replace").splitlines():
            kind, _, rest = line.partition(" ")
            if kind == "error" and not error:
                error = rest
            elif kind == "exit":
                code, cpu_text = rest.split()
                exit_code, cpu = int(code), float(cpu_text)
        return cls(error, exit_code, cpu)


class CodeSandbox:
    def __init__(self, config: SandboxConfig):
        """Finds out whether programs can run sandboxed here (`isolation` says what is missing) and makes
        the slots' cgroups; `close()` removes them."""
        self.config = config
        self.python = config.python if os.sep in config.python else shutil.which(config.python, path=_PATH)
        self.bwrap = shutil.which(config.bwrap)
        self._root = _root_args()
        self._slots: queue.SimpleQueue[int] = queue.SimpleQueue()
        for slot in range(config.slots):
            self._slots.put(slot)
        self._lock = threading.Lock()
        self._kills = 0
        self._warm: list[WarmSlot | None] = [None] * config.slots  # started at a slot's first run
        self._seccomp = keyring_filter()
        self.warm = config.warm_slots  # False where the probe found that warm slots do not work here
        self.cgroups: SlotCgroups | None = None
        self.isolation = self._probe()

    @property
    def kills(self) -> int:
        """Process trees killed for the wall-clock or output limit."""
        with self._lock:
            return self._kills

    def run(self, source: str, stdin: str, deadline: float | None = None) -> RunResult:
        """Runs one program on one input; blocks until a slot is free. `deadline` (a time.monotonic() instant) bounds
        the wait for a slot and the run together: past it the program is killed and the status is "deadline"."""
        if not self.isolation.full:
            raise SandboxUnavailable(self.isolation.reason)
        return self._run(source, stdin, deadline)

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

    def close(self) -> None:
        """Kills the runs in progress and removes the slots' cgroups once they have ended; later runs are
        refused."""
        self.isolation = Isolation(("the sandbox is closed",))
        if self.cgroups is None or self.cgroups.closed:
            return
        held = []
        deadline = time.monotonic() + _EMPTY_SECONDS
        while len(held) < self.config.slots and time.monotonic() < deadline:
            self.cgroups.kill_all()
            with contextlib.suppress(queue.Empty):
                held.append(self._slots.get(timeout=0.05))
        for slot, warm in enumerate(self._warm):
            if warm is not None:
                warm.close()
                self._warm[slot] = None
        self.cgroups.close()
        for slot in held:  # a run that got past the check before the close fails at once, not waits forever
            self._slots.put(slot)

    def _probe(self) -> Isolation:
        missing = []
        if os.geteuid() != 0:
            missing.append("not running as root, so programs cannot run under their own user ids")
        if self.python is None:
            missing.append(f"interpreter {self.config.python!r} not found on {_PATH}")
        if self.bwrap is None:
            missing.append(f"bubblewrap ({self.config.bwrap!r}) is not installed (apt-get install bubblewrap)")
        if missing:
            return Isolation(tuple(missing))
        try:
            self.cgroups = SlotCgroups(self.config.slots, self.config.memory_bytes)
        except (OSError, SandboxUnavailable) as exc:
            return Isolation((f"no memory cgroup for the runs: {exc}",))
        result = self._run(_PROBE_SOURCE, "")
        if self.warm and (result.status, result.stdout) != ("ok", "ok\n"):
            log.warning("warm sandbox slots do not work here (%s: %s); each program gets a bubblewrap sandbox of "
                        "its own", result.status, result.stderr.strip()[-500:])
            self.warm = False
            result = self._run(_PROBE_SOURCE, "")
        if (result.status, result.stdout) != ("ok", "ok\n"):
            detail = result.stderr.strip()[-500:]
            return Isolation((f"the probe program failed ({result.status}): {detail}",))
        return Isolation()

    def _run(self, source: str, stdin: str, deadline: float | None = None) -> RunResult:
        started = time.monotonic()
        try:
            slot = self._slots.get(timeout=None if deadline is None else max(0.0, deadline - started))
        except queue.Empty:
            return RunResult("deadline", None, "", "no sandbox slot was free before the deadline",
                             time.monotonic() - started)
        try:
            return self._execute(slot, source.encode(errors="replace"), stdin.encode(errors="replace"), deadline)
        finally:
            self._slots.put(slot)

    def _execute(self, slot: int, source: bytes, stdin: bytes, deadline: float | None) -> RunResult:
        if self.warm:
            return self._execute_warm(slot, source, stdin, deadline)
        cgroups = self.cgroups
        oom_kills = cgroups.oom_kills(slot)
        status_read, status_write = os.pipe()
        started = time.monotonic()
        # bubblewrap reads the program and its own options from memory: the program never touches the host's
        # disk, and the options (host paths) do not show in the command line of the run's pid 1.
        with _memory_file(source) as program, self._seccomp_file() as seccomp:
            options = [*self._bwrap_options(program.fileno(), len(source)), *_seccomp_options(seccomp)]
            with _memory_file(b"".join(option.encode() + b"\0" for option in options)) as bwrap_options:
                command = ["/bin/sh", "-c", _JOIN_CGROUP, str(cgroups.procs(slot)), self.bwrap,
                           "--args", str(bwrap_options.fileno()), "--",
                           self.python, "-I", "-S", _ENTRY_INSIDE, str(status_write), *self._spec(slot)]
                try:
                    # No preexec_fn (unsafe with threads): the launcher does all process setup itself.
                    proc = subprocess.Popen(
                        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        pass_fds=(status_write, program.fileno(), bwrap_options.fileno(), *_fds(seccomp)),
                        start_new_session=True,
                        env=_ENV, cwd="/")
                except OSError as exc:
                    os.close(status_read)
                    return RunResult("sandbox_error", None, "", f"cannot start the launcher: {exc}", 0.0)
                finally:
                    os.close(status_write)
        try:
            killed_for, out, err, status = self._communicate(
                proc.stdin, proc.stdout.fileno(), proc.stderr.fileno(), status_read, stdin, deadline,
                exit_fd=os.pidfd_open(proc.pid))
        finally:
            _kill_group(proc.pid)  # session leader: its pid is the group's id
            proc.wait()
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                stream.close()
            os.close(status_read)
            cgroups.empty(slot)
        seconds = time.monotonic() - started
        if killed_for:
            with self._lock:
                self._kills += 1
        out_of_memory = cgroups.oom_kills(slot) > oom_kills
        unreported = f"the launcher exited with {proc.returncode}: {err.decode(errors='replace').strip()[-500:]}"
        return self._verdict(killed_for, _Report.parse(status), unreported, out, err, seconds, out_of_memory)

    def _execute_warm(self, slot: int, source: bytes, stdin: bytes, deadline: float | None) -> RunResult:
        """A run in the slot's warm sandbox. The end of file on the status pipe is the end of the run: the run's
        init holds it until it exits, and then the kernel kills whatever the program left."""
        cgroups = self.cgroups
        oom_kills = cgroups.oom_kills(slot)
        started = time.monotonic()
        launched = self._launch_warm(slot, source)
        if isinstance(launched, str):
            return RunResult("sandbox_error", None, "", launched, time.monotonic() - started)
        feed, out_read, err_read, status_read = launched
        try:
            killed_for, out, err, status = self._communicate(feed, out_read, err_read, status_read, stdin,
                                                             deadline)
        finally:
            feed.close()
            for fd in (out_read, err_read, status_read):
                os.close(fd)
            cgroups.empty(slot)
        seconds = time.monotonic() - started
        report = _Report.parse(status)
        if killed_for or report.error or report.exit_code is None:
            self._replace(slot)  # nothing of a run that went wrong is kept, its slot's sandbox included
        if killed_for:
            with self._lock:
                self._kills += 1
        out_of_memory = cgroups.oom_kills(slot) > oom_kills
        return self._verdict(killed_for, report, "the slot's sandbox ended the run without a report", out, err,
                             seconds, out_of_memory)

    def _launch_warm(self, slot: int, source: bytes) -> tuple[BinaryIO, int, int, int] | str:
        """Hands a run to the slot's zygote, starting it first where there is none: this side's ends of the run's
        stdin, stdout, stderr and status pipes, or why it could not."""
        failure = ""
        for _ in range(2):  # a zygote that died since the slot's last run is replaced once
            warm = self._warm[slot]
            if warm is None or not warm.alive:
                self._replace(slot)
                try:
                    warm = self._warm[slot] = self._start_warm(slot)
                except (OSError, WarmSlotError) as exc:
                    return str(exc)
            (stdin_read, stdin_write), (out_read, out_write), (err_read, err_write), (status_read, status_write) \
                = os.pipe(), os.pipe(), os.pipe(), os.pipe()
            theirs = (stdin_read, out_write, err_write, status_write)
            try:
                with _memory_file(source) as program:
                    taken = warm.launch(self._tmp_bytes(len(source)), (program.fileno(), *theirs))
            finally:
                for fd in theirs:
                    os.close(fd)
            if taken:
                return os.fdopen(stdin_write, "wb", buffering=0), out_read, err_read, status_read
            for fd in (stdin_write, out_read, err_read, status_read):
                os.close(fd)
            self._replace(slot)
            failure = "the slot's sandbox did not take the run"
        return failure

    def _start_warm(self, slot: int) -> WarmSlot:
        with self._seccomp_file() as seccomp:
            options = [*_ZYGOTE_ISOLATION, *self._root, "--dir", "/tmp", "--chdir", "/tmp", "--clearenv",
                       *(arg for name, value in _ENV.items() for arg in ("--setenv", name, value)),
                       *_seccomp_options(seccomp)]
            return self._start_zygote(slot, options, _fds(seccomp))

    def _start_zygote(self, slot: int, options: list[str], fds: tuple[int, ...]) -> WarmSlot:
        with _memory_file(b"".join(option.encode() + b"\0" for option in options)) as bwrap_options:
            def command(control: int, cgroup: int) -> list[str]:
                return ["/bin/sh", "-c", _JOIN_CGROUP, str(self.cgroups.zygote_procs(slot)), self.bwrap,
                        "--args", str(bwrap_options.fileno()), "--", self.python, "-I", "-S", _ENTRY_INSIDE,
                        "zygote", str(control), str(cgroup), *self._spec(slot)]

            return WarmSlot(command, (bwrap_options.fileno(), *fds), self.cgroups.procs(slot), _ENV)

    def _replace(self, slot: int) -> None:
        """Ends the slot's warm sandbox; its next run starts a new one."""
        warm, self._warm[slot] = self._warm[slot], None
        if warm is not None:
            warm.close()
        self.cgroups.empty_zygote(slot)

    def _seccomp_file(self) -> contextlib.AbstractContextManager[BinaryIO | None]:
        """The seccomp filter for one bubblewrap, which reads its descriptor to the end (None where there is none
        for this machine)."""
        return contextlib.nullcontext() if self._seccomp is None else _memory_file(self._seccomp)

    def _tmp_bytes(self, program_bytes: int) -> int:
        """The private /tmp's size: it bounds all that is written (RLIMIT_FSIZE bounds one file only)."""
        return program_bytes + self.config.max_file_bytes + 4096

    def _bwrap_options(self, program: int, program_bytes: int) -> list[str]:
        # The program's file is root's, so the program cannot replace it.
        tmp_bytes = self._tmp_bytes(program_bytes)
        return [*_ISOLATION, *self._root, "--size", str(tmp_bytes), "--perms", "1777", "--tmpfs", "/tmp",
                "--perms", "0444", "--file", str(program), "/tmp/main.py", "--chdir", "/tmp", "--clearenv",
                *(arg for name, value in _ENV.items() for arg in ("--setenv", name, value))]

    def _spec(self, slot: int) -> list[str]:
        cfg = self.config
        spec = {"uid": cfg.uid_base + slot, "cpu_seconds": cfg.cpu_seconds,
                "memory_bytes": cfg.memory_bytes, "max_processes": cfg.max_processes,
                "max_file_bytes": cfg.max_file_bytes, "max_open_files": cfg.max_open_files}
        return [f"{key}={value}" for key, value in spec.items()]

    def _communicate(self, feed: BinaryIO, out_fd: int, err_fd: int, status_fd: int, stdin: bytes,
                     caller_deadline: float | None, exit_fd: int | None = None,
                     ) -> tuple[str | None, bytes, bytes, bytes]:
        """Feeds stdin and collects output until the run ends: `exit_fd` (a pidfd, closed here) is readable, or,
        without one, the status pipe is at its end. Returns why the tree must be killed (None when it ended by
        itself), stdout, stderr and the launcher's report."""
        cap = self.config.max_output_bytes
        caps = {out_fd: cap, err_fd: cap, status_fd: _STATUS_CAP}
        bufs = {fd: bytearray() for fd in caps}
        pending = memoryview(stdin)
        deadline = time.monotonic() + self.config.wall_seconds
        cut_for = "time_limit"
        if caller_deadline is not None and caller_deadline < deadline:
            deadline, cut_for = caller_deadline, "deadline"
        killed_for = None

        def over_cap() -> bool:
            return len(bufs[out_fd]) > cap or len(bufs[err_fd]) > cap

        try:
            with selectors.DefaultSelector() as selector:
                for fd in caps:
                    os.set_blocking(fd, False)
                    selector.register(fd, selectors.EVENT_READ)
                if exit_fd is not None:
                    selector.register(exit_fd, selectors.EVENT_READ)
                if pending:
                    os.set_blocking(feed.fileno(), False)
                    selector.register(feed.fileno(), selectors.EVENT_WRITE)
                else:
                    feed.close()
                exited = False
                while not exited and not killed_for:
                    timeout = deadline - time.monotonic()
                    if timeout <= 0:
                        killed_for = cut_for
                        break
                    for key, _ in selector.select(timeout):
                        if key.fd == exit_fd:
                            exited = True
                        elif key.fd in bufs:
                            if not _drain(key.fd, bufs[key.fd], caps[key.fd]):
                                selector.unregister(key.fd)
                                exited = exited or (exit_fd is None and key.fd == status_fd)
                        else:
                            pending = _feed(key.fd, pending)
                            if not pending:
                                selector.unregister(key.fd)
                                feed.close()
                    if over_cap():
                        killed_for = "output_limit"
        finally:
            if exit_fd is not None:
                os.close(exit_fd)
        if not killed_for:  # the launcher has exited: take what its processes left in the pipes
            for fd, buf in bufs.items():
                _drain(fd, buf, caps[fd])
            if over_cap():
                killed_for = "output_limit"
        return killed_for, bytes(bufs[out_fd][:cap]), bytes(bufs[err_fd][:cap]), bytes(bufs[status_fd])

    def _verdict(self, killed_for: str | None, report: _Report, unreported: str, out: bytes, err: bytes,
                 seconds: float, out_of_memory: bool) -> RunResult:
        """`unreported`: the reason given when the launcher reported nothing."""
        stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
        if killed_for:
            return RunResult(killed_for, None, stdout, stderr, seconds)
        code = report.exit_code
        if out_of_memory and code != 0:  # the kernel killed a process of the run for the cgroup's bound
            return RunResult("memory_limit", code, stdout, stderr, seconds)
        if report.error or code is None:
            reason = report.error or unreported
            return RunResult("sandbox_error", None, stdout, reason, seconds)
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


def _seccomp_options(seccomp: BinaryIO | None) -> list[str]:
    return [] if seccomp is None else ["--seccomp", str(seccomp.fileno())]


def _fds(file: BinaryIO | None) -> tuple[int, ...]:
    return () if file is None else (file.fileno(),)


def _memory_file(data: bytes) -> BinaryIO:
    """A file holding `data` in memory only, read from its start."""
    file = os.fdopen(os.memfd_create("sandbox"), "w+b")
    file.write(data)
    file.seek(0)
    return file


def _root_args() -> list[str]:
    """bubblewrap arguments for the run's root: /usr read-only, the top-level links into it (or folders,
    where /usr is not merged), the loader's cache, a fresh /proc (read-only, so that a user namespace the
    program makes cannot be given uid maps), a fresh /dev, and the launcher."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    return [*args, "--perms", "0755", "--dir", "/etc", "--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache",
            "--proc", "/proc", "--remount-ro", "/proc", "--dev", "/dev", "--ro-bind", _ENTRY, _ENTRY_INSIDE]


class SlotCgroups:
    """A memory cgroup for each slot, in a cgroup of this service's own, bounding what a run holds at once
    (every process, the files in its /tmp, its shared memory) to memory_bytes."""

    def __init__(self, slots: int, memory_bytes: int):
        parent, self.version = _own_memory_cgroup()
        _remove_stale(parent)
        if self.version == 2:
            _enable_memory(parent)
        self.base = parent / f"{_CGROUP_PREFIX}{os.getpid()}-{next(_SANDBOX_NUMBERS)}"
        self.base.mkdir(exist_ok=True)
        self.slots: list[Path] = []
        # Each slot's warm sandbox (its zygote) lives in a cgroup beside the slot's, which runs leave alone.
        self.zygotes: list[Path] = []
        folders: list[Path] = []
        # Removed by close(), or at the latest at exit, for a sandbox nobody closed.
        self._removal = weakref.finalize(self, _remove_cgroups, self.base, folders)
        if self.version == 2:
            (self.base / "cgroup.subtree_control").write_text("+memory")
        # Swap counts too, where the kernel accounts for it: otherwise a run could spill past its bound.
        limit, swap = (("memory.limit_in_bytes", "memory.memsw.limit_in_bytes") if self.version == 1
                       else ("memory.max", "memory.swap.max"))
        for slot in range(slots):
            zygote = self.base / f"zygote-{slot}"
            zygote.mkdir(exist_ok=True)
            self.zygotes.append(zygote)
            folders.append(zygote)
            folder = self.base / f"slot-{slot}"
            folder.mkdir(exist_ok=True)
            self.slots.append(folder)
            folders.append(folder)
            (folder / limit).write_text(str(memory_bytes))
            if (folder / swap).exists():
                (folder / swap).write_text(str(memory_bytes if self.version == 1 else 0))

    def procs(self, slot: int) -> Path:
        return self.slots[slot] / "cgroup.procs"

    def zygote_procs(self, slot: int) -> Path:
        return self.zygotes[slot] / "cgroup.procs"

    def oom_kills(self, slot: int) -> int:
        """Processes the kernel has killed in this slot's cgroup for its memory bound, ever."""
        return _figure(self.slots[slot] / ("memory.oom_control" if self.version == 1 else "memory.events"),
                       "oom_kill")

    def empty(self, slot: int) -> None:
        _empty(self.slots[slot])

    def empty_zygote(self, slot: int) -> None:
        _empty(self.zygotes[slot])

    def kill_all(self) -> None:
        for folder in self.slots:
            _kill(folder)

    @property
    def closed(self) -> bool:
        return not self._removal.alive

    def close(self) -> None:
        self._removal()


def _kill(cgroup: Path) -> list[str]:
    """Sends SIGKILL to every process in a cgroup; returns their pids."""
    pids = (cgroup / "cgroup.procs").read_text().split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    return pids


def _empty(cgroup: Path) -> None:
    """Kills what is left in a cgroup and waits until its processes are gone and their files and shared memory
    are freed, so that the slot's next run has its whole bound. bubblewrap's init often exits a moment after
    the process that waited for it, and the kernel frees an IPC namespace's memory a moment after that."""
    deadline = time.monotonic() + _EMPTY_SECONDS
    pause = 0.001
    while (pids := _kill(cgroup)) or _figure(cgroup / "memory.stat", "shmem"):
        if time.monotonic() > deadline:
            log.warning("sandbox cgroup %s still holds processes [%s] or shared memory after its run", cgroup,
                        " ".join(pids))
            return
        time.sleep(pause)
        pause = min(2 * pause, 0.05)


def _figure(path: Path, key: str) -> int:
    """The value of `key` in a cgroup file of "key value" lines (0 where the kernel does not count it)."""
    for line in path.read_text().splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0


def _remove_cgroups(base: Path, folders: list[Path]) -> None:
    for folder in folders:
        _empty(folder)
    _remove_tree(base)


def _own_memory_cgroup() -> tuple[Path, int]:
    """This process's memory cgroup, as a folder, and the version of the hierarchy that has the controller."""
    found = find_memory_cgroup(Path("/proc/self/cgroup").read_text(), Path("/proc/self/mountinfo").read_text())
    if found is None:
        raise SandboxUnavailable("the kernel has no memory cgroup controller mounted")
    folder, version = found
    if version == 2 and "memory" not in (folder / "cgroup.controllers").read_text().split():
        raise SandboxUnavailable(f"the memory controller is not enabled for {folder}")
    return found


def find_memory_cgroup(cgroups: str, mountinfo: str) -> tuple[Path, int] | None:
    """Where a process's memory cgroup is, from its /proc/PID/cgroup and /proc/PID/mountinfo: a v1 memory
    hierarchy where there is one (hybrid hosts have both), else the v2 one."""
    return find_cgroup("memory", cgroups, mountinfo)


def find_cgroup(controller: str, cgroups: str, mountinfo: str) -> tuple[Path, int] | None:
    """Where a process's cgroup of `controller` is, and the hierarchy's version, from its /proc/PID/cgroup and
    /proc/PID/mountinfo: a v1 hierarchy of that controller where there is one, else the v2 one (whose controllers
    the caller checks)."""
    own = {}
    for line in cgroups.splitlines():
        _, controllers, path = line.split(":", 2)
        own.update(dict.fromkeys(controllers.split(","), path))
    for line in mountinfo.splitlines():
        fields = line.split()
        mount_root, mount_point = fields[3], fields[4]
        fstype, options = fields[fields.index("-") + 1], fields[fields.index("-") + 3].split(",")
        if fstype == "cgroup" and controller in options and controller in own:
            version, path = 1, own[controller]
        elif fstype == "cgroup2" and controller not in own and "" in own:
            version, path = 2, own[""]
        else:
            continue
        return Path(mount_point, os.path.relpath(path, mount_root)), version
    return None


def _enable_memory(parent: Path) -> None:
    """Lets the children of a cgroup v2 `parent` have memory limits. v2 hands controllers down only from a
    cgroup without processes of its own (the root excepted), so the processes in `parent` (this service and
    whatever was started with it) first move to a leaf of their own, as container runtimes do."""
    control = parent / "cgroup.subtree_control"
    if "memory" in control.read_text().split():
        return
    try:
        control.write_text("+memory")
        return
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            raise
    leaf = parent / "zerobubble-service"
    leaf.mkdir(exist_ok=True)
    for pid in (parent / "cgroup.procs").read_text().split():
        with contextlib.suppress(ProcessLookupError):
            (leaf / "cgroup.procs").write_text(pid)
    control.write_text("+memory")


def _remove_stale(parent: Path) -> None:
    """Removes the cgroups of sandboxes whose service died without closing them."""
    for base in parent.glob(f"{_CGROUP_PREFIX}*"):
        pid = base.name.removeprefix(_CGROUP_PREFIX).partition("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            _remove_tree(base)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _remove_tree(folder: Path) -> None:
    """Removes an empty cgroup and its empty children (a cgroup's files go with its folder)."""
    try:
        for child in folder.iterdir():
            if child.is_dir():
                child.rmdir()
        folder.rmdir()
    except OSError as exc:
        log.warning("cannot remove sandbox cgroup %s: %s", folder, exc)


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
