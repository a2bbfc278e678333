"""Where users' environments run, as the service owns them: a pids cgroup for each episode's process (and one for
the parent that forks them), so that everything an episode starts, whatever session it makes for itself (an MCP
stdio server, a `setsid` child), is killed with the episode, and no episode has more than workers.max_processes
processes and threads at once (a fork bomb fails at once instead of running until the step's deadline).

A cgroup, not RLIMIT_NPROC: that one counts per user id, and root ignores it. Without a pids cgroup it may write
to (not root, no pids controller), episodes fall back to process groups: what leaves the group outlives them.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import time
from pathlib import Path

from zerobubble.common.sandbox.runner import find_cgroup

log = logging.getLogger(__name__)
_PREFIX = "zerobubble-episodes-"  # then the service's pid and a number
_NUMBERS = itertools.count()
_KILL_SECONDS = 5.0


def find_pids_cgroup() -> Path | None:
    """This process's pids cgroup, as a folder: the v1 pids hierarchy where there is one, else the v2 one when it has
    the pids controller."""
    found = find_cgroup("pids", Path("/proc/self/cgroup").read_text(), Path("/proc/self/mountinfo").read_text())
    if found is None:
        return None
    folder, version = found
    if version == 2 and "pids" not in (folder / "cgroup.controllers").read_text().split():
        return None
    return folder


class EpisodeCgroups:
    """A cgroup of this service's own with a leaf for the workers' parent (unlimited: each episode's process starts
    there, as its fork, until the service moves it) and one for each episode's process."""

    def __init__(self, max_processes: int):
        own = find_pids_cgroup()
        if own is None:
            raise OSError("the kernel has no pids cgroup controller mounted")
        self.max_processes = max_processes
        self._v2 = (own / "cgroup.controllers").exists()
        _remove_stale(own)
        if self._v2:
            (own / "cgroup.subtree_control").write_text("+pids")  # EBUSY where own holds processes: unavailable
        self.base = own / f"{_PREFIX}{os.getpid()}-{next(_NUMBERS)}"
        self.base.mkdir()
        if self._v2:
            (self.base / "cgroup.subtree_control").write_text("+pids")

    def leaf(self, name: str, limited: bool = True) -> Path:
        folder = self.base / name
        folder.mkdir(exist_ok=True)
        if limited:
            (folder / "pids.max").write_text(str(self.max_processes))
        return folder

    def episode(self, pid: int, name: str) -> Path:
        """Moves an episode's process (its host pid) into a leaf of its own; what it starts after stays there."""
        folder = self.leaf(name)
        (folder / "cgroup.procs").write_text(str(pid))
        return folder

    def close(self) -> None:
        for folder in [*self.base.iterdir()] if self.base.exists() else []:
            if folder.is_dir():
                kill(folder)
        with contextlib.suppress(OSError):
            self.base.rmdir()


def kill(folder: Path) -> None:
    """Kills every process in a leaf, again until none is left (one may fork between a read and the kills, never
    past pids.max), then removes it."""
    deadline = time.monotonic() + _KILL_SECONDS
    pause = 0.001
    while True:
        try:
            pids = (folder / "cgroup.procs").read_text().split()
        except FileNotFoundError:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        if not pids:
            try:
                folder.rmdir()
                return
            except OSError:  # killed ones not yet gone from the kernel's books
                pass
        if time.monotonic() > deadline:
            log.warning("episode cgroup %s still holds processes [%s]", folder, " ".join(pids))
            return
        time.sleep(pause)
        pause = min(2 * pause, 0.05)


def _remove_stale(own: Path) -> None:
    """Removes what services that died without closing left behind."""
    for base in own.glob(f"{_PREFIX}*"):
        pid = base.name.removeprefix(_PREFIX).partition("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            for folder in base.iterdir():
                if folder.is_dir():
                    kill(folder)
            with contextlib.suppress(OSError):
                base.rmdir()
