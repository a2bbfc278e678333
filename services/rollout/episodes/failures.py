"""Environments failing, made visible: the first error of each kind per environment logged whole (message and
traceback), a batch whose episodes all failed a warning, and a worker whose episodes keep failing stopped with an
error naming the environment and the reason (run_spec.episodes.max_failed_batches), rather than training on
nothing. What it finds also goes, as JSON lines, to a file `zerobubble up` follows onto its console."""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from zerobubble.common.trajectory import Trajectory

log = logging.getLogger(__name__)
FIRST_ERROR, ALL_FAILED, STOPPED = "first_error", "all_failed", "stopped"


class EnvironmentsFailing(RuntimeError):
    """Every episode of the last max_failed_batches batches ended with its environment failing."""


class FailureWatch:
    def __init__(self, worker_id: str, max_failed_batches: int | None, report: Path | None = None):
        self.worker_id = worker_id
        self.max_failed_batches = max_failed_batches
        self.report = report
        self.first_errors: dict[tuple[str, str], str] = {}
        self.failed_batches = 0   # in a row

    def observe(self, samples: Sequence[Sequence[Trajectory]]) -> None:
        """One batch's responses; raises EnvironmentsFailing when the run should stop."""
        records = [s.episode for group in samples for s in group if s.episode is not None]
        if not records:
            return
        failed = [r for r in records if r.failed]
        for record in failed:
            key = (record.environment, record.ended_reason)
            if key not in self.first_errors:
                self.first_errors[key] = record.error
                log.error("environment %r: an episode ended with %s for the first time (later ones are counted, "
                          "not logged): %s", record.environment, record.ended_reason, record.error or "no message")
                self._write(FIRST_ERROR, environment=record.environment, reason=record.ended_reason,
                            error=record.error)
        if len(failed) < len(records):
            self.failed_batches = 0
            return
        self.failed_batches += 1
        (environment, reason), count = Counter((r.environment, r.ended_reason) for r in failed).most_common(1)[0]
        summary = (f"every episode of the batch ({len(records)}) ended with its environment failing, most with "
                   f"environment {environment!r}: {reason} ({count})")
        log.warning("%s; %d batch%s in a row", summary, self.failed_batches, "es" * (self.failed_batches != 1))
        self._write(ALL_FAILED, environment=environment, reason=reason, episodes=len(records),
                    batches=self.failed_batches)
        if self.max_failed_batches is not None and self.failed_batches >= self.max_failed_batches:
            first = self.first_errors.get((environment, reason)) or "no message"
            message = (f"environment {environment!r} failed every episode for {self.failed_batches} batches in a row "
                       f"(run.episodes.max_failed_batches={self.max_failed_batches}), with {reason}; its first "
                       f"error: {first}")
            self._write(STOPPED, environment=environment, reason=reason, error=first, message=message)
            raise EnvironmentsFailing(message)

    def _write(self, kind: str, **fields) -> None:
        if self.report is None:
            return
        line = {"kind": kind, "time": time.time(), "worker": self.worker_id, **fields}
        try:
            self.report.parent.mkdir(parents=True, exist_ok=True)
            with open(self.report, "a", encoding="utf-8") as out:
                out.write(json.dumps(line, ensure_ascii=False) + "\n")
        except OSError as exc:  # the log above has it all the same
            log.warning("cannot write %s: %s", self.report, exc)
