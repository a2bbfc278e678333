"""The processes users' environments run in: `python -m zerobubble.environment.worker FD SERVICE_PID`.

The parent (a fresh interpreter in a session of its own, never a fork of the threaded server) imports every
configured environment once, derives its tools' schemas and says so. Then, for each episode, the service hands it
one end of a new socket pair (SCM_RIGHTS) and the parent forks: the child is the episode's process, in a session
of its own (killing it kills what it started), dying with the parent (PR_SET_PDEATHSIG), speaking JSON with the
service over that socket until the service closes it. A fork costs a millisecond and shares the imported code;
an episode that hangs or crashes takes no other episode with it.

Under isolation (workers.isolation) the parent runs in bubblewrap's process and IPC namespaces and, before it imports
anything of the user's, becomes workers.uid. The service puts each episode's process in a cgroup of its own
(containment.py), by the pid the kernel gives it with the child's first byte (SCM_CREDENTIALS: unforgeable, and the
service's view of it, not the namespace's).

Messages (JSON lists) on an episode's socket: the child first sends one byte (its credentials); then the service sends
["open", ENVIRONMENT, ROW] and ["step", TEXT], answered by ["opened", OPENING_JSON] and ["stepped", OBSERVATION,
REWARD, DONE, INFO, TOOL_CALLS], or ["failed", CODE, MESSAGE] when the environment did wrong.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import select
import signal
import socket
import sys
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from zerobubble.common.sandbox.sandbox_entry import become
from zerobubble.environment.config import EnvironmentConfig
from zerobubble.environment.contract import BadReply
from zerobubble.environment.episode import Blueprint, Bounds, Episode, blueprint, step_payload

_PR_SET_PDEATHSIG = 1
_ORPHAN_CHECK_SECONDS = 1.0
FORK = b"F"


def _send(conn: Connection, message: list) -> None:
    conn.send_bytes(json.dumps(message, ensure_ascii=False, allow_nan=False).encode())


def _serve_episode(conn: Connection, plans: dict[str, Blueprint], bounds: Bounds) -> None:
    os.write(conn.fileno(), b"P")  # the kernel attaches this process's credentials for the service to read
    episode = None
    while True:
        try:
            kind, *args = json.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        try:
            if kind == "open":
                name, row = args
                episode = Episode(plans[name], bounds)
                reply = ["opened", episode.open(row)]
            else:
                reply = ["stepped", *step_payload(episode.step(args[0]))]
            encoded = json.dumps(reply, ensure_ascii=False, allow_nan=False)
        except BadReply as failed:
            encoded = json.dumps(["failed", failed.code, str(failed)])
        except (TypeError, ValueError) as exc:  # checked values are JSON; this is a message out of order
            encoded = json.dumps(["failed", "error", f"{type(exc).__name__}: {exc}"])
        conn.send_bytes(encoded.encode())


def _in_a_child(work: Callable[[], Any]) -> Any:
    """work() (the tools' schemas, an MCP server's listing) in a fork that exits after: transformers, which derives
    schemas, stays out of the parent, whose every fork for an episode would otherwise copy its page tables (7 ms
    instead of 0.3 here), and so do the threads and processes of an MCP client, which a fork must not inherit."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read)
        try:
            reply = ["ok", work()]
        except BaseException as exc:  # noqa: BLE001 - reported by the parent as the entry's error
            reply = ["error", f"{type(exc).__name__}: {exc}"]
        with os.fdopen(write, "wb") as out:
            out.write(json.dumps(reply).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as source:
        data = source.read()
    os.waitpid(child, 0)
    kind, value = json.loads(data) if data else ["error", "listing the tools killed its process"]
    if kind != "ok":
        raise ValueError(value)
    return value


def _become_episode(fd: int, control: socket.socket, plans: dict[str, Blueprint], bounds: Bounds) -> None:
    """In the forked child: its own session, dead with the parent, then the episode."""
    parent = os.getppid()
    os.setsid()
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the death signal was armed
        os._exit(1)
    control.close()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        _serve_episode(Connection(fd), plans, bounds)
    finally:
        os.killpg(0, signal.SIGKILL)


def _parent(fd: int, service_pid: int) -> None:
    control = socket.socket(fileno=fd)
    conn = Connection(os.dup(fd))
    settings = json.loads(conn.recv_bytes())
    memory_bytes, max_open_files = settings["memory_bytes"], settings["max_open_files"]
    # Hard limits, before any user's module is imported: its code cannot raise them again.
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_NOFILE, (max_open_files, max_open_files))
    if settings["uid"] is not None:
        become(settings["uid"])
    bounds = Bounds(**settings["bounds"])
    plans = {}
    for index, entry in settings["environments"]:
        config = EnvironmentConfig.model_validate(entry)
        try:
            plans[config.name] = blueprint(config, bounds, isolate=_in_a_child)
        except BaseException as exc:  # noqa: BLE001 - reported to the service, which refuses to start
            _send(conn, ["import_error", f"environments[{index}]", f"{type(exc).__name__}: {exc}"])
            return
    _send(conn, ["ready", {name: plan.tools for name, plan in plans.items()},
                 {name: plan.tool_format for name, plan in plans.items()}])
    conn.close()
    # Forked children are reaped by the kernel; the service watches them through their sockets.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    while True:
        readable, _, _ = select.select([control], [], [], _ORPHAN_CHECK_SECONDS)
        if service_pid and os.getppid() != service_pid:  # 0: in a namespace of its own, where the service is not
            return
        if not readable:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(control, 1, 1)
        except OSError:
            return
        if not data:
            return
        for episode_fd in fds:
            if os.fork() == 0:
                _become_episode(episode_fd, control, plans, bounds)
                os._exit(0)
            os.close(episode_fd)


if __name__ == "__main__":
    _parent(int(sys.argv[1]), int(sys.argv[2]))
    os.killpg(0, signal.SIGKILL)
