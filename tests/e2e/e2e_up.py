"""`zerobubble up` as a child process on a small version of the demo, and the service processes it started
(found in /proc by the config files they serve, so the tests do not rely on what the launcher reports)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from e2e_helpers import leftover_groups, metrics_rows, service_env

from zerobubble.buffer.config import BufferServiceConfig
from zerobubble.buffer.core import Buffer
from zerobubble.common.config import load_config
from zerobubble.tooling.configs import DEMO as DEMO_CONFIG

REPO = Path(__file__).resolve().parents[2]
SERVICES = ("reward", "buffer", "trainer", "rollout-0", "environment")
GENERATIONS, GROUPS_PER_STEP = 4, 4
# The demo made small: no warm start (the model is made in a second), a short task, four groups of four per step.
SMALL_RUN = {
    "tiny_model.warm_start_steps": 0, "task.train_size": 32, "task.eval_size": 4, "buffer.prompts.epochs": 1,
    "run.num_generations": GENERATIONS, "run.max_new_tokens": 8,
    "trainer.batch.groups_per_step": GROUPS_PER_STEP,
    "trainer.batch.micro_batch_samples": 16, "rollout.generation.prompts_per_batch": 4,
    "rollout.eval.interval": 1000, "rollout.eval.samples_per_prompt": 2, "final_eval": False,
}


def start_up(run_dir: Path, output: Path, **settings) -> subprocess.Popen:
    """`zerobubble up` on the small demo in `run_dir`, its output to `output`; its own session, so a failing
    test can take down whatever it left."""
    merged = {"run_dir": run_dir, **SMALL_RUN, **settings}
    command = [sys.executable, "-m", "zerobubble", "up", "--config", str(DEMO_CONFIG),
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
    rows = metrics_rows(run_dir)
    return rows[-1]["step"] if rows else 0


def lineage(rows: list[dict]) -> list[dict]:
    """The steps the final weights went through: a restarted trainer writes again the steps after its checkpoint,
    and those later rows replace the ones the killed trainer wrote."""
    by_step = {row["step"]: row for row in rows}
    return [by_step[step] for step in sorted(by_step)]


def buffer_counters(run_dir: Path) -> dict:
    """The buffer's counters, replayed from its write-ahead log after the run."""
    buffer = Buffer(load_config(BufferServiceConfig, run_dir / "configs" / "buffer.yaml"))
    try:
        return buffer.stats()
    finally:
        buffer.close()


def assert_every_group_accounted_for(run_dir: Path, prompts: int) -> None:
    """Every prompt of every epoch ended as one stored group or one filtered; every stored group was trained on
    once in the final lineage, dropped as stale, or left over at the end (fewer than a step)."""
    steps = lineage(metrics_rows(run_dir))
    assert [row["step"] for row in steps] == list(range(1, len(steps) + 1))
    trained = sum(int(row["samples"]) for row in steps) // GENERATIONS
    stats = buffer_counters(run_dir)
    leftover = leftover_groups(run_dir / "logs" / "trainer.log")
    print(f"groups: {stats['groups_in']} stored, {trained} trained, {stats['filtered']} filtered, "
          f"{stats['stale_dropped']} stale, {leftover} left over; {len(steps)} steps")
    assert stats["end_of_data"] and stats["queued_groups"] == 0
    assert stats["groups_in"] + stats["filtered"] == prompts
    assert leftover < GROUPS_PER_STEP
    assert trained + stats["stale_dropped"] + leftover == stats["groups_in"]


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
