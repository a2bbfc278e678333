"""The run's launch with nothing started: every service's config built and validated as `up` builds it."""

from __future__ import annotations

from pathlib import Path

from zerobubble.tooling.launcher.config import validated
from zerobubble.tooling.launcher.processes import ServiceProcess
from zerobubble.tooling.launcher.run import Run

# Where a dry run's services "listen": their peers' configs only need an address there.
NOWHERE = "127.0.0.1:1"


class DryRun(Run):
    trees: dict[str, dict]

    def issue_token(self) -> None:
        """A dry run writes nothing into the run folder, and its configs need no token."""

    def start(self, name: str, service: str, schema, tree: dict, **_how_it_runs) -> ServiceProcess:
        validated(schema, tree, f"{service} section")
        # By process name (teacher-SOURCE beside teacher); the rollout workers' trees differ only in their ids.
        key = service if service == "rollout" else name
        self.trees = {**getattr(self, "trees", {}), key: tree}
        process = ServiceProcess(name, service, Path(), Path())
        process.address = NOWHERE
        return process
