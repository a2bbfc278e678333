"""What the service decodes is bounded before it is used: an episode's process that sends JSON too deep or an
integer of too many digits ends its episode with `bad_reply` (never UNKNOWN, never a stale reply on the next
step); a model's hermes tool call holding JSON 100,000 deep is an unreadable call the model is told about."""

from __future__ import annotations

import json

import grpc
import pytest


@pytest.mark.parametrize("frame", ["deep", "nested", "digits"])
def test_a_reply_the_service_cannot_decode_ends_the_episode_cleanly(environments, frame):
    opened = environments.open_episode("forger", {})
    step = environments.step_episode(opened.episode_id, frame)
    assert (step.done, step.ended_reason) == (True, "bad_reply")
    assert "not JSON the service reads" in json.loads(step.info_json)["error"]
    with pytest.raises(grpc.RpcError) as next_step:
        environments.step_episode(opened.episode_id, "not_json")
    assert next_step.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "the episode has ended (bad_reply)" in next_step.value.details()
    environments.close_episode(opened.episode_id)


@pytest.mark.parametrize("environment", ["add", "calculator"])  # in an episode's process; on the service's threads
def test_a_tool_call_nested_100000_deep_is_an_observation_not_an_error(environments, environment):
    opened = environments.open_episode(environment, {"ground_truth": "3"})
    deep = '<tool_call>{"name": "add", "arguments": ' + "[" * 100_000 + "]" * 100_000 + "}</tool_call>"
    step = environments.step_episode(opened.episode_id, deep)
    assert (step.done, step.ended_reason) == (False, "")
    [message] = json.loads(step.observation_json)
    assert message["content"].startswith("error: the tool call is not JSON that can be read (it nests deeper than")
    # Numbers past int()'s digit limit, and arguments nested past the bound inside a readable call, alike.
    for body in ('{"name": "add", "arguments": {"a": 1' + "0" * 5000 + ', "b": 1}}',
                 '{"name": "add", "arguments": {"a": ' + "[" * 200 + "]" * 200 + "}}"):
        step = environments.step_episode(opened.episode_id, f"<tool_call>{body}</tool_call>")
        [message] = json.loads(step.observation_json)
        assert message["content"].startswith("error: the tool call is not JSON that can be read"), message
    environments.close_episode(opened.episode_id)
