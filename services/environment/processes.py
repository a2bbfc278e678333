"""The service's side of the episode processes (worker.py): starts the parent that imported the users'
environments, asks it for one process per episode, and talks to that process under a time limit. Whatever the
process does wrong (hangs, dies, sends garbage or too much) ends its episode with a stable code and kills it; the
parent, if it dies, is started again for the next episode. The service unpickles nothing and reads at most a
bounded reply. Each episode's process, and all it starts, is in a cgroup of its own (containment.py) killed with the
episode; under isolation the parent runs in bubblewrap's namespaces as workers.uid (worker.py)."""

from __future__ import annotations

import itertools
import json
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from zerobubble.common.config import ConfigError
from zerobubble.common.errors import TemporarilyUnavailable
from zerobubble.common.user_code import BASIC_ENV, shown
from zerobubble.environment import containment
from zerobubble.environment.config import EnvironmentConfig, WorkersConfig
from zerobubble.environment.contract import (
    BAD_REPLY,
    ERROR,
    EXITED,
    TIMEOUT,
    TOO_LARGE,
    BadReply,
    Step,
    check_messages,
    loads_bounded,
)
from zerobubble.environment.episode import Bounds
from zerobubble.environment.isolation import bwrap_command, isolation_of
from zerobubble.environment.worker import FORK

log = logging.getLogger(__name__)
_REPLY_SLACK = 64 * 1024  # the reply's frame around the observation and info, each bounded by config
# The codes an episode's process may end its episode with; any other is itself out of contract.
WORKER_CODES = (ERROR, BAD_REPLY, TOO_LARGE)
_CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid
# The parent joins its cgroup before it becomes bubblewrap, so that every process it starts is in there.
_JOIN_CGROUP = 'echo $$ > "$0" && exec "$@"'


