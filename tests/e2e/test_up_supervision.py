"""`zerobubble up` as a supervisor: its services die with it however it dies, a run folder that live services
hold is refused, and a service that dies is restarted until its restarts are used up."""

from __future__ import annotations

import os
import signal
import time

from e2e_up import (
    assert_every_group_accounted_for,
    kill_session,
    service_pids,
    start_up,
    steps_trained,
    tail,
    wait_for,
)

# SIGTERM first, then the process group is killed after the service's grace period (10 s by default) and a margin;
# the rest is a loaded 2-core machine's slack.
SERVICES_GONE_SECONDS = 40


def test_kill_9_of_up_takes_its_services_down_and_a_live_run_keeps_its_folder(tmp_path):
    run_dir, output = tmp_path / "run", tmp_path / "up.out"
    # Enough epochs that the run is still going when it is killed.
    up = start_up(run_dir, output, **{"buffer.prompts.epochs": 50})
    second = None
    try:
        wait_for(lambda: len(service_pids(run_dir)) == 4 and steps_trained(run_dir) >= 1, 240,
                 "every service and a first step", up, output)
        services = service_pids(run_dir)

        second_output = tmp_path / "second.out"
        second = start_up(run_dir, second_output)
        wait_for(lambda: second.poll() is not None, 120, "the second up to be refused", output=second_output)
        refusal = second_output.read_text()
        assert second.returncode != 0, refusal
        assert str(run_dir) in refusal and f"pid {up.pid}" in refusal, refusal
        assert service_pids(run_dir) == services, "the refused launcher disturbed the live run"

        os.kill(up.pid, signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda: not service_pids(run_dir), SERVICES_GONE_SECONDS, "every service to go with up")
        print(f"every service gone {time.monotonic() - killed:.1f} s after kill -9 of up")
    finally:
        kill_session(up, run_dir)
        if second is not None:
            kill_session(second, run_dir)


def test_a_dead_service_is_restarted_until_its_restarts_are_used_up(tmp_path):
    run_dir, output = tmp_path / "run", tmp_path / "up.out"
    up = start_up(run_dir, output, **{"buffer.prompts.epochs": 50, "restarts.max_per_service": 1})
    try:
        wait_for(lambda: len(service_pids(run_dir)) == 4 and steps_trained(run_dir) >= 1, 240,
                 "every service and a first step", up, output)
        first = service_pids(run_dir)["reward"]
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: service_pids(run_dir).get("reward") not in (None, first), 120,
                 "the reward service to be restarted", up, output)
        assert "reward was killed by SIGKILL; restarting reward in 1.0 s (restart 1 of 1)" in output.read_text(), \
            tail(output)
        step = steps_trained(run_dir)
        wait_for(lambda: steps_trained(run_dir) > step + 1, 180, "training to go on with the new reward service",
                 up, output)

        os.kill(service_pids(run_dir)["reward"], signal.SIGKILL)
        assert up.wait(120) == 1, tail(output)
        said = output.read_text()
        assert "reward" in said and str(run_dir / "logs" / "reward.log") in said, tail(output)
        wait_for(lambda: not service_pids(run_dir), 60, "the other services to be stopped")
    finally:
        kill_session(up, run_dir)


def test_a_trainer_killed_before_its_first_checkpoint_is_given_its_groups_again(tmp_path):
    """With no checkpoint to go back to, the restarted trainer starts from the model, and the groups the buffer
    had delivered to the killed one come again instead of staying delivered to nobody."""
    run_dir, output = tmp_path / "run", tmp_path / "up.out"
    prompts = 32
    up = start_up(run_dir, output, **{"task.train_size": prompts, "trainer.checkpoint.interval_steps": 1000})
    try:
        wait_for(lambda: len(service_pids(run_dir)) == 4 and steps_trained(run_dir) >= 2, 240,
                 "every service and two steps", up, output)
        os.kill(service_pids(run_dir)["trainer"], signal.SIGKILL)
        assert up.wait(600) == 0, tail(output)
    finally:
        kill_session(up, run_dir)
    assert "restarting trainer" in output.read_text()
    assert_every_group_accounted_for(run_dir, prompts)


def test_a_trainer_stopped_by_a_signal_up_did_not_send_is_resumed_and_a_stopped_up_says_the_run_is_unfinished(
        tmp_path):
    # A `docker stop` of the trainer's container or a stray kill is no end of the run: up restarts the trainer with
    # resume. Up stopped by the user says the run did not finish, exits non-zero and prints no final summary.
    run_dir, output = tmp_path / "run", tmp_path / "up.out"
    up = start_up(run_dir, output, **{"buffer.prompts.epochs": 50})
    try:
        wait_for(lambda: len(service_pids(run_dir)) == 4 and steps_trained(run_dir) >= 1, 240,
                 "every service and a first step", up, output)
        first = service_pids(run_dir)["trainer"]
        os.kill(first, signal.SIGTERM)
        wait_for(lambda: service_pids(run_dir).get("trainer") not in (None, first), 120,
                 "the trainer to be restarted", up, output)
        said = output.read_text()
        assert "trainer was stopped by SIGTERM (exit code 143); restarting trainer" in said, tail(output)
        assert "training finished" not in (run_dir / "logs" / "trainer.log").read_text()
        step = steps_trained(run_dir)
        wait_for(lambda: steps_trained(run_dir) > step, 180, "training to go on after the restart", up, output)

        up.send_signal(signal.SIGTERM)
        assert up.wait(120) == 130, tail(output)
        said = output.read_text()
        assert "the run did not finish" in said, tail(output)
        assert '"wall_seconds"' not in said, tail(output)
    finally:
        kill_session(up, run_dir)
