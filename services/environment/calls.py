"""Tool calls as the model writes them, in a named format. A call that cannot be read is kept as a `Call` with an
`error`, so that the model is told what was wrong and the episode goes on.

- `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, possibly several in a turn, as Qwen-family
  chat templates emit them (`arguments` may also be a JSON string of the object, as some models write it).
- `compact`: `@name(argument text)`: the text between balanced parentheses is the one argument, given to the
  tool's first parameter. For tiny models, whose every byte is a token.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from zerobubble.environment.contract import loads_bounded

_HERMES = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)
_COMPACT = re.compile(r"@([A-Za-z_]\w*)\(")


@dataclass(frozen=True)
class Call:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    text: str | None = None  # compact: the one argument, for the tool's first parameter
    error: str = ""  # why the call could not be read; it is then not run


def parse(text: str, tool_format: str) -> list[Call]:
    return _hermes(text) if tool_format == "hermes" else _compact(text)


def _hermes(text: str) -> list[Call]:
    calls = []
    for match in _HERMES.finditer(text):
        body, closed = match.group(1).strip(), match.group(2)
        if not closed:
            calls.append(Call("", error="a <tool_call> is not closed by </tool_call>"))
            continue
        try:
            value = loads_bounded(body)
        except ValueError as exc:
            calls.append(Call("", error=f"the tool call is not JSON that can be read ({exc})"))
            continue
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            calls.append(Call("", error='a tool call must be {"name": ..., "arguments": {...}}'))
            continue
        arguments = value.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = loads_bounded(arguments) if arguments.strip() else {}
            except ValueError:
                pass
        if not isinstance(arguments, dict):
            calls.append(Call(value["name"], error="its arguments must be a JSON object"))
            continue
        calls.append(Call(value["name"], arguments))
    return calls


def _compact(text: str) -> list[Call]:
    calls, position = [], 0
    while match := _COMPACT.search(text, position):
        depth, end = 1, match.end()
        while end < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            end += 1
        name = match.group(1)
        if depth:
            calls.append(Call(name, error=f"@{name}( has no closing parenthesis"))
            break
        calls.append(Call(name, text=text[match.end():end - 1]))
        position = end
    return calls
