"""`up --dry-run` lists an MCP server's tools as the environment service will, and refuses a server that cannot
list them, naming the entry (the peers' lane: an MCP server starts slowly)."""

from __future__ import annotations

import json
import sys

import pytest
from peers_helpers import MCP_SERVER

from zerobubble.tooling.cli import main


def dry_run(tmp_path, entry: dict) -> int:
    return main(["up", "--config", "tool-demo", "--set", f"environment.environments={json.dumps([entry])}",
                 "--set", f"run_dir={tmp_path / 'run'}", "--dry-run"])


def test_an_mcp_servers_tools_are_listed(tmp_path, capsys):
    pytest.importorskip("mcp")
    entry = {"name": "calculator", "builtin": "tools", "tools": ["calculator"],
             "mcp": [{"command": [sys.executable, str(MCP_SERVER), "stdio"], "tools": ["add"],
                      "connect_timeout_s": 60}]}
    assert dry_run(tmp_path, entry) == 0
    assert "environment calculator: tools calculator, add (hermes format)" in capsys.readouterr().out
    broken = {**entry, "mcp": [{"command": [sys.executable, "-c", "raise SystemExit(2)"], "connect_timeout_s": 5}]}
    assert dry_run(tmp_path, broken) == 2
    assert "environment.environments[calculator]: ValueError: the MCP server" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
