"""Service processes on one machine: start, wait until healthy, watch, stop in order."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from zerobubble.tooling.launcher.data_parallel import agent_command
from zerobubble.tooling.launcher.ready import READY_FILE, read_announcement
from zerobubble.tooling.launcher.tether import Tether


class ServiceFailed(RuntimeError):
    """A service process could not start or died when it should not have."""


# A line that starts the account of a failure: a traceback, a logged error, the command's own refusal.
ERROR_LINE = re.compile(r"^(Traceback \(most recent call last\)|zerobubble: )|\b(ERROR|CRITICAL|FATAL)\b|Error: ")
EXCERPT_LINES = 15


def first_error_lines(text: str, most: int = EXCERPT_LINES) -> list[str]:
    """The log's first error and what follows it (a traceback to its exception line, kept whole when it fits), or
    its last lines when none looks like an error."""
    lines = [line for line in text.splitlines() if line.strip()]
    start = next((i for i, line in enumerate(lines) if ERROR_LINE.search(line)), max(0, len(lines) - most))
    if not lines[start:]:
        return []
    if lines[start].startswith("Traceback"):
        # A traceback ends at its first unindented line, the exception: that line is what must show.
        end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith(" ")), len(lines) - 1)
        block = lines[start:end + 1]
        return block if len(block) <= most else [block[0], "    ...", *block[-(most - 2):]]
    return lines[start:start + most]


class ServiceProcess:
    """`zerobubble serve NAME --config FILE` as a child process; its output goes to LOG_DIR/NAME.log, and its address
    line, once it serves, to LOG_DIR/NAME.ready.json (ready.py).

    With a `tether` the service holds the run folder with the launcher and stops when the launcher is gone.
    `restart_overrides` are `--set` items a restart adds (a trainer resumes from its checkpoint). A trainer of
    several `processes` runs them as data-parallel ranks under torch's elastic agent (data_parallel.py)."""

    def __init__(self, name: str, service: str, config_path: Path, log_dir: Path, *, tether: Tether | None = None,
                 restart_overrides: Sequence[str] = (), processes: int = 1):
        self.name = name
        self.service = service
        self.config_path = config_path
        self.log_path = log_dir / f"{name}.log"
        self.ready_path = log_dir / f"{name}.ready.json"
        self.tether = tether
        self.restart_overrides = tuple(restart_overrides)
        self.processes = processes
        self.address = ""
        self.metrics_port: int | None = None
        self.process: subprocess.Popen | None = None
        self.log_offset = 0

    def start(self, timeout: float, extra: Sequence[str] = ()) -> ServiceProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # Where this start's output begins in the log (restarts and retries append to it).
        self.log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.ready_path.unlink(missing_ok=True)
        serve_args = ["--config", str(self.config_path), *extra]
        command = (agent_command(self.processes, serve_args) if self.processes > 1
                   else [sys.executable, "-m", "zerobubble", "serve", self.service, *serve_args])
        env = {**os.environ, "PYTHONUNBUFFERED": "1", READY_FILE: str(self.ready_path),
               **(self.tether.env if self.tether else {})}
        # Children get their own process group so a Ctrl-C reaches the launcher alone, which then stops
        # them in order instead of all at once.
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                            env=env, pass_fds=self.tether.pass_fds if self.tether else ())
        if self.tether is not None:
            self.tether.record(self.name, self.process.pid)
        ready = self._wait_ready(timeout)
        self.address, self.metrics_port = ready["address"], ready.get("metrics_port")
        self.wait_healthy(timeout)
        return self

    def restart(self, timeout: float) -> ServiceProcess:
        """Start it again after it died, at the address its peers were given."""
        return self.start(timeout, ["--listen", self.address, *(f"--set={item}" for item in self.restart_overrides)])

    def _wait_ready(self, timeout: float) -> dict:
        """The service's address line, once it has written it; ServiceFailed when it exits or takes too long."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                ready = read_announcement(self.ready_path)
            except ValueError as exc:
                self.kill()
                raise ServiceFailed(f"{self.name} announced no address ({exc}){self.log_excerpt()}") from None
            if ready is not None:
                return ready
            code = self.exit_code
            if code is not None:
                raise ServiceFailed(f"{self.name} exited with code {code} before serving{self.log_excerpt()}")
            if time.monotonic() > deadline:
                self.kill()
                raise ServiceFailed(f"{self.name} did not start within {timeout:.0f} s{self.log_excerpt()}")
            time.sleep(0.05)

    def wait_healthy(self, timeout: float) -> None:
        # Imported here: the dry run builds processes too, and a refusal need not wait for grpc to load.
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        deadline = time.monotonic() + timeout
        with grpc.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                try:
                    reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=2.0)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                if self.exit_code is not None or time.monotonic() > deadline:
                    raise ServiceFailed(f"{self.name} is not healthy (exit code {self.exit_code})"
                                        f"{self.log_excerpt()}")
                time.sleep(0.2)

    def log_excerpt(self) -> str:
        """What this start wrote to the log that says why it failed, for the console, and where the rest is."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self.log_offset)
                text = log.read().decode(errors="replace")
        except OSError:
            return f"; no log at {self.log_path}"
        lines = first_error_lines(text)
        if not lines:
            return f"; its log ({self.log_path}) is empty"
        return f"; its log ({self.log_path}) says:\n" + "\n".join(f"    {line}" for line in lines)

    @property
    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (graceful: in-flight calls finish), then SIGKILL if it does not end in time."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
