"""`zerobubble up --dry-run`'s look at the run's environments, as the environment service will load them, with
nothing started: each entry's class or tools imported and their schemas derived, its MCP servers' tools listed,
its OpenEnv server's `/health` asked, each within a short deadline. Users' code is imported in a child process, as
the service imports it in its workers, and the child is bounded in time."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from typing import Any

from zerobubble.common.config import ConfigError

# Importing a user's module, or asking an OpenEnv server, takes at most this (an MCP server: its connect_timeout_s).
PROBE_SECONDS = 5.0
# Marks the child's answers among what users' modules may print.
ANSWER = "zerobubble-environment-check "
# What the child may take beyond its MCP servers' deadlines: its own start and the imports.
CHILD_SECONDS = 60.0


def check_environments(tree: dict[str, Any]) -> list[str]:
    """One line per environment saying what it offers; ConfigError naming the entry that cannot be loaded."""
    servers = [server for entry in tree.get("environments") or [] for server in entry.get("mcp") or []]
    limit = CHILD_SECONDS + sum(float(server.get("connect_timeout_s", 10.0)) for server in servers)
    try:
        child = subprocess.run([sys.executable, "-m", __name__], input=json.dumps(tree, default=str),
                               capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"environment.environments: loading them took over {limit:.0f} s") from None
    if child.returncode != 0:
        raise ConfigError(f"environment.environments: checking them failed: {child.stderr.strip()[-2000:]}")
    lines = []
    answers = [line[len(ANSWER):] for line in child.stdout.splitlines() if line.startswith(ANSWER)]
    for result in map(json.loads, answers):
        if "error" in result:
            raise ConfigError(f"environment.environments[{result['name']}]: {result['error']}")
        lines.append(f"environment {result['name']}: {result['offers']}")
    return lines


def _offers(entry, bounds) -> str:
    """What the entry offers the model; raises what the service would raise at its start."""
    from zerobubble.environment.episode import blueprint

    if entry.builtin == "python":
        return "the python tool (run in the service's code sandbox)"
    if entry.openenv is not None:
        url = entry.openenv.url.rstrip("/")
        url = "http" + url[len("ws"):] if url.startswith("ws") else url
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=min(PROBE_SECONDS, entry.openenv.connect_timeout_s)):
                pass
        except OSError as exc:
            raise ValueError(f"openenv.url: the OpenEnv server at {entry.openenv.url} did not answer GET /health "
                             f"({exc})") from None
        return f"the OpenEnv server at {entry.openenv.url} (it answered /health)"
    plan = blueprint(entry, bounds)
    names = [schema["function"]["name"] for schema in plan.tools]
    return f"tools {', '.join(names)} ({plan.tool_format} format)" if names else f"{entry.environment} (reset/step)"


def main() -> None:
    """In the child: the environment section on stdin, one JSON line per environment on stdout."""
    from zerobubble.common.config import load_config
    from zerobubble.environment.config import EnvironmentServiceConfig
    from zerobubble.environment.episode import Bounds

    config = load_config(EnvironmentServiceConfig, None, json.loads(sys.stdin.read()))
    limits = config.limits
    bounds = Bounds(limits.max_observation_bytes, limits.max_info_bytes, limits.max_tool_output_chars)
    for entry in config.environments:
        try:
            result = {"name": entry.name, "offers": _offers(entry, bounds)}
        except (ImportError, ValueError, OSError, TimeoutError) as exc:
            result = {"name": entry.name, "error": f"{type(exc).__name__}: {exc}"}
        print(ANSWER + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
