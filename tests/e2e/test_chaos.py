"""Chaos under `zerobubble up`: each service in turn is killed with kill -9 mid-run; up restarts it, the run
finishes, the trainer goes on from its last checkpoint, and every group the buffer acknowledged is trained exactly
once, or counted as filtered, stale or left over at the end (fewer than a step)."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
from e2e_up import kill_session, service_pids, start_up, steps_trained, tail, wait_for

from zerobubble.buffer.config import BufferServiceConfig
from zerobubble.buffer.core import Buffer
from zerobubble.common.config import load_config

PROMPTS, EPOCHS, GENERATIONS, GROUPS_PER_STEP = 48, 2, 4, 4
STEPS = PROMPTS * EPOCHS // GROUPS_PER_STEP
# A killed worker's prompts come back when its leases expire; checkpoints every other step bound what a killed
# trainer repeats.
SETTINGS = {"task.train_size": PROMPTS, "buffer.prompts.epochs": EPOCHS, "buffer.leases.timeout_seconds": 10,
            "trainer.checkpoint.interval_steps": 2}
# The worker first: its groups after a restart are refused as duplicates until its new sequence numbers pass the
# old ones, which costs the fewer generations the earlier it dies.
KILL_ORDER = ("rollout-0", "reward", "buffer", "trainer")


def rows(run_dir: Path) -> list[dict]:
    path = run_dir / "trainer" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def lineage(all_rows: list[dict]) -> list[dict]:
    """The steps the final weights went through: a resumed trainer writes again the steps after its checkpoint,
    and those later rows replace the ones the killed trainer wrote."""
    by_step = {row["step"]: row for row in all_rows}
    return [by_step[step] for step in sorted(by_step)]


def buffer_counters(run_dir: Path) -> dict:
    """The buffer's counters, replayed from its write-ahead log after the run."""
    config = load_config(BufferServiceConfig, run_dir / "configs" / "buffer.yaml")
    buffer = Buffer(config)
    try:
        return buffer.stats()
    finally:
        buffer.close()


def left_over(trainer_log: str) -> int:
    found = re.findall(r"end of the data: (\d+) groups left over", trainer_log)
    return int(found[-1]) if found else 0


@pytest.mark.slow
def test_up_restarts_every_service_killed_mid_run_and_loses_no_group(tmp_path):
    run_dir, output = tmp_path / "run", tmp_path / "up.out"
    up = start_up(run_dir, output, **SETTINGS)
    started = time.monotonic()
    try:
        wait_for(lambda: len(service_pids(run_dir)) == 4 and steps_trained(run_dir) >= 2, 300,
                 "every service and two steps", up, output)
        for name in KILL_ORDER:
            step = steps_trained(run_dir)
            assert step < STEPS - 4, f"the run was nearly over (step {step} of {STEPS}) before {name} was killed"
            pid = service_pids(run_dir)[name]
            os.kill(pid, signal.SIGKILL)
            if name == "trainer":
                killed_at, checkpoint = time.time(), (run_dir / "trainer" / "checkpoints" / "latest").read_text()
            wait_for(lambda name=name, pid=pid: service_pids(run_dir).get(name) not in (None, pid), 180,
                     f"{name} to be restarted", up, output)
            wait_for(lambda step=step: steps_trained(run_dir) >= step + 2, 300,
                     f"two more steps after {name} was restarted", up, output)
        assert up.wait(600) == 0, tail(output)
        print(f"chaos run: {time.monotonic() - started:.0f} s")
    finally:
        kill_session(up, run_dir)

    said = output.read_text()
    for name in KILL_ORDER:
        assert f"restarting {name}" in said, said
    trainer_log = (run_dir / "logs" / "trainer.log").read_text()
    resumed_at = int(re.findall(r"resumed from \S+ at step (\d+)", trainer_log)[-1])
    assert checkpoint.strip() == f"step-{resumed_at:06d}" and resumed_at >= 2, (checkpoint, resumed_at)
    after_kill = [row for row in rows(run_dir) if row["time"] > killed_at]
    assert after_kill[0]["step"] == resumed_at + 1, "the restarted trainer did not go on from its checkpoint"

    steps = lineage(rows(run_dir))
    assert [row["step"] for row in steps] == list(range(1, len(steps) + 1))
    trained = sum(int(row["samples"]) for row in steps) // GENERATIONS
    stats = buffer_counters(run_dir)
    leftover = left_over(trainer_log)
    print(f"groups: {stats['groups_in']} stored, {trained} trained, {stats['filtered']} filtered, "
          f"{stats['stale_dropped']} stale, {leftover} left over; {len(steps)} steps")
    assert stats["end_of_data"] and stats["queued_groups"] == 0
    # Every prompt of every epoch ended as one stored group or one filtered one.
    assert stats["groups_in"] + stats["filtered"] == PROMPTS * EPOCHS
    # Every stored group was trained on once, dropped as stale, or left over at the end.
    assert leftover < GROUPS_PER_STEP
    assert trained + stats["stale_dropped"] + leftover == stats["groups_in"]
