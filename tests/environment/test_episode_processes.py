"""What an episode's process starts dies with the episode, whatever session it makes for itself: on close, when the
step is killed, and when the service is stopped by SIGTERM; a fork bomb meets workers.max_processes at once; and
users' environments run isolated: as workers.uid, in a process namespace where the service cannot be seen, so that
its token cannot be read through /proc. Processes are looked for among the host's, by a marker in their command."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml
from env_helpers import USER_ENVS


def running(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def none_left(marker: str, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while running(marker):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def new_marker() -> str:
    return f"3600.{secrets.randbelow(10 ** 9)}"  # a `sleep` argument no other process has


def test_a_detached_child_dies_when_its_episode_closes(environments):
    marker = new_marker()
    opened = environments.open_episode("detaches", {"marker": marker})
    environments.step_episode(opened.episode_id, "go on")
    assert running(marker)
    environments.close_episode(opened.episode_id)
    assert none_left(marker)


def test_a_detached_child_dies_when_its_step_is_killed(environments):
    marker = new_marker()
    opened = environments.open_episode("detaches", {"marker": marker})
    step = environments.step_episode(opened.episode_id, "hang")
    assert step.ended_reason == "timeout"
    assert none_left(marker)


def test_a_fork_bomb_meets_the_process_limit_at_once(environment_host, environments):
    limit = environment_host.core.config.workers.max_processes
    opened = environments.open_episode("fork_bomb", {})
    step = environments.step_episode(opened.episode_id, "boom")
    assert step.ended_reason == "", step
    made, why = json.loads(step.observation_json).split()
    assert why == "BlockingIOError"  # EAGAIN: the pids cgroup's bound
    assert int(made) < limit
    environments.close_episode(opened.episode_id)


def test_an_environment_runs_as_its_own_user_and_cannot_see_the_service(environment_host, environments):
    opened = environments.open_episode("snoops", {"service_pid": os.getpid()})  # the service runs in this process
    info = json.loads(environments.step_episode(opened.episode_id, "look").info_json)
    environments.close_episode(opened.episode_id)
    assert info["uid"] == environment_host.core.config.workers.uid
    assert info["environ"] == "FileNotFoundError"  # not in its /proc at all
    host = sum(name.isdigit() for name in os.listdir("/proc"))
    assert info["processes"] < host  # its namespace: bubblewrap's init, the parent, the episodes, not the host's


def test_a_detached_child_dies_when_the_service_is_stopped_by_sigterm(tmp_path):
    marker = new_marker()
    config = tmp_path / "environment.yaml"
    # A step timeout no loaded machine reaches: this is about the stop, not about a slow step.
    config.write_text(yaml.safe_dump({"server": {"listen": "127.0.0.1:0", "metrics_port": None},
                                      "limits": {"step_timeout_s": 60}, "environments": [
        {"name": "detaches", "environment": "sample_envs:Detaches", "path": str(USER_ENVS)}]}))
    serve = subprocess.Popen([sys.executable, "-m", "zerobubble", "serve", "environment", "--config", str(config)],
                             stdout=subprocess.PIPE, text=True)
    try:
        from zerobubble.common.clients.environment import EnvironmentClient
        from zerobubble.common.config import ClientConfig

        address = json.loads(serve.stdout.readline())["address"]
        with EnvironmentClient(ClientConfig(address=address, timeout_seconds=60)) as client:
            opened = client.open_episode("detaches", {"marker": marker})
            reply = client.step_episode(opened.episode_id, "go on")
        assert (reply.ended_reason, reply.info_json) == ("", "{}"), reply
        assert running(marker)
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(60) == 0
    finally:
        serve.kill()
        serve.wait()
    assert none_left(marker)
