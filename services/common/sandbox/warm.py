"""The host's end of a slot's warm sandbox: one long-lived bubblewrap sandbox whose zygote (`sandbox_entry.py
zygote`) starts each of the slot's programs in namespaces and a /tmp of its own (see sandbox_entry.zygote).

The zygote is started in a cgroup of its own, with a Unix socket to this side and the slot's cgroup.procs (opened
here, so that each run moves itself into the slot's memory cgroup from inside its namespaces). A run is handed over
as one message: the program's /tmp size, and its program, stdin, stdout, stderr and status descriptors; the
zygote answers once it has started the run, so that a zygote found dead is replaced before the run. The zygote
ends when this side closes the socket or dies, and bubblewrap's init takes the slot's sandbox down with it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

_READY = b"ready"
_STARTED = b"started"  # the zygote's answer to a run it has started
_START_SECONDS = 10.0  # for the zygote's interpreter to start and say it is ready, on a crowded machine


class WarmSlotError(RuntimeError):
    """The slot's sandbox could not be started; the message says why."""


class WarmSlot:
    def __init__(self, command: Callable[[int, int], list[str]], pass_fds: Sequence[int], run_procs: Path,
                 env: dict[str, str]):
        """Starts the zygote: `command(control_fd, cgroup_fd)` is its launcher's command line, which gets
        `pass_fds` too. Raises WarmSlotError when it does not say it is ready in time."""
        self._channel, inside = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            cgroup = os.open(run_procs, os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            self._channel.close()
            inside.close()
            raise
        try:
            # No preexec_fn (unsafe with threads), and no --die-with-parent: the parent bubblewrap would watch
            # is the thread that started it, not this process. The zygote ends at the socket's end of file.
            self.process = subprocess.Popen(
                command(inside.fileno(), cgroup), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE, pass_fds=(inside.fileno(), cgroup, *pass_fds), start_new_session=True,
                env=env, cwd="/")
        except OSError as exc:
            self._channel.close()
            raise WarmSlotError(f"cannot start the slot's sandbox: {exc}") from exc
        finally:
            inside.close()
            os.close(cgroup)
        self._await_ready()

    def _await_ready(self) -> None:
        self._channel.settimeout(_START_SECONDS)
        try:
            ready = self._channel.recv(len(_READY))
        except OSError:  # the timeout included
            ready = b""
        self._channel.settimeout(None)
        if ready == _READY:
            self.process.stderr.close()  # the zygote writes nothing there once started
            return
        self.close()
        detail = self.process.stderr.read(64 * 1024).decode(errors="replace").strip()[-500:]
        self.process.stderr.close()
        raise WarmSlotError(f"the slot's sandbox did not start (exit code {self.process.returncode}): {detail}")

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def launch(self, tmp_bytes: int, fds: Sequence[int]) -> bool:
        """Hands the zygote a run: its /tmp size and its program, stdin, stdout, stderr and status descriptors
        (this side keeps its copies). True once the zygote has started it; False when the zygote is gone, or
        did not answer in time (then the caller replaces it)."""
        try:
            socket.send_fds(self._channel, [str(tmp_bytes).encode()], list(fds))
            self._channel.settimeout(_START_SECONDS)
            return self._channel.recv(len(_STARTED)) == _STARTED
        except OSError:  # the timeout included
            return False
        finally:
            self._channel.settimeout(None)

    def close(self) -> None:
        """Ends the slot's sandbox at once and reaps its launcher."""
        self._channel.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)  # the launcher leads its session and group
        self.process.wait()
