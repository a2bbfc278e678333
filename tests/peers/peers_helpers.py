"""Real peers for the tests: an MCP server made with the mcp SDK (peers_mcp_server.py) over stdio or streamable HTTP,
each in a process of its own."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from zerobubble.tooling.ports import free_port

HERE = Path(__file__).resolve().parent
MCP_SERVER = HERE / "peers_mcp_server.py"


def wait_for_port(port: int, process: subprocess.Popen, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listens on port {port} after {within} s")


def start_http_mcp_server() -> tuple[subprocess.Popen, str]:
    port = free_port()
    process = subprocess.Popen([sys.executable, str(MCP_SERVER), "http", str(port)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    wait_for_port(port, process)
    return process, f"http://127.0.0.1:{port}/mcp"


def stdio_mcp_command() -> list[str]:
    return [sys.executable, str(MCP_SERVER), "stdio"]


def start_openenv_server(environment_address: str, default_environment: str = "calculator") -> tuple[
        subprocess.Popen, str]:
    """Our environment service served the OpenEnv way, in a process of its own."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "zerobubble.environment.openenv_server",
                                "--set", f"listen=127.0.0.1:{port}",
                                "--set", f"environment.address={environment_address}",
                                "--set", f"default_environment={default_environment}"])
    wait_for_port(port, process)
    return process, f"http://127.0.0.1:{port}"


def start_openenv_environment() -> tuple[subprocess.Popen, str]:
    """An environment written with openenv-core's own server classes (peers_openenv_env.py), on a port."""
    port = free_port()
    process = subprocess.Popen([sys.executable, str(HERE / "peers_openenv_env.py"), str(port)])
    wait_for_port(port, process)
    return process, f"http://127.0.0.1:{port}"
