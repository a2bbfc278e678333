"""A service started by hand says in one line what is wrong with its surroundings: a peer it needs is not there
yet (a line while it waits, then a clear exit after the client's retry_seconds), or the port it should listen on is
taken (naming server.listen or server.metrics_port). No traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from zerobubble.tooling.ports import free_port

PROXIES = {"http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"}


def serve(*argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in PROXIES}
    return subprocess.run([sys.executable, "-m", "zerobubble", "serve", *argv], capture_output=True, text=True,
                          timeout=120, env=env)


@pytest.fixture
def taken_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_worker_started_before_the_buffer_waits_saying_so_then_exits_naming_the_field(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    # A model folder that passes serve's checks of its own; the worker meets the missing buffer before it loads one.
    (tmp_path / "config.json").write_text("{}")
    out = serve("rollout", "--set", f"buffer.address={address}", "--set", "buffer.retry_seconds=2",
                "--set", f"model.path={tmp_path}")
    assert out.returncode == 2, out.stderr
    assert f"waiting for the buffer at {address} (buffer.address)" in out.stderr
    assert f"buffer.address: no buffer answered at {address} within 2 s (buffer.retry_seconds)" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("flag, field", [("--listen", "server.listen"), ("--metrics-port", "server.metrics_port")])
def test_a_busy_port_is_one_line_naming_the_field(taken_port, flag, field):
    value = f"127.0.0.1:{taken_port}" if flag == "--listen" else str(taken_port)
    out = serve("reward", flag, value, "--set", "math.workers=1")
    assert out.returncode == 2, out.stderr
    assert f"zerobubble: {field}: reward cannot" in out.stderr and str(taken_port) in out.stderr
    assert "Traceback" not in out.stderr
