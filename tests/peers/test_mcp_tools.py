"""Tools from a real MCP server (made with the mcp SDK, in a process of its own, over stdio and streamable HTTP) in
the tool environment of a real environment service: listed with their schemas, called through the official client
as any other tool, bounded in output, and a failing, hanging or dying server an error the model reads."""

from __future__ import annotations

import json
import secrets
import sys
import time
from pathlib import Path

import pytest
from peers_helpers import start_http_mcp_server, stdio_mcp_command

from zerobubble.common.clients.environment import EnvironmentClient
from zerobubble.common.config import ClientConfig, ConfigError, load_config
from zerobubble.environment.app import build
from zerobubble.environment.config import EnvironmentServiceConfig

ROW = {"messages": [{"role": "user", "content": "Add 2 and 3."}], "ground_truth": "5"}


def call(name: str, **arguments) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


@pytest.fixture(scope="module")
def http_mcp():
    process, url = start_http_mcp_server()
    yield url
    process.kill()
    process.wait()


@pytest.fixture(scope="module")
def service(http_mcp):
    environments = [
        {"name": "mcp_stdio", "builtin": "tools", "final_answer": "exact", "tools": ["calculator"],
         "mcp": [{"command": stdio_mcp_command(), "call_timeout_s": 2.0, "connect_timeout_s": 60}]},
        {"name": "mcp_http", "builtin": "tools", "final_answer": "exact",
         "mcp": [{"url": http_mcp, "tools": ["add", "shout", "sleep"], "call_timeout_s": 1.0}]},
    ]
    config = load_config(EnvironmentServiceConfig, overrides={
        "server.listen": "127.0.0.1:0", "environments": environments, "limits.step_timeout_s": 30.0,
        "limits.max_tool_output_chars": 100})
    host = build(config).start()
    with EnvironmentClient(ClientConfig(address=host.address, timeout_seconds=30, retry_seconds=5)) as client:
        yield client
    host.stop(grace=1.0)


def test_the_servers_tools_are_listed_with_their_schemas(service):
    listed = {info.name: json.loads(info.tools_json) for info in service.list_environments().environments}
    assert [tool["function"]["name"] for tool in listed["mcp_stdio"]] == [
        "calculator", "add", "shout", "fail", "sleep", "die"]
    add = listed["mcp_stdio"][1]["function"]
    assert add["description"].startswith("Adds two integers.")
    assert add["parameters"]["properties"]["a"]["type"] == "integer" and add["parameters"]["required"] == ["a", "b"]
    # Only the tools the entry names.
    assert [tool["function"]["name"] for tool in listed["mcp_http"]] == ["add", "shout", "sleep"]


@pytest.mark.parametrize("environment", ["mcp_stdio", "mcp_http"])
def test_an_mcp_tool_is_called_as_any_other_tool_and_its_output_is_bounded(service, environment):
    opened = service.open_episode(environment, ROW)
    assert "add" in [tool["function"]["name"] for tool in json.loads(opened.tools_json)]
    step = service.step_episode(opened.episode_id, call("add", a=2, b=3) + call("shout", text="hey"))
    added, shouted = json.loads(step.observation_json)
    assert added == {"role": "tool", "name": "add", "content": "5"}
    assert shouted["content"] == "HEY" * 33 + "H... [2900 more characters]"
    assert (step.tool_calls, step.done) == (2, False)
    final = service.step_episode(opened.episode_id, "5")
    assert (final.done, final.reward) == (True, 1.0)
    service.close_episode(opened.episode_id)


def test_a_tool_error_and_bad_arguments_are_errors_the_model_reads(service):
    opened = service.open_episode("mcp_stdio", ROW)
    step = service.step_episode(opened.episode_id, call("fail", reason="nope") + call("add", a="x", b=1))
    failed, bad = [message["content"] for message in json.loads(step.observation_json)]
    assert failed.startswith("error: McpToolError: ") and "fail" in failed
    assert bad == "error: argument 'a': 'x' is not of type 'integer'"  # checked against the schema before the call
    assert not step.done
    service.close_episode(opened.episode_id)


def test_a_hanging_tool_is_cut_at_its_call_timeout_and_the_episode_goes_on(service):
    opened = service.open_episode("mcp_http", ROW)
    step = service.step_episode(opened.episode_id, call("sleep", seconds=30))
    assert json.loads(step.observation_json)[0]["content"] == (
        "error: McpToolError: the MCP server did not answer within 1.0 s")
    assert not step.done and step.ended_reason == ""
    step = service.step_episode(opened.episode_id, call("add", a=1, b=1))
    assert json.loads(step.observation_json)[0]["content"] == "2"
    service.close_episode(opened.episode_id)


