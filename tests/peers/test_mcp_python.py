"""`command: [python, server.py]` (as the guide writes it) runs the MCP server on the environment service's own
interpreter, the one with `mcp` installed, not on whichever `python` comes first on PATH."""

from __future__ import annotations

import os
import sys

from peers_helpers import stdio_mcp_command

from zerobubble.environment.config import McpServerConfig
from zerobubble.environment.mcp_tools import list_tools


def test_python_in_a_stdio_command_is_the_services_interpreter(tmp_path, monkeypatch):
    # The first `python` on PATH has no mcp: it fails whatever it is asked to run.
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'No module named mcp' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    _interpreter, *server = stdio_mcp_command()
    assert _interpreter == sys.executable
    tools = list_tools(McpServerConfig(command=["python", *server], connect_timeout_s=30))
    assert "add" in {tool["function"]["name"] for tool in tools}
