"""The generic tool environment: a turn's tool calls (in the environment's `tool_format`) are run and their results
are the observation, one `{"role": "tool", "name": ..., "content": ...}` message per call; a turn without a tool
call is the final answer, which ends the episode with the final-answer reward.

Tools are plain functions with type hints and a docstring; their JSON schemas (the OpenAI function-calling shape)
come from `transformers.utils.get_json_schema`, the function chat templates render `tools=` with. A call's arguments,
in either format, are checked against that schema (jsonschema) before the tool runs; a string that is exactly a
number is taken as the number where the schema asks for one ("7" for an integer; never "seven", "7.5" or "0x7"),
as models often quote numbers. What does not fit is an `error: argument 'NAME': ...` the model reads.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from typing import Any

from zerobubble.common.user_code import shown
from zerobubble.environment.calls import Call, parse
from zerobubble.environment.deadlines import StepTimeout

_BOXED = "\\boxed{"
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_PARAMETER_TYPES: dict[str, Callable[[str], Any]] = {"integer": int, "number": float, "string": str}
# The strings taken as numbers where a parameter's schema asks for one.
_NUMERALS = {"integer": re.compile(r"\s*-?\d{1,300}\s*"), "number": re.compile(r"\s*-?\d{1,300}(?:\.\d{1,300})?\s*")}


def tool_schema(function: Callable) -> dict:
    """The function's OpenAI function schema, from its signature and docstring (ValueError saying why not)."""
    from transformers.utils import get_json_schema

    try:
        schema = get_json_schema(function)
    except Exception as exc:  # noqa: BLE001 - each of its many exception types means the same to the user
        raise ValueError(f"no tool schema for {getattr(function, '__name__', function)!r}: {shown(exc)}") from None
    schema["function"].pop("return", None)  # not part of the OpenAI tools shape
    return schema


def final_answer_rule(name: str) -> Callable[[str, dict], float]:
    """The built-in rule `name` (config.FINAL_ANSWER_RULES) as final_reward(answer_text, row)."""
    return {"none": lambda answer, row: 0.0, "exact": _exact, "last_number": _last_number, "boxed": _boxed}[name]


def _same(answer: str, ground_truth: Any) -> bool:
    if ground_truth is None:
        return False
    expected = str(ground_truth).strip()
    if answer.strip() == expected:
        return True
    try:
        return float(answer) == float(expected)
    except ValueError:
        return False


def _exact(answer: str, row: dict) -> float:
    return float(_same(answer, row.get("ground_truth")))


def _last_number(answer: str, row: dict) -> float:
    numbers = _NUMBER.findall(answer)
    return float(bool(numbers) and _same(numbers[-1], row.get("ground_truth")))


def _boxed(answer: str, row: dict) -> float:
    start = answer.rfind(_BOXED)
    if start < 0:
        return 0.0
    depth, end = 1, start + len(_BOXED)
    while end < len(answer) and depth:
        depth += {"{": 1, "}": -1}.get(answer[end], 0)
        end += 1
    return float(depth == 0 and _same(answer[start + len(_BOXED):end - 1], row.get("ground_truth")))


