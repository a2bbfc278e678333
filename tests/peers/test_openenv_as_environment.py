"""An OpenEnv server (an environment written with openenv-core's own server classes, in a process of its own) as an
environment of a real environment service: its observations are what the model reads, its rewards and done the
episode's, and a URL that does not answer refuses the episode with the reason."""

from __future__ import annotations

import json

import grpc
import pytest
from peers_helpers import start_openenv_environment

from zerobubble.common.clients.environment import EnvironmentClient
from zerobubble.common.config import ClientConfig, ConfigError, load_config
from zerobubble.environment.app import build
from zerobubble.environment.config import EnvironmentServiceConfig
from zerobubble.tooling.ports import free_port

ROW = {"messages": [{"role": "user", "content": "Play."}], "ground_truth": "4"}


@pytest.fixture(scope="module")
def service():
    process, url = start_openenv_environment()
    environments = [
        {"name": "guess", "openenv": {"url": url, "observation_field": "prompt", "reset_with_row": True}},
        {"name": "guess_json", "openenv": {"url": url}},
        {"name": "nobody", "openenv": {"url": f"http://127.0.0.1:{free_port()}", "connect_timeout_s": 2.0}},
    ]
    config = load_config(EnvironmentServiceConfig, overrides={
        "server.listen": "127.0.0.1:0", "environments": environments, "limits.step_timeout_s": 8.0})
    host = build(config).start()
    with EnvironmentClient(ClientConfig(address=host.address, timeout_seconds=30, retry_seconds=5)) as client:
        yield client
    host.stop(grace=1.0)
    process.kill()
    process.wait()


def test_an_openenv_servers_episode_is_played_through_the_service(service):
    opened = service.open_episode("guess", ROW)
    assert json.loads(opened.opening_json) == " Guess my number between 1 and 10."
    assert json.loads(opened.tools_json) == []
    step = service.step_episode(opened.episode_id, "Is it 2?")
    assert (json.loads(step.observation_json), step.reward, step.done) == ("higher", pytest.approx(-0.1), False)
    step = service.step_episode(opened.episode_id, "Then 4.")
    assert (step.reward, step.done, step.ended_reason) == (1.0, True, "")
    service.close_episode(opened.episode_id)


def test_without_an_observation_field_the_model_reads_the_whole_observation(service):
    opened = service.open_episode("guess_json", {})
    assert json.loads(json.loads(opened.opening_json)) == {"prompt": " Guess my number between 1 and 10.",
                                                           "guesses": 0}
    step = service.step_episode(opened.episode_id, "9")
    assert json.loads(json.loads(step.observation_json)) == {"prompt": "lower", "guesses": 1}
    service.close_episode(opened.episode_id)


def test_a_url_that_does_not_answer_refuses_the_episode_with_the_reason(service):
    with pytest.raises(grpc.RpcError) as refused:
        service.open_episode("nobody", ROW)
    assert "reset raised" in refused.value.details()
    # The service goes on.
    assert service.open_episode("guess", ROW).episode_id


def test_an_openenv_source_is_one_of_the_sources_and_its_url_is_checked():
    with pytest.raises(ConfigError, match="exactly one of environment"):
        load_config(EnvironmentServiceConfig, overrides={"environments": [
            {"name": "x", "builtin": "calculator", "openenv": {"url": "http://h:1"}}]})
    with pytest.raises(ConfigError, match="openenv.url"):
        load_config(EnvironmentServiceConfig, overrides={"environments": [{"name": "x", "openenv": {"url": "h:1"}}]})
