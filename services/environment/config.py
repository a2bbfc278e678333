"""The environment service's configuration schema (all defaults are here)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from zerobubble.common.config import Schema, ServerConfig
from zerobubble.common.sandbox.config import SandboxConfig
from zerobubble.common.user_code import refuse_token_in_env

_NAME = r"[A-Za-z_][\w.-]*"
_TARGET = re.compile(r"[A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*")
# Rules for the final answer that the service itself applies; any other value is a user's `module:function`.
FINAL_ANSWER_RULES = ("none", "exact", "last_number", "boxed")
Builtin = Literal["calculator", "python", "tools"]
ToolFormat = Literal["hermes", "compact"]


def _target(value: str, what: str) -> str:
    if not _TARGET.fullmatch(value):
        raise ValueError(f"expected module:{what} (e.g. my_envs:{what}), got {value!r}")
    return value


class McpServerConfig(Schema):
    """An MCP server whose tools an environment offers: a command it is started with (stdio, one server per
    episode, a child of the episode's process) or the URL of a running one (streamable HTTP)."""

    command: list[str] | None = Field(None, min_length=1, description="stdio: the program and its arguments, "
                                      "e.g. [python, my_tools.py]")
    url: str | None = Field(None, pattern=r"^https?://\S+$", description="streamable HTTP: the server's MCP URL, "
                            "e.g. http://127.0.0.1:8000/mcp")
    env: dict[str, str] = Field(default_factory=dict, description="stdio: variables set for the server beside "
                                "the basic ones (PATH, HOME, ...)")
    tools: list[str] = Field(default_factory=list, description="the server's tools to offer; all when empty")
    connect_timeout_s: float = Field(10.0, gt=0, description="starting or reaching the server and listing its "
                                     "tools")
    call_timeout_s: float = Field(5.0, gt=0, description="one tool call; past it the model reads an error and the "
                                  "next call connects anew")

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("give exactly one of command (stdio) and url (streamable HTTP)")
        if self.env and self.command is None:
            raise ValueError("env: only a stdio server (command) takes environment variables")
        return self

    @property
    def shown(self) -> str:
        return self.url if self.url is not None else " ".join(self.command)


class OpenEnvSource(Schema):
    """An OpenEnv server (openenv-core's HTTP + WebSocket contract) whose episodes are this environment's: one
    WebSocket session each."""

    url: str = Field(pattern=r"^(https?|wss?)://\S+$", description="the server's base URL, e.g. "
                     "http://127.0.0.1:8000")
    action_field: str = Field("message", min_length=1, description="the action's field that carries the "
                              "assistant's turn")
    observation_field: str | None = Field(None, description="the observation's field the model reads (a string or "
                                          "chat messages); the whole observation as JSON when unset")
    opening: bool = Field(True, description="the reset's observation is the opening, appended to the prompt")
    reset_with_row: bool = Field(False, description="reset(row={...}) with the prompt row (for servers that take "
                                 "it)")
    connect_timeout_s: float = Field(10.0, gt=0)
    message_timeout_s: float = Field(60.0, gt=0, description="one reset or step; the service's "
                                     "limits.step_timeout_s cuts it first when shorter")


class EnvironmentConfig(Schema):
    """One environment: a user's class (`environment`), or a built-in (`builtin`): `calculator` and `python` (one
    tool each), `tools` (the user's functions in `tools`)."""

    name: str = Field(pattern=f"^{_NAME}$", description="what OpenEpisode names")
    description: str = ""
    environment: str | None = Field(None, description="module:Class with reset(row) and step(assistant_text), "
                                    "or tools; imported from PYTHONPATH or `path`")
    builtin: Builtin | None = Field(None, description="calculator, python or tools (the functions in `tools`)")
    openenv: OpenEnvSource | None = Field(None, description="an OpenEnv server as the environment (docs: Agents "
                                          "and environments from other tools)")
    tools: list[str] = Field(default_factory=list, description="builtin tools: its tools, each module:function "
                             "with type hints and a docstring, or `calculator`")
    mcp: list[McpServerConfig] = Field(default_factory=list, description="builtin tools: MCP servers whose tools "
                                       "it offers too (docs: Agents and environments from other tools)")
    path: Path | None = Field(None, description="a folder put first on sys.path of the workers to import from")
    tool_format: ToolFormat = Field("hermes", description="how the model writes tool calls: hermes "
                                    "(<tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>) or compact "
                                    "(@name(argument))")
    final_answer: str = Field("none", description="the reward of a turn without a tool call (the final answer), "
                              "for the tool environments: none (0), exact (the answer is the ground truth), "
                              "last_number (its last number equals the ground truth), boxed (its last \\boxed{} "
                              "does), or module:function(answer_text, row) -> float; a class's own final_reward "
                              "comes first")
    max_tool_calls: int = Field(8, gt=0, description="tool calls run in one turn; those beyond are refused in the "
                                "observation")

    @field_validator("environment")
    @classmethod
    def _class(cls, value: str | None) -> str | None:
        return None if value is None else _target(value, "Class")

    @field_validator("tools")
    @classmethod
    def _functions(cls, value: list[str]) -> list[str]:
        return [tool if tool == "calculator" else _target(tool, "function") for tool in value]

    @field_validator("final_answer")
    @classmethod
    def _rule(cls, value: str) -> str:
        return value if value in FINAL_ANSWER_RULES else _target(value, "function")

    @field_validator("path")
    @classmethod
    def _folder(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_dir():
            raise ValueError(f"{value} is not a folder")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> EnvironmentConfig:
        if [self.environment, self.builtin, self.openenv].count(None) != 2:
            raise ValueError(f"environments[{self.name}]: give exactly one of environment (module:Class), builtin and "
                             "openenv")
        if self.builtin == "tools" and not self.tools and not self.mcp:
            raise ValueError(f"environments[{self.name}].tools: the tools builtin needs at least one tool or MCP "
                             "server (mcp)")
        if self.mcp and self.builtin != "tools":
            raise ValueError(f"environments[{self.name}].mcp: only the tools builtin takes MCP servers")
        if self.tools and self.builtin != "tools":
            raise ValueError(f"environments[{self.name}].tools: only the tools builtin takes a list of tools")
        if self.builtin == "python" and self.final_answer not in FINAL_ANSWER_RULES:
            # Its episodes run on the service's threads, beside the sandbox, where no user's code is imported.
            raise ValueError(f"environments[{self.name}].final_answer: the python builtin takes one of "
                             f"{', '.join(FINAL_ANSWER_RULES)}")
        return self

    @property
    def runs_users_code(self) -> bool:
        """Whether its episodes need a worker process: everything but the calculator and python built-ins, which
        are the service's own code, and the python tool's programs run in the sandbox anyway."""
        return self.builtin not in ("calculator", "python") or self.final_answer not in FINAL_ANSWER_RULES


class LimitsConfig(Schema):
    """Sizes are UTF-8 bytes, as the wire counts them."""

    step_timeout_s: float = Field(10.0, gt=0, description="how long reset or one step may take; an environment "
                                  "past it is killed and its episode ends with `timeout`")
    max_observation_bytes: int = Field(64 * 1024, gt=0, description="an opening's or a step's observation, as "
                                       "JSON; a larger one ends the episode with `observation_too_large`")
    max_info_bytes: int = Field(64 * 1024, gt=0, description="a step's info, as JSON")
    max_tool_output_chars: int = Field(4096, gt=0, description="a tool's result is cut to this many characters")
    max_steps: int = Field(64, gt=0, description="steps of one episode; the last one ends it with `max_steps` "
                           "(an environment that never says done)")
    idle_timeout_s: float = Field(600.0, gt=0, description="an episode with no call for this long is closed")
    max_episodes: int = Field(1024, gt=0, description="episodes open at once; more are refused with "
                              "RESOURCE_EXHAUSTED")
    max_row_bytes: int = Field(1024 * 1024, gt=0, description="OpenEpisode's row_json")
    max_assistant_bytes: int = Field(1024 * 1024, gt=0, description="StepEpisode's assistant_text")


class WorkersConfig(Schema):
    """The processes users' environments run in: one per episode, forked from a parent that imported them."""

    start_timeout_s: float = Field(120.0, gt=0, description="how long the parent may take to import the "
                                   "environments at start")
    memory_bytes: int = Field(2 * 1024 ** 3, gt=0, description="address space of each episode's process "
                              "(RLIMIT_AS)")
    max_open_files: int = Field(256, gt=16, description="open files of each episode's process (RLIMIT_NOFILE)")
    env: list[str] = Field(default_factory=list, description="names of the service's environment variables the "
                           "processes get, beside PATH, HOME, LANG, LC_ALL, TZ, TMPDIR and PYTHONPATH; nothing "
                           "else (never the bearer token's variable)")
    max_processes: int = Field(256, gt=1, description="processes and threads of each episode's process and all it "
                               "starts, together (a pids cgroup, where the service may make one)")
    isolation: Literal["auto", "on", "off"] = Field("auto", description="on: the processes run as workers.uid, in "
                                                    "process and IPC namespaces of their own (bubblewrap), so that "
                                                    "they cannot see the service's processes nor read its token; "
                                                    "auto: on where the service runs as root with bubblewrap and a "
                                                    "pids cgroup, else off with a warning; off: as the service's user")
    uid: int = Field(60900, ge=1000, description="the user and group id the processes run as under isolation; "
                     "the environments' folders must be readable by it")


def _default_environments() -> list[EnvironmentConfig]:
    return [EnvironmentConfig(name="calculator", builtin="calculator"),
            EnvironmentConfig(name="python", builtin="python")]


class EnvironmentServiceConfig(Schema):
    server: ServerConfig = ServerConfig(listen="127.0.0.1:50056", max_workers=64)
    environments: list[EnvironmentConfig] = Field(default_factory=_default_environments, description="what "
                                                  "episodes can run: [{name, environment: module:Class | builtin, "
                                                  "...}] (docs: Environments and tools)")
    limits: LimitsConfig = LimitsConfig()
    workers: WorkersConfig = Field(default_factory=WorkersConfig)
    sandbox: SandboxConfig = Field(default_factory=lambda: SandboxConfig(wall_seconds=5.0, cpu_seconds=5),
                                   description="the python tool's programs")

    @model_validator(mode="after")
    def _names(self) -> EnvironmentServiceConfig:
        seen = set()
        for index, entry in enumerate(self.environments):
            if entry.name in seen:
                raise ValueError(f"environments[{index}].name: {entry.name!r} is given twice")
            seen.add(entry.name)
        return self

    @model_validator(mode="after")
    def _calls_within_a_step(self) -> EnvironmentServiceConfig:
        for entry in self.environments:
            for index, server in enumerate(entry.mcp):
                if server.call_timeout_s >= self.limits.step_timeout_s:
                    raise ValueError(f"environments[{entry.name}].mcp[{index}].call_timeout_s: "
                                     f"{server.call_timeout_s} must be under limits.step_timeout_s="
                                     f"{self.limits.step_timeout_s}, or the step is killed before the model hears why")
        return self

    @model_validator(mode="after")
    def _token_stays_out(self) -> EnvironmentServiceConfig:
        refuse_token_in_env(self.server.auth_token_env, self.workers.env, "workers.env", "environments")
        return self
