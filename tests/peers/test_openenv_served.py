"""Our environments served the OpenEnv way: a real environment service, the OpenEnv server in a process of its own
in front of it, and openenv-core's own client (EnvClient over the WebSocket session) and plain HTTP on the other
side."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from peers_helpers import start_openenv_server

from zerobubble.common.config import load_config
from zerobubble.environment.app import build
from zerobubble.environment.config import EnvironmentServiceConfig

ROW = {"messages": [{"role": "user", "content": "What is 6 * 7?"}], "ground_truth": "42"}
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "6 * 7"}}</tool_call>'


@pytest.fixture(scope="module")
def openenv_url():
    config = load_config(EnvironmentServiceConfig, overrides={
        "server.listen": "127.0.0.1:0",
        "environments": [{"name": "calculator", "builtin": "calculator", "final_answer": "last_number"},
                         {"name": "compact", "builtin": "calculator", "tool_format": "compact",
                          "final_answer": "exact"}]})
    host = build(config).start()
    process, url = start_openenv_server(host.address)
    yield url
    process.kill()
    process.wait()
    host.stop(grace=1.0)


def http(url: str, body: dict | None = None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_openenv_core_client_plays_an_episode_over_the_websocket_session(openenv_url):
    from openenv.core.generic_client import GenericEnvClient

    with GenericEnvClient(base_url=openenv_url).sync() as env:
        opened = env.reset(row=ROW)
        assert opened.done is False
        assert opened.observation["tools"][0]["function"]["name"] == "calculator"
        assert opened.observation["tool_format"] == "hermes"
        step = env.step({"message": f"Let me compute. {CALL}"})
        assert step.observation["messages"] == [{"role": "tool", "name": "calculator", "content": "42"}]
        assert (step.reward, step.done) == (0.0, False)
        assert env.state()["step_count"] == 1
        final = env.step({"message": "It is 42."})
        assert (final.reward, final.done, final.observation["ended_reason"]) == (1.0, True, "")
        # Another environment of the service, named at reset, in the same session.
        env.reset(environment="compact", row=ROW)
        step = env.step({"message": "@calculator(6*7)"})
        assert step.observation["messages"][0]["content"] == "42"


def test_the_http_endpoints_answer_in_openenvs_shapes(openenv_url):
    status, health = http(f"{openenv_url}/health")
    assert status == 200 and health["status"] == "healthy"
    status, schema = http(f"{openenv_url}/schema")
    assert status == 200 and "message" in schema["action"]["properties"]
    assert "ended_reason" in schema["observation"]["properties"]
    status, reset = http(f"{openenv_url}/reset", {"row": ROW})
    assert status == 200 and reset["done"] is False
    assert reset["observation"]["tools"][0]["function"]["name"] == "calculator"
    # Plain HTTP holds no episode across requests (OpenEnv makes an environment per request): it says so.
    status, step = http(f"{openenv_url}/step", {"action": {"message": CALL}})
    assert status == 200 and step["done"] is True and step["observation"]["ended_reason"] == "no_episode"
    status, bad = http(f"{openenv_url}/step", {"action": {"text": CALL}})
    assert status == 422 and "message" in json.dumps(bad)


def test_an_unknown_environment_is_refused_naming_it(openenv_url):
    from openenv.core.generic_client import GenericEnvClient

    with GenericEnvClient(base_url=openenv_url).sync() as env, pytest.raises(Exception) as refused:
        env.reset(environment="nowhere")
    assert "nowhere" in str(refused.value)
    status, body = http(f"{openenv_url}/reset", {"environment": "nowhere"})
    assert status == 404 and "nowhere" in body["detail"]
    status, body = http(f"{openenv_url}/reset", {"row": [1, 2]})
    assert status == 422 and body["detail"].startswith("row:")
