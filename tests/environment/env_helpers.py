"""Starting a real environment service on a loopback port, with the test environments of user_envs/."""

from __future__ import annotations

from pathlib import Path

from zerobubble.common.clients.environment import EnvironmentClient
from zerobubble.common.config import ClientConfig, load_config
from zerobubble.environment.app import build
from zerobubble.environment.config import EnvironmentServiceConfig

USER_ENVS = Path(__file__).resolve().parent / "user_envs"


def user_env(name: str, cls: str, **more) -> dict:
    return {"name": name, "environment": f"sample_envs:{cls}", "path": str(USER_ENVS), **more}


ENVIRONMENTS = [
    {"name": "calculator", "builtin": "calculator", "final_answer": "last_number"},
    {"name": "calc_compact", "builtin": "calculator", "tool_format": "compact", "final_answer": "exact"},
    {"name": "python", "builtin": "python", "tool_format": "compact"},
    {"name": "add_tools", "builtin": "tools", "tools": ["sample_envs:add", "calculator"], "path": str(USER_ENVS),
     "final_answer": "boxed"},
    {"name": "add_compact", "builtin": "tools", "tools": ["sample_envs:add"], "path": str(USER_ENVS),
     "tool_format": "compact"},
    user_env("guess", "GuessNumber"),
    user_env("add", "AddTools"),
    user_env("hangs", "Hangs"),
    user_env("raises", "Raises"),
    user_env("exits", "Exits"),
    user_env("garbage", "Garbage"),
    user_env("huge", "Huge"),
    user_env("never_done", "NeverDone"),
    user_env("reset_fails", "ResetFails"),
    user_env("forger", "Forger"),
    user_env("detaches", "Detaches"),
    user_env("fork_bomb", "ForkBomb"),
    user_env("snoops", "Snoops"),
]
TEST_SETTINGS = {
    "server.listen": "127.0.0.1:0",
    "environments": ENVIRONMENTS,
    "limits.step_timeout_s": 2.0,
    "limits.max_steps": 5,
    "sandbox.slots": 1,
    "workers.max_processes": 32,  # a fork bomb meets it within the step's 2 s, even on a busy machine
}


def start_environment(**overrides):
    return build(load_config(EnvironmentServiceConfig, overrides={**TEST_SETTINGS, **overrides})).start()


def client_of(host) -> EnvironmentClient:
    return EnvironmentClient(ClientConfig(address=host.address, timeout_seconds=30, retry_seconds=5))
