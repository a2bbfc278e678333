"""`zerobubble serve reward` with its HTTP endpoints on, as its own process on loopback."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

SMALL = {"math.workers": 1, "math.timeout_seconds": 10, "sandbox.slots": 1}


@dataclass(frozen=True)
class Served:
    address: str       # gRPC HOST:PORT
    url: str           # http(s)://HOST:PORT
    metrics_port: int


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def serve_reward(scheme: str = "http", host: str = "127.0.0.1", **settings) -> Iterator[Served]:
    port = free_port()
    sets = {**SMALL, "http.listen": f"{host}:{port}", **settings}
    command = [sys.executable, "-m", "zerobubble", "serve", "reward", "--listen", f"{host}:0",
               "--metrics-port", "0"]
    for key, value in sets.items():
        command += ["--set", f"{key}={value}"]
    # The log goes to a file: a pipe nobody reads would stall the service once full.
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        line = proc.stdout.readline()
        if not line:
            proc.wait(60)
            log.seek(0)
            raise RuntimeError(f"serve reward did not start: {log.read()}")
        ready = json.loads(line)
        yield Served(ready["address"], f"{scheme}://{host}:{port}", ready["metrics_port"])
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
