"""`zerobubble up` with two data-parallel trainer ranks: a real run on the small demo, the trainer's agent killed
with kill -9 mid-run (its ranks follow it), restarted with resume, and every group trained once in the end."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from e2e_helpers import loaded_versions
from e2e_up import (
    assert_every_group_accounted_for,
    kill_session,
    lineage,
    metrics_rows,
    start_up,
    steps_trained,
    tail,
    wait_for,
)

PROMPTS = 32


def trainer_processes(run_dir: Path) -> dict[str, list[int]]:
    """The live processes serving the run's trainer config: the agent and its ranks (found in /proc)."""
    config = str(run_dir / "configs" / "trainer.yaml")
    found: dict[str, list[int]] = {"agent": [], "rank": []}
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            zombie = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            continue
        if config in argv and "zerobubble.tooling.launcher.data_parallel" in argv and not zombie:
            found["rank" if "rank" in argv else "agent"].append(int(entry.name))
    return found


@pytest.mark.slow
def test_up_trains_on_two_ranks_through_a_kill_of_the_trainer(tmp_path):
    run_dir, output = tmp_path / "run", tmp_path / "up.out"
    up = start_up(run_dir, output, trainer_processes=2, **{"trainer.checkpoint.interval_steps": 2,
                                                           "task.train_size": PROMPTS})
    try:
        wait_for(lambda: steps_trained(run_dir) >= 3, 300, "three steps", up, output)
        first = trainer_processes(run_dir)
        assert len(first["agent"]) == 1 and len(first["rank"]) == 2, first
        os.kill(first["agent"][0], signal.SIGKILL)
        # The ranks see their agent go and stop; up restarts the trainer, which resumes from its checkpoint. The
        # restarted trainer may finish this short run before they are gone (they close their group with a dead
        # peer): up's end is no failure here, ranks that outlive the wait are.
        wait_for(lambda: not set(first["rank"]) & set(trainer_processes(run_dir)["rank"]), 60,
                 "the ranks of the killed agent to stop")
        assert up.wait(600) == 0, tail(output)
    finally:
        kill_session(up, run_dir)

    said = output.read_text()
    assert "trainer was killed by SIGKILL; restarting trainer" in said, tail(output)
    assert_every_group_accounted_for(run_dir, PROMPTS)
    trained = [group for row in lineage(metrics_rows(run_dir)) for group in row["groups"]]
    assert len(trained) == len(set(trained)), "a group trained twice"
    log = (run_dir / "logs" / "trainer.log").read_text(errors="replace")
    assert "resumed from" in log and log.count("listening on") == 2, "rank 0 alone logs, once per start"
    assert loaded_versions(run_dir / "logs" / "rollout-0.log")[-1] >= steps_trained(run_dir) - 1, \
        "rank 0 broadcast the weights to the worker"
