"""Assembles the environment service: the code sandbox (for the python tool), the episode processes, the core,
servicer and host."""

from __future__ import annotations

from zerobubble.common.sandbox.runner import CodeSandbox
from zerobubble.common.server import ServiceHost
from zerobubble.environment.config import EnvironmentServiceConfig
from zerobubble.environment.core import EpisodeService
from zerobubble.environment.metrics import EnvironmentMetrics
from zerobubble.environment.servicer import EnvironmentServicer
from zerobubble.v1 import environment_pb2_grpc

CONFIG_SCHEMA = EnvironmentServiceConfig


class EnvironmentHost(ServiceHost):
    """A ServiceHost that also owns the episodes, their processes and the sandbox: stopping it stops them too."""

    def __init__(self, config: EnvironmentServiceConfig):
        super().__init__("environment", config.server)
        uses_python = any(entry.builtin == "python" for entry in config.environments)
        self.sandbox = CodeSandbox(config.sandbox) if uses_python else None
        metrics = EnvironmentMetrics(self.registry)
        try:
            self.core = EpisodeService(config, metrics, self.sandbox)
        except BaseException:
            if self.sandbox is not None:
                self.sandbox.close()
            raise
        metrics.expose(self.core.live, lambda: 0 if self.core.processes is None else self.core.processes.restarts)
        self.servicer = EnvironmentServicer(self.core)
        self.add(environment_pb2_grpc.add_EnvironmentServiceServicer_to_server, self.servicer,
                 "zerobubble.v1.EnvironmentService")

    def stop(self, grace: float | None = None) -> None:
        super().stop(grace)
        self.servicer.close()
        self.core.close_all()
        if self.sandbox is not None:
            self.sandbox.close()


def build(config: EnvironmentServiceConfig) -> EnvironmentHost:
    """The environment service, not yet started (call `start()`)."""
    return EnvironmentHost(config)
