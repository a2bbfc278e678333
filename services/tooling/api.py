"""Launch and follow a run from Python, beside the CLI: `zerobubble.launch(...)` starts `zerobubble up` as a child
process (its services are processes of their own either way) and gives a handle that follows the run through the
files it writes.

    import zerobubble

    run = zerobubble.launch("qwen2.5-0.5b-instruct-gsm8k", model="models/Qwen", run_dir="runs/mine")
    for step in run.steps():            # metrics.jsonl rows, as the trainer writes them
        print(step["step"], step["reward_mean"])
    print(run.wait())                   # up's final summary (held-out pass@1 before and after, the plot)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from zerobubble.tooling.configs import DEMO, named


class RunFailed(RuntimeError):
    """`up` ended with a non-zero code; the message has the end of its output."""


class RunHandle:
    def __init__(self, process: subprocess.Popen, run_dir: Path, output: Path):
        self.process = process
        self.run_dir = run_dir
        self.output = output

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def steps(self, poll_seconds: float = 0.5) -> Iterator[dict[str, Any]]:
        """Each training step's figures as the trainer records it, until the run ends."""
        path, offset = self.run_dir / "trainer" / "metrics.jsonl", 0
        while True:
            ended = not self.running
            if path.exists():
                with open(path, encoding="utf-8") as rows:
                    rows.seek(offset)
                    while (line := rows.readline()).endswith("\n"):
                        offset += len(line.encode())
                        yield json.loads(line)
            if ended:
                return
            time.sleep(poll_seconds)

    def wait(self, timeout: float | None = None) -> dict[str, Any]:
        """Up's final summary; RunFailed when it ended otherwise."""
        code = self.process.wait(timeout)
        lines = self.output.read_text(errors="replace").splitlines()
        if code != 0:
            raise RunFailed(f"zerobubble up exited with {code}:\n" + "\n".join(lines[-30:]))
        return json.loads(next(line for line in reversed(lines) if line.startswith("{")))

    def stop(self, timeout: float = 60.0) -> int:
        """Stop the run as Ctrl-C does: every service stops cleanly, the last checkpoint stays resumable."""
        if self.running:
            self.process.send_signal(signal.SIGINT)
        return self.process.wait(timeout)


def launch(config: str | Path | None = None, **settings: Any) -> RunHandle:
    """Start `zerobubble up` on `config` (a file, a shipped config's name, or None: as the CLI chooses, the demo or
    the general default for one's own model or data) with `settings`
    as `--set` overrides by dotted key (`run_dir="runs/x"`, `**{"run.max_new_tokens": 256}`). The configuration is
    checked before anything starts: a mistake raises RunFailed at `wait()` within seconds, naming the field."""
    path = named(Path(config)) if config is not None else None
    run_dir = Path(settings.get("run_dir") or _run_dir_of(path or DEMO))
    # Beside the run folder, not in it: the folder belongs to the run, which `up` makes.
    output = run_dir.with_name(run_dir.name + ".launch.log")
    output.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "zerobubble", "up", *(["--config", str(path)] if path else []),
               *(f"--set={key}={value}" for key, value in settings.items())]
    with open(output, "ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=os.environ.copy())
    return RunHandle(process, run_dir, output)


def _run_dir_of(path: Path) -> str:
    import yaml

    return (yaml.safe_load(path.read_text()) or {}).get("run_dir", "runs/demo")
