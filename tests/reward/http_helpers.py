"""`zerobubble serve reward` with its HTTP endpoints on, as its own process on loopback."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from zerobubble.tooling.ports import free_port

SMALL = {"math.workers": 1, "math.timeout_seconds": 10, "sandbox.slots": 1}


@dataclass(frozen=True)
class Served:
    address: str       # gRPC HOST:PORT
    url: str           # http(s)://HOST:PORT
    metrics_port: int
    log: Callable[[], str]   # the service's log so far
    pid: int


@contextmanager
def serve_reward(scheme: str = "http", host: str = "127.0.0.1", open_files: int | None = None,
                 **settings) -> Iterator[Served]:
    """`open_files`: the service's descriptor limit (ulimit -n), when given."""
    port = free_port()
    sets = {**SMALL, "http.listen": f"{host}:{port}", **settings}
    command = [sys.executable, "-m", "zerobubble", "serve", "reward", "--listen", f"{host}:0",
               "--metrics-port", "0"]
    for key, value in sets.items():
        command += ["--set", f"{key}={value}"]
    # The log goes to a file: a pipe nobody reads would stall the service once full.
    log = tempfile.TemporaryFile(mode="w+")
    limit = None if open_files is None else lambda: resource.setrlimit(resource.RLIMIT_NOFILE,
                                                                          (open_files, open_files))
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True, preexec_fn=limit,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def log_so_far() -> str:
        return os.pread(log.fileno(), os.fstat(log.fileno()).st_size, 0).decode(errors="replace")

    try:
        line = proc.stdout.readline()
        if not line:
            proc.wait(60)
            log.seek(0)
            raise RuntimeError(f"serve reward did not start: {log.read()}")
        ready = json.loads(line)
        yield Served(ready["address"], f"{scheme}://{host}:{port}", ready["metrics_port"], log_so_far, proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
