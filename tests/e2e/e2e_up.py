"""`zerobubble up` as a child process on a small version of the demo, and the service processes it started
(found in /proc by the config files they serve, so the tests do not rely on what the launcher reports)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from e2e_helpers import service_env

REPO = Path(__file__).resolve().parents[2]
SERVICES = ("reward", "buffer", "trainer", "rollout-0")
# The demo made small: no warm start (the model is made in a second), a short task, four groups of four per step.
SMALL_RUN = {
    "tiny_model.warm_start_steps": 0, "task.train_size": 32, "task.eval_size": 4, "buffer.prompts.epochs": 1,
    "pipeline.num_generations": 4, "pipeline.max_new_tokens": 8, "trainer.batch.groups_per_step": 4,
    "trainer.batch.micro_batch_samples": 16, "rollout.generation.prompts_per_batch": 4,
    "rollout.eval.interval": 1000, "rollout.eval.samples_per_prompt": 2, "final_eval": False,
}


def start_up(run_dir: Path, output: Path, **settings) -> subprocess.Popen:
    """`zerobubble up` on the small demo in `run_dir`, its output to `output`; its own session, so a failing
    test can take down whatever it left."""
    merged = {"run_dir": run_dir, **SMALL_RUN, **settings}
    command = [sys.executable, "-m", "zerobubble.cli", "up", "--config", str(REPO / "configs" / "demo.yaml"),
               *(f"--set={key}={value}" for key, value in merged.items())]
    with open(output, "ab") as out:
        return subprocess.Popen(command, cwd=REPO, env=service_env(), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def service_pids(run_dir: Path) -> dict[str, int]:
    """Every live `zerobubble serve` process serving a config of `run_dir`, by the config's name."""
    configs = {str(run_dir / "configs" / f"{name}.yaml"): name for name in SERVICES}
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            zombie = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            continue
        if "serve" in argv and not zombie:
            for arg in argv:
                if arg in configs:
                    found[configs[arg]] = int(entry.name)
    return found


def wait_for(condition, timeout: float, what: str, up: subprocess.Popen | None = None, output: Path | None = None):
    """Poll `condition` until it gives something true; fail naming `what` (and with up's output if it ended)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if up is not None and up.poll() is not None:
            raise AssertionError(f"zerobubble up exited with {up.returncode} while waiting for {what}:\n"
                                 f"{tail(output)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}:\n{tail(output)}")
        time.sleep(0.2)


def tail(path: Path | None, lines: int = 40) -> str:
    if path is None or not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def steps_trained(run_dir: Path) -> int:
    """The newest step in the trainer's metrics (0 before the first)."""
    path = run_dir / "trainer" / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return rows[-1]["step"] if rows else 0


def kill_session(process: subprocess.Popen, run_dir: Path) -> None:
    """Whatever a test left running: the launcher's session and any service of its run folder."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()
    for pid in service_pids(run_dir).values():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
