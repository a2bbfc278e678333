"""The live progress line of `zerobubble up`, read from the trainer's metrics JSONL."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.text import Text


def last_rows(path: Path) -> list[dict]:
    """The rows in the last 8 KiB of a JSONL file (the newest steps), in order."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 8192))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return []
    rows = []
    for line in lines:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def last_row(path: Path) -> dict | None:
    rows = last_rows(path)
    return rows[-1] if rows else None


def describe(row: dict | None, elapsed: float, samples: float, waiting: str = "") -> str:
    if row is None:
        return f"[{elapsed:6.0f}s] waiting for the first training step{waiting}"
    return (f"[{elapsed:6.0f}s] step {row['step']}  reward {row.get('reward_mean', 0):.3f}  "
            f"accuracy {row.get('answer_accuracy', 0):.3f}  policy v{row['policy_version']}  "
            f"staleness {row.get('staleness_mean', 0):.2f}  {samples / elapsed if elapsed else 0:.1f} samples/s"
            f"{episode_failures(row)}")


def failure_reasons(row: dict) -> str:
    """"error 6, timeout 2": a metrics row's failed episodes by reason."""
    prefix = "episodes_failed_"
    return ", ".join(f"{key[len(prefix):]} {value}" for key, value in row.items()
                     if key.startswith(prefix) and value)


def episode_failures(row: dict) -> str:
    """"  env failures 8/8 (error 8)" when episodes of the step ended with their environment failing."""
    if not row.get("episodes_failed"):
        return ""
    return f"  env failures {row['episodes_failed']}/{row.get('episodes', 0)} ({failure_reasons(row)})"


def all_failed_warning(row: dict) -> str | None:
    """The loud line for a step every episode of which failed in its environment, else None."""
    if not row.get("episodes") or row.get("episodes_failed") != row["episodes"]:
        return None
    return (f"WARNING: step {row['step']} trained on nothing: all {row['episodes']} of its episodes ended with their "
            f"environment failing ({failure_reasons(row)}); see the errors above and logs/rollout-*.log")


def evaluation_progress(path: Path) -> str:
    """", 16/50 prompts done, about 40 s left" from the evaluation's progress file, or "" before its first call."""
    try:
        progress = json.loads(path.read_text())
        return (f", {progress['prompts_done']}/{progress['prompts']} prompts done, "
                f"about {progress['seconds_left']:.0f} s left")
    except (OSError, ValueError, KeyError, TypeError):
        return ""


class ProgressLine:
    """One line redrawn in place on a terminal. Otherwise (a log file, CI, tee) a plain line for each new step, at
    most one every `interval` seconds, a line every `interval` seconds while no step comes, and the last step
    always when the run ends."""

    def __init__(self, run_dir: Path, interval: float = 15.0, evaluation: str | None = None):
        """`evaluation`: what the evaluation before training covers (e.g. "50 prompts x 4 samples"), when one runs:
        until the first step the line says it is under way, then its result."""
        # Imported here: the evaluation module brings torch, which the dry run (importing this) must not wait for.
        from zerobubble.rollout.evaluation import PROGRESS_FILE

        self.metrics = run_dir / "trainer" / "metrics.jsonl"
        self.evaluations = run_dir / "eval" / "summary.jsonl"
        self.progress = run_dir / "eval" / PROGRESS_FILE
        self.evaluation = evaluation
        # What else the first step waits for, said on the waiting line (an outside agent's groups).
        self.waiting_for = ""
        self.interval = interval
        self.started = time.monotonic()
        self.samples = 0.0
        self.seen_step = 0
        self.printed_step = 0
        self.live: Live | None = None
        self.last_print = 0.0

    def start(self) -> None:
        self.started = time.monotonic()
        # A resumed run's earlier steps were not made in this launcher's time: the rate counts only new ones.
        row = last_row(self.metrics)
        self.seen_step = self.printed_step = row["step"] if row is not None else 0
        self.last_print = self.started
        if sys.stdout.isatty():
            self.live = Live(Text(""), console=Console(), refresh_per_second=2, transient=False)
            self.live.start()

    def say(self, text: str) -> None:
        """A line of its own, above the progress line on a terminal."""
        if self.live is not None:
            self.live.console.print(Text(text))
        else:
            print(text, flush=True)

    def refresh(self, *, final: bool = False) -> None:
        rows = last_rows(self.metrics)
        row = rows[-1] if rows else None
        # Every step since the last look gets its warning, however many came at once.
        for new in (r for r in rows if r["step"] > self.seen_step):
            if (warning := all_failed_warning(new)) is not None:
                self.say(warning)
        if row is not None and row["step"] > self.seen_step:
            self.samples += row.get("samples", 0) * (row["step"] - self.seen_step)
            self.seen_step = row["step"]
        line = describe(row, time.monotonic() - self.started, self.samples, self.waiting() if row is None else "")
        if self.live is not None:
            self.live.update(Text(line))
            return
        now = time.monotonic()
        new_step = self.seen_step > self.printed_step
        if (new_step and (final or now - self.last_print >= min(self.interval, 1.0))) or \
                (not final and now - self.last_print >= self.interval):
            self.last_print, self.printed_step = now, self.seen_step
            print(line, flush=True)

    def waiting(self) -> str:
        """What goes on before the first step: the evaluation of the starting weights, then its result; and what
        else the step waits for."""
        if self.evaluation is None:
            return self.waiting_for
        done = last_row(self.evaluations)
        if done is None:
            return (f" (evaluating the starting weights first: {self.evaluation}{evaluation_progress(self.progress)})"
                    f"{self.waiting_for}")
        return f" (before training: pass@1 {done['pass@1']:.3f} on {done['prompts']} prompts){self.waiting_for}"

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
        else:
            self.refresh(final=True)
