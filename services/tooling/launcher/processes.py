"""Service processes on one machine: start, wait until healthy, watch, stop in order."""

from __future__ import annotations

import os
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

    def start(self, timeout: float, extra: Sequence[str] = ()) -> ServiceProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
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
                raise ServiceFailed(f"{self.name} announced no address ({exc}); see {self.log_path}") from None
            if ready is not None:
                return ready
            code = self.exit_code
            if code is not None:
                raise ServiceFailed(f"{self.name} exited with code {code} before serving; see {self.log_path}")
            if time.monotonic() > deadline:
                self.kill()
                raise ServiceFailed(f"{self.name} did not start within {timeout:.0f} s; see {self.log_path}")
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
                    raise ServiceFailed(f"{self.name} is not healthy (exit code {self.exit_code}); see "
                                        f"{self.log_path}")
                time.sleep(0.2)

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
