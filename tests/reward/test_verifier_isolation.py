"""Custom verifiers are contained in a real reward service: what a verifier starts dies with its worker (on a
timeout, a replacement and the service's stop), a worker sees only the environment the configuration passes and
runs under its configured memory and open-file limits, and a worker spoiled by its verifier (leaked files) is
replaced after math.max_consecutive_errors failures in a row."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import textwrap
import threading
import time
from pathlib import Path

import grpc
import pytest
from http_helpers import serve_reward
from reward_helpers import start_reward

from zerobubble.common.clients.reward import RewardClient, score_request
from zerobubble.common.config import ClientConfig, ConfigError, load_config
from zerobubble.reward.config import RewardServiceConfig

VERIFIERS = textwrap.dedent('''
    import json, os, resource, subprocess, time

    def _start_sleep(seconds, metadata):
        child = subprocess.Popen(["sleep", str(seconds)])
        with open(metadata["pid_file"], "w") as out:
            out.write(str(child.pid))

    def starts_and_hangs(response, gt, metadata):
        _start_sleep(611, metadata)
        while True:
            time.sleep(1)

    def starts_and_returns(response, gt, metadata):
        _start_sleep(612, metadata)
        return 1.0

    def environment(response, gt, metadata):
        with open("/proc/self/environ", "rb") as raw:
            initial = raw.read().decode(errors="replace")
        return {"reward": 1.0, "extracted_answer": json.dumps([sorted(os.environ), initial])}

    def limits(response, gt, metadata):
        return {"reward": 1.0, "extracted_answer": json.dumps([resource.getrlimit(resource.RLIMIT_AS),
                                                               resource.getrlimit(resource.RLIMIT_NOFILE)])}

    def allocates(response, gt, metadata):
        return float(len(bytearray(1024 ** 3)))

    LEAKED = []

    def leaks(response, gt, metadata):
        while True:
            LEAKED.append(open(os.devnull))

    def opens(response, gt, metadata):
        with open(os.devnull):
            return 1.0
''')
NAMES = ["starts_and_hangs", "starts_and_returns", "environment", "limits", "allocates", "leaks", "opens"]
MEMORY = 768 * 1024 * 1024
FILES = 48


def _settings(folder, **more):
    return {"custom_verifiers": [{"name": name, "function": f"isolated:{name}", "ground_truth": "none",
                                  "path": str(folder)} for name in NAMES],
            "math.workers": 1, "math.timeout_seconds": 3.0, "math.memory_bytes": MEMORY,
            "math.max_open_files": FILES, "math.max_consecutive_errors": 2, "math.env": ["ZB_PASSED_ON"], **more}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("isolated")
    (path / "isolated.py").write_text(VERIFIERS)
    return path


@pytest.fixture(scope="module")
def service(folder):
    # The service's environment for its whole life: workers replaced later start from it too.
    os.environ["ZB_PASSED_ON"] = "visible"
    os.environ["ZB_SERVICE_SECRET"] = "s3cret-of-the-service"
    app = start_reward(**_settings(folder))
    yield app
    app.stop(grace=0)
    del os.environ["ZB_PASSED_ON"], os.environ["ZB_SERVICE_SECRET"]


@pytest.fixture(scope="module")
def client(service):
    with RewardClient(ClientConfig(address=service.address, timeout_seconds=60)) as client:
        yield client


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _alive(pid)


def test_children_of_a_timed_out_verifier_die_with_its_worker(client, tmp_path):
    pid_file = tmp_path / "pid"
    result = client.score("starts_and_hangs", "x", metadata={"pid_file": str(pid_file)})
    assert result.reason == "timeout"
    assert _gone_within(int(pid_file.read_text()), 10)


def test_children_of_a_verifier_die_when_the_service_stops(folder, tmp_path):
    pid_file = tmp_path / "pid"
    app = start_reward(**_settings(folder))
    try:
        with RewardClient(ClientConfig(address=app.address, timeout_seconds=60)) as client:
            assert client.score("starts_and_returns", "x", metadata={"pid_file": str(pid_file)}).reward == 1.0
        pid = int(pid_file.read_text())
        assert _alive(pid)
    finally:
        app.stop(grace=0)
    assert _gone_within(pid, 10)


def test_worker_environment_holds_only_what_the_config_passes(client):
    names, initial = json.loads(client.score("environment", "x").extracted_answer)
    assert "ZB_PASSED_ON" in names and "PATH" in names
    assert "ZB_SERVICE_SECRET" not in names
    # Not even in the environment the process started with, which /proc shows.
    assert "s3cret-of-the-service" not in initial and "ZB_PASSED_ON=visible" in initial


def test_worker_runs_under_its_memory_and_file_limits(client):
    address_space, open_files = json.loads(client.score("limits", "x").extracted_answer)
    assert address_space == [MEMORY, MEMORY] and open_files == [FILES, FILES]
    assert client.score("allocates", "x").reason == "verifier_error: MemoryError: "


def test_worker_spoiled_by_its_verifier_is_replaced_after_consecutive_errors(client, service):
    assert client.score("opens", "x").reward == 1.0   # no error in a row so far
    replaced = service.pool.replaced
    assert client.score("leaks", "x").reason.startswith("verifier_error: OSError: [Errno 24]")
    # The worker is spoiled: the next item fails too, which makes two in a row...
    assert client.score("opens", "x").reason.startswith("verifier_error: OSError: [Errno 24]")
    # ...so the worker is replaced, and the next item gets a fresh one.
    assert client.score("opens", "x").reward == 1.0
    assert service.pool.replaced == replaced + 1


def test_the_tokens_variable_cannot_be_passed_on():
    with pytest.raises(ConfigError, match=r"math\.env.*ZB_TOKEN"):
        load_config(RewardServiceConfig, overrides={"server.auth_token_env": "ZB_TOKEN", "math.env": ["ZB_TOKEN"]})


def _answer_or_error(client, request) -> None:
    with contextlib.suppress(grpc.RpcError):
        client.unary("Score", request)


def test_workers_and_their_children_die_when_the_service_is_killed(folder, tmp_path):
    """One worker idle after its verifier started a child, one inside a verifier that hangs."""
    idle_pid, busy_pid = tmp_path / "idle", tmp_path / "busy"
    customs = [{"name": name, "ground_truth": "none", "function": f"isolated:{name}", "path": str(folder)}
               for name in ("starts_and_returns", "starts_and_hangs")]
    with serve_reward(**{"custom_verifiers": json.dumps(customs), "math.workers": 2}) as served:
        with RewardClient(ClientConfig(address=served.address, timeout_seconds=60, retry_seconds=0)) as client:
            assert client.score("starts_and_returns", "x", metadata={"pid_file": str(idle_pid)}).reward == 1.0
            hanging = threading.Thread(target=_answer_or_error, daemon=True, args=(
                client, score_request("starts_and_hangs", "x", metadata={"pid_file": str(busy_pid)})))
            hanging.start()
            deadline = time.monotonic() + 30
            while not busy_pid.exists() or not busy_pid.read_text():
                assert time.monotonic() < deadline
                time.sleep(0.1)
            # Its children: the verifier workers, and the code verifier's warm sandbox slots, which must die too.
            workers = subprocess.run(["pgrep", "-P", str(served.pid)], capture_output=True, text=True).stdout.split()
            pools = [pid for pid in workers if b"math_pool" in Path(f"/proc/{pid}/cmdline").read_bytes()]
            sleepers = [int(idle_pid.read_text()), int(busy_pid.read_text())]
            assert len(pools) == 2 and all(map(_alive, sleepers))
            # SIGKILL: none of the service's own cleanup runs.
            os.kill(served.pid, signal.SIGKILL)
            assert all(_gone_within(pid, 10) for pid in sleepers)
            assert all(_gone_within(int(pid), 10) for pid in workers)
            hanging.join(30)
