"""The launcher as a supervisor: a service that dies is started again where its peers expect it, after a pause
that doubles with each restart, until its restarts are used up; then the run stops, naming it and its log.

Peers ride out the gap by retrying (a worker or trainer waits for a restarting buffer or reward service; a worker
joins the weight sync again), the buffer recovers from its log, and the trainer is restarted with resume on, from
its newest checkpoint.
"""

from __future__ import annotations

import logging
import signal
import time
from collections import Counter

from zerobubble.tooling.launcher.config import RestartsConfig
from zerobubble.tooling.launcher.processes import ServiceFailed, ServiceProcess

log = logging.getLogger(__name__)


def describe_exit(code: int) -> str:
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    if code > 128 and code - 128 in signal.valid_signals():
        # A service that caught the signal and stopped cleanly exits with the shell's 128 + its number: the trainer
        # does when a signal stops it before the end of its run.
        return f"was stopped by {signal.Signals(code - 128).name} (exit code {code})"
    return f"exited with code {code}"


class Supervisor:
    def __init__(self, services: list[ServiceProcess], trainer: ServiceProcess, policy: RestartsConfig,
                 startup_timeout: float):
        self.services = services
        self.trainer = trainer
        self.policy = policy
        self.startup_timeout = startup_timeout
        self.restarts: Counter[str] = Counter()
        self.due: dict[str, float] = {}  # service name -> when its restart is due (monotonic seconds)

    def check(self) -> bool:
        """One look at every service: restarts what is due; True once the trainer has finished (exit code 0, which
        it gives only at the end of its run: stopped by a signal not sent here, it is restarted with resume as after
        a crash). Raises ServiceFailed when a service died with no restart left."""
        for process in self.services:
            if process.name in self.due:
                if time.monotonic() >= self.due[process.name]:
                    del self.due[process.name]
                    self._restart(process)
                continue
            code = process.exit_code
            if code is None:
                continue
            if process is self.trainer and code == 0:
                return True
            self._schedule(process, code)
        return False

    def _schedule(self, process: ServiceProcess, code: int) -> None:
        done = self.restarts[process.name]
        if done >= self.policy.max_per_service:
            after = f" after {done} restart{'s' * (done != 1)}" if done else ""
            raise ServiceFailed(f"{process.name} {describe_exit(code)}{after}; its log: {process.log_path}")
        self.restarts[process.name] = done + 1
        pause = self.policy.pause_before(done + 1)
        log.warning("%s %s; restarting %s in %.1f s (restart %d of %d); its log: %s", process.name,
                    describe_exit(code), process.name, pause, done + 1, self.policy.max_per_service, process.log_path)
        self.due[process.name] = time.monotonic() + pause

    def _restart(self, process: ServiceProcess) -> None:
        try:
            process.restart(self.startup_timeout)
        except ServiceFailed as exc:
            log.warning("restarting %s failed: %s", process.name, exc)
            process.kill()  # one that never became healthy counts as dead: the next check schedules it again
            return
        log.info("%s restarted (pid %d) at %s", process.name, process.process.pid, process.address)
