"""A tool call's arguments are checked against the tool's JSON schema before it runs, in both formats, through a real
service: a numeral is taken as the number the schema asks for, anything else that does not fit is an error the model
reads naming the argument, never the tool's raw TypeError nor a wrong result ("1" + "2" = "12")."""

from __future__ import annotations

import json

import pytest


def tool_answers(environments, environment: str, text: str) -> list[str]:
    opened = environments.open_episode(environment, {"ground_truth": "3"})
    step = environments.step_episode(opened.episode_id, text)
    environments.close_episode(opened.episode_id)
    return [message["content"] for message in json.loads(step.observation_json)]


def hermes(name: str, arguments: dict) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


@pytest.mark.parametrize(("arguments", "answer"), [
    ({"a": "1", "b": "2"}, "3"),  # quoted numerals are the integers the schema asks for, not "12"
    ({"a": " -4 ", "b": 2}, "-2"),
    ({"a": "seven", "b": 2}, "error: argument 'a': 'seven' is not of type 'integer'"),
    ({"a": "1.5", "b": 2}, "error: argument 'a': '1.5' is not of type 'integer'"),
    ({"a": True, "b": 2}, "error: argument 'a': True is not of type 'integer'"),
    ({"a": [1], "b": 2}, "error: argument 'a': [1] is not of type 'integer'"),
    ({"a": 1}, "error: argument 'b': missing; it is required"),
    ({"a": 1, "b": 2, "c": 3}, "error: argument 'c': no such parameter; the parameters are a, b"),
])
@pytest.mark.parametrize("environment", ["add", "add_tools"])  # a class's tools; the tools builtin
def test_hermes_arguments_are_checked_against_the_schema(environments, environment, arguments, answer):
    assert tool_answers(environments, environment, hermes("add", arguments)) == [answer]


def test_compact_arguments_are_checked_against_the_schema(environments):
    # The compact format gives its text to the first parameter; a tool needing more is told which one is missing.
    assert tool_answers(environments, "add_compact", "@add(seven) @add(3)") == [
        "error: argument 'a': 'seven' is not of type 'integer'", "error: argument 'b': missing; it is required"]


def test_a_string_parameter_is_never_coerced(environments):
    assert tool_answers(environments, "add", hermes("shout", {"text": 12})) == [
        "error: argument 'text': 12 is not of type 'string'"]
    assert tool_answers(environments, "add", hermes("shout", {"text": "12"})) == ["12"]
