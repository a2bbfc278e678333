"""Chaos under `zerobubble up`: each service in turn is killed with kill -9 mid-run; up restarts it, the run
finishes, the trainer goes on from its last checkpoint, and every group the buffer acknowledged is trained exactly
once, or counted as filtered, stale or left over at the end (fewer than a step)."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
from e2e_up import (
    GROUPS_PER_STEP,
    assert_every_group_accounted_for,
    kill_session,
    metrics_rows,
    service_pids,
    start_up,
    steps_trained,
    tail,
    wait_for,
)

PROMPTS, EPOCHS = 48, 2
STEPS = PROMPTS * EPOCHS // GROUPS_PER_STEP
# A killed worker's prompts come back when its leases expire; checkpoints every other step bound what a killed
# trainer repeats.
SETTINGS = {"task.train_size": PROMPTS, "buffer.prompts.epochs": EPOCHS, "buffer.leases.timeout_seconds": 10,
            "trainer.checkpoint.interval_steps": 2}
# The worker first: its groups after a restart are refused as duplicates until its new sequence numbers pass the
# old ones, which costs the fewer generations the earlier it dies.
KILL_ORDER = ("rollout-0", "reward", "buffer", "trainer")


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
    after_kill = [row for row in metrics_rows(run_dir) if row["time"] > killed_at]
    assert after_kill[0]["step"] == resumed_at + 1, "the restarted trainer did not go on from its checkpoint"

    assert_every_group_accounted_for(run_dir, PROMPTS * EPOCHS)
