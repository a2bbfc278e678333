"""What the rollout workers find of failing environments (rollout/episodes/failures.py), followed onto the console
of `zerobubble up`: each environment's first error of each kind with its traceback, and the stop of a run whose
environments fail every episode, which ends `up` with an error naming the environment and the reason."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from zerobubble.rollout.episodes.failures import FIRST_ERROR, STOPPED

FAILURE_LOG = Path("logs") / "environment-failures.jsonl"


class EnvironmentsFailed(RuntimeError):
    """A rollout worker stopped the run: its environments failed every episode (the message says which, why)."""


class FailureFollower:
    def __init__(self, path: Path, say: Callable[[str], None]):
        self.path = path
        self.say = say
        # A resumed run's earlier failures were shown when they happened.
        self.offset = path.stat().st_size if path.exists() else 0

    def poll(self) -> None:
        """Shows what is new; raises EnvironmentsFailed when a worker stopped the run."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.decode("utf-8", "replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("kind") == FIRST_ERROR:
                self.say(f"{entry.get('worker')}: environment {entry.get('environment')!r} ended an episode with "
                         f"{entry.get('reason')} (the first of its kind; the rest are counted in metrics.jsonl as "
                         f"episodes_failed_{entry.get('reason')}):\n{entry.get('error') or 'no message'}")
            elif entry.get("kind") == STOPPED:
                raise EnvironmentsFailed(f"{entry.get('worker')} stopped the run: {entry.get('message')}")