class EpisodeProcesses:
    """The parent process of the episode processes, started again when it has died."""

    def __init__(self, entries: list[tuple[int, EnvironmentConfig]], workers: WorkersConfig, bounds: Bounds):
        self._entries = entries
        self._workers = workers
        self._bounds = bounds
        self._lock = threading.Lock()
        self.restarts = 0
        self.tools: dict[str, list[dict]] = {}
        self.tool_formats: dict[str, str] = {}
        self._process: subprocess.Popen | None = None
        self._control: socket.socket | None = None
        self.isolated, why = isolation_of(workers, [entry for _, entry in entries])
        self.cgroups: containment.EpisodeCgroups | None = None
        try:
            self.cgroups = containment.EpisodeCgroups(workers.max_processes)
        except OSError as exc:
            if self.isolated and workers.isolation == "on":
                raise ConfigError(f"workers.isolation: on, but no pids cgroup for the episodes: {exc}") from None
            log.warning("episodes' processes run without a pids cgroup (what leaves their process group outlives "
                        "them, workers.max_processes is not applied): %s", exc)
            self.isolated = False
            why = why or "no pids cgroup"
        if not self.isolated:
            log.warning("users' environments run as the service's user, without isolation: %s", why)
        self._names = itertools.count()
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        environment = {name: os.environ[name] for name in (*BASIC_ENV, *self._workers.env) if name in os.environ}
        environment["PYTHONUNBUFFERED"] = "1"  # an episode's prints reach the log before it is killed
        command = [sys.executable, "-m", "zerobubble.environment.worker", str(theirs.fileno()),
                   str(0 if self.isolated else os.getpid())]
        if self.isolated:
            environment["HOME"] = "/tmp"  # the service's home is not workers.uid's
            command = [*bwrap_command([entry for _, entry in self._entries]), *command]
        if self.cgroups is not None:
            joined = self.cgroups.leaf("parent", limited=False) / "cgroup.procs"
            command = ["/bin/sh", "-c", _JOIN_CGROUP, str(joined), *command]
        with theirs:
            self._process = subprocess.Popen(
                command, env=environment, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, start_new_session=True,
                # What users' code prints goes to the service's log, never into its own stdout (whose first line
                # is the service's address line).
                stdout=sys.stderr.fileno())
        try:
            first = self._handshake(ours)
        except BaseException:
            ours.close()
            self._kill_parent()
            raise
        _, self.tools, self.tool_formats = first
        self._control = ours

    def _handshake(self, ours: socket.socket) -> list:
        """Sends the parent its settings; its first answer, once it has imported the environments."""
        conn = Connection(os.dup(ours.fileno()))
        try:
            conn.send_bytes(json.dumps({
                "memory_bytes": self._workers.memory_bytes, "max_open_files": self._workers.max_open_files,
                "uid": self._workers.uid if self.isolated else None,
                "bounds": asdict(self._bounds),
                "environments": [[index, entry.model_dump(mode="json")] for index, entry in self._entries],
            }).encode())
            if not conn.poll(self._workers.start_timeout_s):
                raise ConfigError(f"environments: importing them took over {self._workers.start_timeout_s:g} s "
                                  "(workers.start_timeout_s)")
            first = json.loads(conn.recv_bytes(16 * 1024 * 1024))
        except (EOFError, OSError):
            raise ConfigError(f"environments: their process exited at start (exit code {self._process.poll()})") \
                from None
        finally:
            conn.close()
        if first[0] == "import_error":
            raise ConfigError(f"{first[1]}: cannot load it: {first[2]}")
        return first

    def open_process(self) -> ProcessEpisode:
        """A new episode process (the parent is started again first if it has died)."""
        with self._lock:
            for attempt in range(2):
                if self._control is None:
                    self._restart()
                ours, theirs = socket.socketpair()
                ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # before the child can write
                try:
                    if self._process.poll() is not None:  # bubblewrap gone: its namespace is going too
                        raise OSError("the parent's bubblewrap exited")
                    socket.send_fds(self._control, [FORK], [theirs.fileno()])
                    return ProcessEpisode(Connection(ours.detach()), self._bounds, self._contain)
                except OSError:
                    ours.close()
                    log.warning("the environments' parent process died (exit code %s); starting it again",
                                self._process.poll())
                    self._kill_parent()
                    if attempt:
                        raise TemporarilyUnavailable("the environments' process died again as it started") from None
                finally:
                    theirs.close()
        raise AssertionError("unreachable")

    def _restart(self) -> None:
        self.restarts += 1
        try:
            self._start()
        except ConfigError as exc:  # it imported at the service's start: something changed or ran out since
            raise TemporarilyUnavailable(f"the environments' process could not be started again: {exc}") from None

    def _contain(self, pid: int) -> Path | None:
        """Puts an episode's process in a cgroup of its own (None where there are none)."""
        if self.cgroups is None:
            return None
        return self.cgroups.episode(pid, f"episode-{next(self._names)}")

    def _kill_parent(self) -> None:
        if self._control is not None:
            self._control.close()
            self._control = None
        if self._process is not None:
            try:
                os.killpg(self._process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._process.wait()
        if self.cgroups is not None:
            containment.kill(self.cgroups.base / "parent")

    def close(self) -> None:
        with self._lock:
            self._kill_parent()
            if self.cgroups is not None:
                self.cgroups.close()


class ProcessEpisode:
    """One episode's process. `ask` raises BadReply with the episode's ended_reason; after that the process is
    dead."""

    def __init__(self, conn: Connection, bounds: Bounds, contain: Callable[[int], Path | None]):
        self._conn = conn
        self._bounds = bounds
        self._contain = contain
        self._cgroup: Path | None = None
        self._pid: int | None = None
        self._max_reply = bounds.max_observation_bytes + bounds.max_info_bytes + _REPLY_SLACK

    def open(self, environment: str, row: dict, timeout: float) -> str:
        reply = self._ask(["open", environment, row], timeout, "opened", 1)
        if not isinstance(reply[0], str):
            self._fail(BAD_REPLY, "the opening is not JSON text")
        try:
            opening = loads_bounded(reply[0])
        except ValueError as exc:
            self._fail(BAD_REPLY, f"the opening is not JSON the service reads: {shown(exc)}")
        if opening is not None and not isinstance(opening, str):
            self._checked(lambda: check_messages(opening, "the opening"))
        return reply[0]

    def step(self, assistant_text: str, timeout: float) -> Step:
        observation, reward, done, info, tool_calls = self._ask(["step", assistant_text], timeout, "stepped", 5)
        if observation is not None and not isinstance(observation, str):
            self._checked(lambda: check_messages(observation, "observation"))
        if (isinstance(reward, bool) or not isinstance(reward, int | float) or not isinstance(done, bool)
                or not isinstance(info, dict) or isinstance(tool_calls, bool) or not isinstance(tool_calls, int)):
            self._fail(BAD_REPLY, "the step's reply is out of contract")
        return Step(observation, float(reward), done, info, tool_calls)

    def _ask(self, message: list, timeout: float, answer: str, fields: int) -> list:
        try:
            if self._pid is None:
                self._pid = self._started(timeout)
                try:
                    self._cgroup = self._contain(self._pid)
                except OSError as exc:
                    self._fail(EXITED, f"the episode's process could not be put in its cgroup: {exc}")
            self._conn.send_bytes(json.dumps(message, ensure_ascii=False).encode())
            reply = self._read(timeout)
        except (EOFError, OSError):  # OSError: also the episode closed (and its socket with it) mid-step
            self._fail(EXITED, "the environment's process exited")
        if isinstance(reply, list) and len(reply) == 3 and reply[0] == "failed":
            self._fail(reply[1] if reply[1] in WORKER_CODES else BAD_REPLY, str(reply[2])[:2000])
        if not (isinstance(reply, list) and len(reply) == fields + 1 and reply[0] == answer):
            self._fail(BAD_REPLY, "the environment's process answered out of contract")
        return reply[1:]

    def _started(self, timeout: float) -> int:
        """The pid of the episode's process, as the kernel gives it with its first byte."""
        if not self._conn.poll(timeout):
            self._fail(TIMEOUT, f"the episode's process did not start within {timeout:g} s")
        with socket.socket(fileno=os.dup(self._conn.fileno())) as raw:
            data, ancillary, _, _ = raw.recvmsg(1, socket.CMSG_SPACE(_CREDENTIALS.size))
        for level, kind, value in ancillary:
            if (level, kind) == (socket.SOL_SOCKET, socket.SCM_CREDENTIALS) and data == b"P":
                return _CREDENTIALS.unpack(value[:_CREDENTIALS.size])[0]
        raise EOFError

    def _read(self, timeout: float) -> Any:
        if not self._conn.poll(timeout):
            self._fail(TIMEOUT, f"no answer within {timeout:g} s (limits.step_timeout_s)")
        try:
            data = self._conn.recv_bytes(self._max_reply)
        except OSError as exc:
            if "bad message length" in str(exc):
                self._fail(TOO_LARGE, f"its reply is over {self._max_reply} bytes")
            raise EOFError from None
        try:
            return loads_bounded(data)
        except ValueError as exc:  # UnicodeDecodeError too
            self._fail(BAD_REPLY, f"its reply is not JSON the service reads: {shown(exc)}")

    def _checked(self, check) -> None:
        try:
            check()
        except BadReply as bad:
            self._fail(bad.code, str(bad))

    def _fail(self, code: str, message: str):
        self.kill()
        raise BadReply(code, message)

    def kill(self) -> None:
        if self._cgroup is not None:
            containment.kill(self._cgroup)
            self._cgroup = None
        elif self._pid is not None:
            try:
                os.killpg(self._pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self._pid = None
        self._conn.close()
