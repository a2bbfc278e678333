"""The environment service under `zerobubble up`: started when the run lists environments, behind the run's token,
and restarted by the supervisor after kill -9 at the address its peers were given, its episode processes gone with
it."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import grpc
import pytest
from e2e_up import kill_session, service_pids, start_up, steps_trained, tail, wait_for

from zerobubble.common.clients.environment import EnvironmentClient
from zerobubble.common.config import TOKEN_ENV, ClientConfig
from zerobubble.tooling.launcher.ready import read_announcement

USER_ENVS = Path(__file__).resolve().parents[1] / "environment" / "user_envs"
ROW = {"messages": [{"role": "user", "content": "Guess."}], "ground_truth": "42"}


def episode_processes() -> set[int]:
    """The environment services' episode processes and their parents, on this machine."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and b"zerobubble.environment.worker" in (entry / "cmdline").read_bytes():
                found.add(int(entry.name))
        except OSError:
            continue
    return found


def test_the_environment_service_is_restarted_after_kill_9_and_its_episodes_processes_go(tmp_path, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, "environment-e2e-token")
    run_dir, output = tmp_path / "run", tmp_path / "up.out"
    environments = f"[{{name: guess, environment: 'sample_envs:GuessNumber', path: '{USER_ENVS}'}}]"
    up = start_up(run_dir, output, **{"buffer.prompts.epochs": 50, "environment.environments": environments})
    try:
        wait_for(lambda: len(service_pids(run_dir)) == 5 and steps_trained(run_dir) >= 1, 240,
                 "every service, the environment service among them, and a first step", up, output)
        address = read_announcement(run_dir / "logs" / "environment.ready.json")["address"]
        config = ClientConfig(address=address, auth_token_env=TOKEN_ENV, timeout_seconds=30, retry_seconds=60)
        with EnvironmentClient(ClientConfig(address=address, timeout_seconds=10, retry_seconds=0)) as stranger:
            with pytest.raises(grpc.RpcError) as refused:
                stranger.list_environments()
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with EnvironmentClient(config) as client:
            opened = client.open_episode("guess", ROW)
            assert client.step_episode(opened.episode_id, "50").observation_json == \
                '[{"role": "user", "content": "lower"}]'
            before = episode_processes()
            assert before, "no episode process is running"
            first = service_pids(run_dir)["environment"]
            os.kill(first, signal.SIGKILL)
            wait_for(lambda: service_pids(run_dir).get("environment") not in (None, first), 120,
                     "the environment service to be restarted", up, output)
            assert "environment was killed by SIGKILL; restarting environment" in output.read_text(), tail(output)
            wait_for(lambda: not before & episode_processes(), 30, "the killed service's episode processes to go")
            # The restarted service answers at the same address (listing is retried while it starts); the episodes
            # went with the killed one.
            assert [info.name for info in client.list_environments().environments] == ["guess"]
            with pytest.raises(grpc.RpcError) as lost:
                client.step_episode(opened.episode_id, "42")
            assert lost.value.code() == grpc.StatusCode.NOT_FOUND
            again = client.open_episode("guess", ROW)
            assert client.step_episode(again.episode_id, "42").done
        step = steps_trained(run_dir)
        wait_for(lambda: steps_trained(run_dir) > step, 180, "training to go on", up, output)
    finally:
        kill_session(up, run_dir)