class ToolEnvironment:
    """One episode over `tools` (whose `schemas` tool_schema gave). `inner`, when given, is the user's instance:
    its reset(row) gives the opening and its final_reward(answer_text, row), if it has one, scores the final answer
    instead of `final_reward`."""

    def __init__(self, tools: list[Callable], schemas: list[dict], tool_format: str,
                 final_reward: Callable[[str, dict], float], max_tool_calls: int, max_output_chars: int,
                 inner: Any = None):
        self.tools = {tool.__name__: tool for tool in tools}
        self.parameters = {tool.__name__: json.dumps(schema["function"].get("parameters") or {}, sort_keys=True)
                           for tool, schema in zip(tools, schemas, strict=True)}
        self.first_parameter = {tool.__name__: next(iter(_properties(schema)), None)
                                for tool, schema in zip(tools, schemas, strict=True)}
        self.tool_format = tool_format
        self.final_reward = getattr(inner, "final_reward", None) or final_reward
        self.max_tool_calls = max_tool_calls
        self.max_output_chars = max_output_chars
        self.inner = inner
        self.row: dict = {}

    def reset(self, row: dict) -> Any:
        self.row = row
        reset = getattr(self.inner, "reset", None)
        return reset(row) if reset is not None else None

    def step(self, assistant_text: str) -> dict:
        calls = parse(assistant_text, self.tool_format)
        if not calls:
            reward = self.final_reward(assistant_text, self.row)
            return {"observation": None, "reward": reward, "done": True, "info": {"final_answer": True}}
        results = [self._run(call) for call in calls[:self.max_tool_calls]]
        if len(calls) > self.max_tool_calls:
            results.append(_message("", f"error: only {self.max_tool_calls} tool calls run in one turn; "
                                        f"{len(calls) - self.max_tool_calls} were left out"))
        return {"observation": results, "reward": 0.0, "done": False, "info": {"tool_calls": len(calls)}}

    def _run(self, call: Call) -> dict:
        if call.error:
            return _message(call.name, f"error: {call.error}")
        tool = self.tools.get(call.name)
        if tool is None:
            return _message(call.name, f"error: no tool {call.name!r}; the tools are {', '.join(self.tools)}")
        try:
            arguments = _checked(self._arguments(call), self.parameters[call.name])
        except ValueError as exc:
            return _message(call.name, self._cut(f"error: {exc}"))
        try:
            result = tool(**arguments)
        except StepTimeout:
            raise
        except Exception as exc:  # noqa: BLE001 - a failing tool is an answer the model reads
            return _message(call.name, self._cut(f"error: {type(exc).__name__}: {exc}"))
        return _message(call.name, self._cut(result if isinstance(result, str) else _text(result)))

    def _arguments(self, call: Call) -> dict:
        if call.text is None:
            return call.arguments
        parameter = self.first_parameter[call.name]
        if parameter is None:
            return {}
        name, kind = parameter
        try:
            return {name: _PARAMETER_TYPES.get(kind, str)(call.text.strip() if kind != "string" else call.text)}
        except ValueError:
            raise ValueError(f"argument {name!r}: {call.text!r} is not of type {kind!r}") from None

    def _cut(self, text: str) -> str:
        if len(text) <= self.max_output_chars:
            return text
        return text[:self.max_output_chars] + f"... [{len(text) - self.max_output_chars} more characters]"


@functools.lru_cache(maxsize=256)
def _validator(parameters: str) -> Any:
    """The validator of a tool's parameters schema (JSON text, so that it can be cached); None for a schema that is
    itself invalid (an MCP server's), whose tool then checks its own arguments."""
    from jsonschema import Draft202012Validator  # with transformers, which made the schema (the train extra)
    from jsonschema.exceptions import SchemaError

    schema = json.loads(parameters)
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError:
        return None
    return Draft202012Validator(schema)


def _checked(arguments: dict, parameters: str) -> dict:
    """The arguments, numerals taken as numbers where the schema asks for numbers, after checking them against the
    schema; ValueError naming the first argument that does not fit."""
    validator = _validator(parameters)
    if validator is None:
        return arguments
    properties = validator.schema.get("properties", {})
    arguments = {name: _numeral(value, properties.get(name)) for name, value in arguments.items()}
    error = next(iter(sorted(validator.iter_errors(arguments), key=lambda e: list(map(str, e.path)))), None)
    if error is None:
        unknown = [name for name in arguments if name not in properties]
        if unknown and "additionalProperties" not in validator.schema:  # a Python function takes no others
            raise ValueError(f"argument {unknown[0]!r}: no such parameter; the parameters are "
                             f"{', '.join(properties) or 'none'}")
        return arguments
    if error.validator == "required" and not error.path:
        missing = next(name for name in error.validator_value if name not in error.instance)
        raise ValueError(f"argument {missing!r}: missing; it is required")
    if error.path:
        raise ValueError(f"argument {str(error.path[0])!r}: {_cut_message(error.message)}")
    raise ValueError(_cut_message(error.message))


def _numeral(value: Any, spec: Any) -> Any:
    kind = spec.get("type") if isinstance(spec, dict) else None
    if isinstance(value, str) and kind in _NUMERALS and _NUMERALS[kind].fullmatch(value):
        return int(value) if kind == "integer" else float(value)
    return value


def _cut_message(message: str) -> str:
    return message if len(message) <= 300 else message[:300] + "..."


def _properties(schema: dict) -> list[tuple[str, str]]:
    properties = schema["function"].get("parameters", {}).get("properties", {})
    return [(name, spec.get("type", "string")) for name, spec in properties.items()]


def _message(name: str, content: str) -> dict:
    return {"role": "tool", "name": name, "content": content}


def _text(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return shown(value)
