"""The code sandbox's host leaks, tried through the running reward service: each program scores 0."""

from __future__ import annotations

import os
import shutil
import uuid

import grpc
import pytest
from reward_helpers import start_reward
from sandbox_leaks import (
    ESCAPED,
    connect_program,
    host_only_mounts,
    host_secret_file,
    host_sockets,
    memory_program,
    mounts_program,
    read_file_program,
    sysv_keys,
    sysv_keys_on_host,
    sysv_leave_program,
    sysv_read_program,
)

from zerobubble.common.clients.reward import RewardClient
from zerobubble.common.config import ClientConfig

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None,
                                reason="the code sandbox needs root and bubblewrap")


def score(reward, program: str, expected: str):
    """Scores `program` on one test case whose expected output is `expected`."""
    return reward.score("code", f"```python\n{program}\n```", test_cases={"inputs": [""], "outputs": [expected]},
                        timeout=60)


def test_world_readable_host_file(reward):
    with host_secret_file() as (path, secret):
        result = score(reward, read_file_program(path), secret)
    assert (result.reward, result.reason) == (0.0, "wrong_answer")


def test_host_unix_sockets(reward):
    with host_sockets() as (path, abstract, listeners):
        result = score(reward, connect_program(path, abstract), ESCAPED)
        for listener in listeners:
            with pytest.raises(BlockingIOError):
                listener.accept()
    assert (result.reward, result.reason) == (0.0, "wrong_answer")


def test_system_v_ipc_left_by_one_run(reward):
    message = f"zb-message-{uuid.uuid4().hex}"
    with sysv_keys() as (shm_key, msg_key):
        left = score(reward, sysv_leave_program(shm_key, msg_key, 64 * 1024 * 1024, message), "")
        assert left.format_ok and left.reason == "wrong_answer", left  # it ran, and printed what it made
        assert shm_key not in sysv_keys_on_host("-M")
        assert msg_key not in sysv_keys_on_host("-Q")
        later = score(reward, sysv_read_program(msg_key), message)
    assert (later.reward, later.reason) == (0.0, "wrong_answer")


def test_host_mounts(reward):
    result = score(reward, mounts_program(host_only_mounts()), ESCAPED)
    assert (result.reward, result.reason) == (0.0, "wrong_answer")


def test_memory_of_several_processes():
    # A small bound and a long wall limit: on a loaded machine, filling memory must not run into the time limit.
    bound = 128 * 1024 * 1024
    app = start_reward(**{"sandbox.memory_bytes": bound, "sandbox.wall_seconds": 30.0, "sandbox.cpu_seconds": 30})
    try:
        with RewardClient(ClientConfig(address=app.address, timeout_seconds=120)) as reward:
            result = score(reward, memory_program(4, bound * 6 // 10), ESCAPED)
            assert (result.reward, result.reason) == (0.0, "memory_limit")
            assert reward.score("code", "```python\nprint(int(input()) + 1)\n```",
                                test_cases={"inputs": ["1\n"], "outputs": ["2\n"]}).answer_ok
    finally:
        app.stop(grace=1.0)


def test_without_bubblewrap_code_is_listed_unavailable_and_refused():
    app = start_reward(**{"sandbox.bwrap": "/nonexistent/bwrap", "sandbox.slots": 1, "math.workers": 1})
    try:
        with RewardClient(app.address) as client:
            code = {v.name: v for v in client.list_verifiers().verifiers}["code"]
            assert not code.available and "bubblewrap" in code.unavailable_reason
            with pytest.raises(grpc.RpcError) as refused:
                client.score("code", "```python\nprint(1)\n```", test_cases={"inputs": [""], "outputs": ["1"]})
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "bubblewrap" in refused.value.details()
            assert client.score("boxed", "\\boxed{7}", "7").answer_ok
    finally:
        app.stop(grace=0)
