"""deploy/front/buffer.cfg is what `zerobubble front` writes for deploy/hosts/buffer.yaml, and HAProxy accepts it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from zerobubble.tooling.front import FrontConfig, render

ROOT = Path(__file__).resolve().parents[2]
FRONT = ROOT / "deploy" / "front" / "buffer.cfg"


def test_the_buffer_front_is_the_command_s_output_for_the_buffer_host():
    public = yaml.safe_load((ROOT / "deploy" / "hosts" / "buffer.yaml").read_text())["server"]["listen"]
    written = subprocess.run([sys.executable, "-m", "zerobubble", "front", "--listen", public,
                              "--backend", "127.0.0.1:50063"], check=True, capture_output=True, text=True).stdout
    assert FRONT.read_text() == written == render(FrontConfig(listen=public, backend="127.0.0.1:50063"))
    assert f"bind {public}\n" in written and "sc0_conn_cur gt 100 }" in written


def test_a_bad_limit_is_refused_naming_the_field():
    refused = subprocess.run([sys.executable, "-m", "zerobubble", "front", "--listen", "127.0.0.1:1", "--backend",
                              "127.0.0.1:2", "--per-peer-connections", "0"], capture_output=True, text=True)
    assert refused.returncode != 0 and "per_peer_connections" in refused.stderr, refused.stderr
    refused = subprocess.run([sys.executable, "-m", "zerobubble", "front", "--listen", "50053", "--backend",
                              "127.0.0.1:2"], capture_output=True, text=True)
    assert refused.returncode != 0 and "listen" in refused.stderr and "HOST:PORT" in refused.stderr, refused.stderr


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is not installed (make front-tool installs it)")
def test_haproxy_accepts_the_front():
    checked = subprocess.run(["haproxy", "-c", "-f", str(FRONT)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
