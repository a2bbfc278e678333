"""One episode's environment and the checks around it, the same wherever it runs: in an episode's own process for
users' environments (worker.py), on the service's threads for the calculator and python built-ins."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zerobubble.common.sandbox.runner import CodeSandbox
from zerobubble.common.user_code import import_callable, shown
from zerobubble.environment.calculator import calculator
from zerobubble.environment.calls import parse
from zerobubble.environment.config import FINAL_ANSWER_RULES, EnvironmentConfig
from zerobubble.environment.contract import ERROR, TIMEOUT, BadReply, Step, check_observation, check_step
from zerobubble.environment.deadlines import StepTimeout
from zerobubble.environment.mcp_tools import list_tools, mcp_tools
from zerobubble.environment.tools import ToolEnvironment, final_answer_rule, tool_schema

_TRACE_FRAMES, _TRACE_CHARS = 6, 1200


@dataclass(frozen=True)
class Bounds:
    max_observation_bytes: int
    max_info_bytes: int
    max_tool_output_chars: int


@dataclass(frozen=True)
class Blueprint:
    """How to make the environment of one episode, and the tools it shows the model."""

    make: Callable[[], Any]
    tools: list[dict]
    tool_format: str


def schemas_of(tools: list[Callable]) -> list[dict]:
    return [tool_schema(tool) for tool in tools]


def _directly(work: Callable[[], Any]) -> Any:
    return work()


def blueprint(entry: EnvironmentConfig, bounds: Bounds, sandbox: CodeSandbox | None = None,
              isolate: Callable[[Callable[[], Any]], Any] = _directly) -> Blueprint:
    """Imports what the entry names (users' code: only in a worker process), derives its tools' schemas and lists
    its MCP servers' tools, each through `isolate(work) -> work()`, which may run it elsewhere (its result is JSON);
    ImportError or ValueError say what is wrong with it."""
    path = None if entry.path is None else str(entry.path)
    schemas: list[dict] = []

    def tool_environment(tools: list[Callable], inner: Callable[[], Any] | None = None) -> Callable[[], Any]:
        rule = (final_answer_rule(entry.final_answer) if entry.final_answer in FINAL_ANSWER_RULES
                else import_callable(entry.final_answer, path))
        return lambda: ToolEnvironment(tools, schemas, entry.tool_format, rule, entry.max_tool_calls,
                                       bounds.max_tool_output_chars, None if inner is None else inner())

    if entry.builtin == "calculator":
        tools = [calculator]
        make = tool_environment(tools)
    elif entry.builtin == "python":
        from zerobubble.environment.python_tool import python_tool

        tools = [python_tool(sandbox)]
        make = tool_environment(tools)
    elif entry.builtin == "tools":
        tools = [calculator if name == "calculator" else import_callable(name, path) for name in entry.tools]
        make = tool_environment(tools)
    elif entry.openenv is not None:
        from zerobubble.environment.openenv_proxy import OpenEnvEpisode

        tools = []
        make = lambda: OpenEnvEpisode(entry.openenv)  # noqa: E731 - one line, like the branches beside it
    else:
        cls = import_callable(entry.environment, path)
        tools = getattr(cls, "tools", None) or []
        if not isinstance(tools, list | tuple) or not all(callable(tool) for tool in tools):
            raise ValueError(f"{entry.environment}.tools must be a list of functions")
        tools = list(tools)
        if callable(getattr(cls, "step", None)):
            make = cls
        elif tools:
            make = tool_environment(tools, cls)
        else:
            raise ValueError(f"{entry.environment} has neither step(assistant_text) nor tools")
    schemas.extend(isolate(lambda: schemas_of(tools)) if tools else [])
    if entry.mcp:
        listed = [isolate(lambda server=server: list_tools(server)) for server in entry.mcp]
        offered = mcp_tools(entry.mcp, listed)
        tools.extend(offered)
        schemas.extend(tool.schema for tool in offered)
    names = [schema["function"]["name"] for schema in schemas]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"environments[{entry.name}]: two tools are named {twice[0]!r}")
    return Blueprint(make, schemas, entry.tool_format if tools else "")


class Episode:
    """reset and step of one environment instance, each answer checked; what the environment does wrong is raised
    as BadReply with the episode's ended_reason."""

    def __init__(self, plan: Blueprint, bounds: Bounds):
        self._plan = plan
        self._bounds = bounds
        self._environment: Any = None

    def open(self, row: dict) -> str:
        """The opening as JSON."""
        try:
            self._environment = self._plan.make()
            opening = self._environment.reset(row) if hasattr(self._environment, "reset") else None
        except BaseException as exc:  # noqa: BLE001 - sys.exit in the user's code is its failure too
            raise BadReply(ERROR, f"reset raised {type(exc).__name__}: {shown(exc)}{_trace(exc)}") from None
        return check_observation(opening, "the opening", self._bounds.max_observation_bytes)

    def step(self, assistant_text: str) -> Step:
        try:
            value = self._environment.step(assistant_text)
        except StepTimeout as late:
            raise BadReply(TIMEOUT, str(late)) from None
        except BaseException as exc:  # noqa: BLE001
            raise BadReply(ERROR, f"step raised {type(exc).__name__}: {shown(exc)}{_trace(exc)}") from None
        try:
            step = check_step(value, self._bounds.max_observation_bytes, self._bounds.max_info_bytes)
        except BadReply:
            raise
        except BaseException as exc:  # noqa: BLE001 - a dict subclass whose reading fails
            raise BadReply(ERROR, f"reading what step returned raised {type(exc).__name__}") from None
        calls = len(parse(assistant_text, self._plan.tool_format)) if self._plan.tool_format else 0
        return Step(step.observation, step.reward, step.done, step.info, calls)


def _trace(exc: BaseException) -> str:
    """The innermost frames of the user's exception, after a newline: what the user needs to find the line at
    fault, short enough to travel in a status message."""
    # The first frame is the call into the user's code, here.
    user_frames = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
    try:
        frames = "".join(traceback.format_tb(user_frames, limit=-_TRACE_FRAMES))
    except Exception:  # noqa: BLE001 - a frame whose source cannot be read still leaves the message
        return ""
    return f"\nTraceback (innermost frames):\n{frames[-_TRACE_CHARS:]}".rstrip() if frames else ""


def step_payload(step: Step) -> list:
    """A Step as the JSON list a worker sends."""
    return [step.observation, step.reward, step.done, step.info, step.tool_calls]
