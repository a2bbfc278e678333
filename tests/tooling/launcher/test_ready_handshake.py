"""The launcher learns a service's address from the service's own announcement, not from stdout, where libraries
print what they like before the service is ready."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from zerobubble.tooling.launcher.config import write_yaml
from zerobubble.tooling.launcher.processes import ServiceFailed, ServiceProcess
from zerobubble.tooling.launcher.ready import read_announcement

# What a library might print first: its own log lines, and even a line that looks like an address line.
NOISY_LIBRARY = '''
print("INFO 11-23 15:00:00 [__init__.py:216] Automatically detected platform cpu.", flush=True)
print('{"service": "reward", "address": "127.0.0.1:1", "metrics_port": null}', flush=True)
'''


def reward_config(run_dir: Path, **server) -> Path:
    return write_yaml(run_dir / "configs" / "reward.yaml", {
        "server": {"listen": "127.0.0.1:0", "metrics_port": None, **server}, "math": {"workers": 1}})


@pytest.fixture
def noisy_stdout(tmp_path, monkeypatch) -> Path:
    """Every Python process started from here prints NOISY_LIBRARY on stdout as it starts (a sitecustomize)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NOISY_LIBRARY)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    return site


def test_a_service_whose_libraries_print_first_still_starts_at_its_own_address(tmp_path, noisy_stdout):
    service = ServiceProcess("reward", "reward", reward_config(tmp_path), tmp_path / "logs")
    try:
        service.start(120)
        assert service.address != "127.0.0.1:1"
        with grpc.insecure_channel(service.address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        log = service.log_path.read_text()
        assert "Automatically detected platform cpu" in log, "the library's lines belong in the service's log"
        # `serve` still prints its address line on stdout for users; it lands in the log after the noise.
        assert json.dumps({"service": "reward", "address": service.address, "metrics_port": None}) in log
        assert read_announcement(service.ready_path)["address"] == service.address
    finally:
        service.stop()


def test_serve_prints_its_address_line_on_stdout_when_run_by_hand(tmp_path):
    command = [sys.executable, "-m", "zerobubble", "serve", "reward", "--config", str(reward_config(tmp_path))]
    env = {key: value for key, value in os.environ.items() if key != "ZEROBUBBLE_READY_FILE"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    try:
        line = json.loads(process.stdout.readline())
        assert line["service"] == "reward" and line["address"].startswith("127.0.0.1:")
    finally:
        process.terminate()
        process.wait(60)


def test_a_service_that_exits_before_serving_fails_its_start_naming_its_log(tmp_path):
    config = write_yaml(tmp_path / "configs" / "reward.yaml", {"server": {"listen": "nowhere"}})
    service = ServiceProcess("reward", "reward", config, tmp_path / "logs")
    with pytest.raises(ServiceFailed, match=r"reward exited with code 2 before serving; its log \(.*reward\.log\) "
                       r"says:\n[\s\S]*server\.listen: expected HOST:PORT"):
        service.start(120)
    assert "server.listen" in service.log_path.read_text()


def test_an_announcement_is_an_object_with_an_address(tmp_path):
    path = tmp_path / "reward.ready.json"
    assert read_announcement(path) is None
    path.write_text("INFO not an address\n")
    with pytest.raises(ValueError):
        read_announcement(path)
    path.write_text('{"service": "reward"}\n')
    with pytest.raises(ValueError, match="address"):
        read_announcement(path)
