"""What ties the services of a run to the `zerobubble up` that started them, however it ends (kill -9 and the OOM
killer included), with nothing left to clean up: two file descriptors every service inherits.

- An exclusive flock on RUN_DIR/up.lock. A lock belongs to the open file, which the services share with the
  launcher, so the folder stays claimed while any of them lives; a second launcher on it is refused, naming the
  live processes the file lists.
- The read end of a pipe whose write end only the launcher has. Nothing is ever written: a service's read returns
  end-of-file the moment the launcher is gone, and the service then stops as on SIGTERM, and is killed if that
  takes longer than its grace period.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

LOCK_FILE = "up.lock"
LAUNCHER_FD = "ZEROBUBBLE_LAUNCHER_FD"
# Past its grace period a service that is still stopping is killed; the margin lets a clean stop close what it
# owns after the server (worker pools, logs).
KILL_MARGIN_SECONDS = 5.0


class RunFolderBusy(RuntimeError):
    """Live processes of another run hold the run folder."""


class Tether:
    """The launcher's end: the folder's lock and the pipe's write end, both held until `release()`."""

    def __init__(self, lock_fd: int, read_fd: int, write_fd: int):
        self._lock_fd = lock_fd
        self._read_fd = read_fd
        self._write_fd = write_fd
        self._holders = {"up": os.getpid()}
        self._write_holders()

    @classmethod
    def hold(cls, run_dir: Path) -> Tether:
        """Claim `run_dir`; RunFolderBusy when live processes of another run hold it."""
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunFolderBusy(_busy(run_dir)) from None
        return cls(fd, *os.pipe())

    @property
    def pass_fds(self) -> tuple[int, int]:
        """What a service must inherit."""
        return self._lock_fd, self._read_fd

    @property
    def env(self) -> dict[str, str]:
        return {LAUNCHER_FD: str(self._read_fd)}

    def record(self, name: str, pid: int) -> None:
        """Name a service that now holds the folder, for the refusal of a second launcher."""
        self._holders[name] = pid
        self._write_holders()

    def _write_holders(self) -> None:
        data = json.dumps(self._holders).encode()
        os.ftruncate(self._lock_fd, 0)
        os.pwrite(self._lock_fd, data, 0)

    def release(self) -> None:
        """The launcher lets go; services still running see end-of-file and stop."""
        for fd in (self._write_fd, self._read_fd, self._lock_fd):
            os.close(fd)


def in_use(run_dir: Path) -> str | None:
    """Why `run_dir` cannot be claimed now (live processes of a run hold it), or None; claims nothing."""
    path = run_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _busy(run_dir)
    finally:
        os.close(fd)
    return None


def _busy(run_dir: Path) -> str:
    return (f"{run_dir} is in use by a run that is still alive: {live_holders(run_dir / LOCK_FILE)}; stop it (or "
            "let it finish) first, or choose another run_dir")


def live_holders(path: Path) -> str:
    """The processes the lock file lists that are still alive, as 'NAME (pid N), ...'."""
    try:
        holders = json.loads(path.read_text())
    except (OSError, ValueError):
        holders = {}
    alive = [f"{name} (pid {pid})" for name, pid in holders.items() if _alive(pid)]
    return ", ".join(alive) or f"processes {path} does not name (`fuser {path}` lists them)"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, under another user
    return True


def follow_launcher(grace_seconds: float) -> None:
    """In a service that `zerobubble up` started (it says so in the environment): stop once the launcher is gone."""
    fd = os.environ.pop(LAUNCHER_FD, None)
    if fd is not None:
        threading.Thread(target=_stop_when_gone, args=(int(fd), grace_seconds), name="launcher-watch",
                         daemon=True).start()


def _stop_when_gone(fd: int, grace_seconds: float) -> None:
    while os.read(fd, 1):
        pass
    deadline = grace_seconds + KILL_MARGIN_SECONDS
    log.warning("the launcher is gone: stopping (killed in %.0f s if still running)", deadline)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(deadline)
    log.error("still running %.0f s after the launcher went: killed", deadline)
    # The launcher starts each service as the leader of its own process group: that takes its worker
    # processes along.
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
