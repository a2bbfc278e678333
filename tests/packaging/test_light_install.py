"""`pip install zerobubble` without extras, on the lowest grpcio and protobuf the package admits: no torch, yet the
CLI, `zerobubble score` and the reward service over gRPC and HTTP all work."""

from __future__ import annotations

import json
import socket
import subprocess
import urllib.request

import pytest
from venvs import LOWEST, build_wheel, clean_env, installed_version, make_venv, serve_reward


@pytest.fixture(scope="module")
def light(tmp_path_factory):
    wheel = build_wheel(tmp_path_factory.mktemp("wheel"))
    return make_venv(tmp_path_factory.mktemp("venv") / "light", str(wheel), LOWEST)


def run(light, *args: str, stdin: str | None = None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(light / "zerobubble"), *args], input=stdin, capture_output=True, text=True,
                          timeout=120, env=clean_env(), cwd=cwd)


def test_the_lowest_versions_are_installed_and_torch_is_not(light):
    lowest = dict(line.split("==") for line in LOWEST.read_text().splitlines() if "==" in line)
    for name in ("grpcio", "protobuf"):
        assert installed_version(light, name) == lowest[name]
    for heavy in ("torch", "transformers", "pyarrow"):
        probe = subprocess.run([str(light / "python"), "-c", f"import {heavy}"], capture_output=True, text=True,
                               timeout=60)
        assert f"No module named '{heavy}'" in probe.stderr


def test_help_lists_every_command(light, tmp_path):
    reply = run(light, "--help", cwd=tmp_path)
    assert reply.returncode == 0, reply.stderr
    for command in ("serve", "score", "up", "bench"):
        assert command in reply.stdout


def test_score_starts_its_own_reward_service(light, tmp_path):
    right = run(light, "score", "--gt", "4", "--json", stdin="so \\boxed{4}", cwd=tmp_path)
    wrong = run(light, "score", "--gt", "4", "--json", stdin="so \\boxed{5}", cwd=tmp_path)
    assert right.returncode == 0, right.stderr
    assert json.loads(right.stdout)["reward"] == 1.0
    assert json.loads(wrong.stdout)["reward"] == 0.0


def test_training_commands_name_the_extra(light, tmp_path):
    reply = run(light, "up", cwd=tmp_path)
    assert reply.returncode == 2
    assert "pip install 'zerobubble[train]'" in reply.stderr
    assert "Traceback" not in reply.stderr


def test_serve_reward_scores_over_grpc_and_http(light, tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        http_port = probe.getsockname()[1]
    with serve_reward(light, http_port, cwd=tmp_path) as address:
        # The gRPC client of the same environment: client and server both on the lowest grpcio and protobuf.
        over_grpc = run(light, "score", "--server", address, "--gt", "12", "--json", "--timeout", "60",
                        stdin="\\boxed{12}", cwd=tmp_path)
        assert over_grpc.returncode == 0, over_grpc.stderr
        assert json.loads(over_grpc.stdout)["reward"] == 1.0
        body = json.dumps({"verifier": "boxed", "response": "\\boxed{7}", "gt_answer": "8"}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{http_port}/v1/score", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as reply:
            scored = json.loads(reply.read())
        assert (scored["reward"], scored["format_ok"], scored["extracted_answer"]) == (0.0, True, "7")