def test_a_server_that_dies_is_an_error_and_the_next_call_starts_it_again(service):
    opened = service.open_episode("mcp_stdio", ROW)
    step = service.step_episode(opened.episode_id, call("die"))
    content = json.loads(step.observation_json)[0]["content"]
    assert content.startswith("error: McpToolError: the MCP server"), content
    step = service.step_episode(opened.episode_id, call("add", a=4, b=4))
    assert json.loads(step.observation_json)[0]["content"] == "8"
    service.close_episode(opened.episode_id)


def test_a_server_that_does_not_answer_stops_the_service_at_start_naming_it(tmp_path):
    config = load_config(EnvironmentServiceConfig, overrides={
        "server.listen": "127.0.0.1:0",
        "environments": [{"name": "gone", "builtin": "tools",
                          "mcp": [{"url": "http://127.0.0.1:9/mcp", "connect_timeout_s": 2.0}]}]})
    with pytest.raises(ConfigError) as refused:
        build(config).start()
    assert "environments[0]" in str(refused.value) and "http://127.0.0.1:9/mcp" in str(refused.value)


def test_a_stdio_server_that_exits_at_start_stops_the_service_naming_it():
    config = load_config(EnvironmentServiceConfig, overrides={
        "server.listen": "127.0.0.1:0",
        "environments": [{"name": "broken", "builtin": "tools",
                          "mcp": [{"command": [sys.executable, "-c", "raise SystemExit(2)"],
                                   "connect_timeout_s": 5.0}]}]})
    with pytest.raises(ConfigError) as refused:
        build(config).start()
    assert "environments[0]" in str(refused.value) and "raise SystemExit(2)" in str(refused.value)


def test_bad_mcp_settings_are_refused_naming_the_field():
    with pytest.raises(ConfigError, match="give exactly one of command"):
        load_config(EnvironmentServiceConfig, overrides={
            "environments": [{"name": "x", "builtin": "tools", "mcp": [{}]}]})
    with pytest.raises(ConfigError, match=r"mcp\[0\].call_timeout_s"):
        load_config(EnvironmentServiceConfig, overrides={
            "environments": [{"name": "x", "builtin": "tools", "mcp": [{"url": "http://h/mcp",
                                                                      "call_timeout_s": 30}]}]})
    with pytest.raises(ConfigError, match="only the tools builtin takes MCP servers"):
        load_config(EnvironmentServiceConfig, overrides={
            "environments": [{"name": "x", "builtin": "calculator", "mcp": [{"url": "http://h/mcp"}]}]})


def servers_marked(marker: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and f"ZB_MARKER={marker}".encode() in (entry / "environ").read_bytes():
                found.append(entry.name)
        except OSError:
            continue
    return found


def test_a_blocked_stdio_server_dies_with_its_episode_though_the_sdk_starts_it_in_a_session_of_its_own():
    marker = secrets.token_hex(8)
    blocking = [sys.executable, str(Path(__file__).with_name("peers_mcp_blocking_server.py"))]
    environments = [{"name": "mcp_stdio", "builtin": "tools", "tools": ["calculator"],
                     "mcp": [{"command": stdio_mcp_command(), "call_timeout_s": 2.0, "connect_timeout_s": 60},
                             {"command": blocking, "call_timeout_s": 2.0, "connect_timeout_s": 60,
                              "env": {"ZB_MARKER": marker}}]}]
    host = build(load_config(EnvironmentServiceConfig, overrides={
        "server.listen": "127.0.0.1:0", "environments": environments, "limits.step_timeout_s": 30.0})).start()
    try:
        with EnvironmentClient(ClientConfig(address=host.address, timeout_seconds=30)) as client:
            opened = client.open_episode("mcp_stdio", ROW)
            step = client.step_episode(opened.episode_id, call("block") + call("add", a=1, b=2))
            blocked, added = (message["content"] for message in json.loads(step.observation_json))
            assert blocked == "error: McpToolError: the MCP server did not answer within 2.0 s" and added == "3"
            assert servers_marked(marker)
            client.close_episode(opened.episode_id)
        deadline = time.monotonic() + 10
        while servers_marked(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert servers_marked(marker) == []
    finally:
        host.stop(grace=1.0)
