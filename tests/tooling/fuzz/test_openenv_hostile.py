"""The OpenEnv server in front of the environment service (zerobubble.environment.openenv_server) under the fuzz:
the hostile JSON bodies of the reward service's HTTP fuzz to /reset and /step, garbage WebSocket messages, trickled
heads and bodies, oversized bodies and requests from another Host or Origin, each answered below 500 (or with an
error message) at once, while the server goes on playing episodes."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from zerobubble.common.config import load_config
from zerobubble.environment.app import build
from zerobubble.environment.config import EnvironmentServiceConfig
from zerobubble.tooling.fuzz.http_abuse import hostile_bodies, trickle
from zerobubble.tooling.fuzz.wire import post_status
from zerobubble.tooling.ports import free_port

ANSWER_WITHIN_S = 10.0
DEADLINE_S = 2.0
MAX_BODY = 1 << 20
# As tests/tooling/fuzz/conftest.py reads it (not imported from there: another folder's conftest may hold that name).
SEED = int(os.environ.get("ZEROBUBBLE_FUZZ_SEED", "0"))
WS_GARBAGE = ["not json", "[]", "null", '{"type": "reset", "data": [1]}', '{"type": "step", "data": {}}',
              '{"type": "step", "data": {"message": 5}}', '{"type": "nonsense"}', '{"type": "reset", "data": '
              '{"environment": "nowhere"}}', "[" * 10_000 + "]" * 10_000, '{"type": "reset", "data": {"row": "x"}}']


@pytest.fixture(scope="module")
def openenv_port():
    config = load_config(EnvironmentServiceConfig, overrides={
        "server.listen": "127.0.0.1:0", "environments": [{"name": "calculator", "builtin": "calculator"}]})
    host = build(config).start()
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "zerobubble.environment.openenv_server", "--set",
                                f"listen=127.0.0.1:{port}", "--set", f"environment.address={host.address}",
                                "--set", f"request_deadline_s={DEADLINE_S}", "--set", f"max_body_bytes={MAX_BODY}"])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.2)
    yield port
    process.kill()
    process.wait()
    host.stop(grace=1.0)


def _post(port: int, path: str, body: bytes) -> int | None:
    return post_status(f"127.0.0.1:{port}", path, body, timeout=ANSWER_WITHIN_S)


def _plays(port: int) -> bool:
    from websockets.sync.client import connect

    with connect(f"ws://127.0.0.1:{port}/ws", open_timeout=ANSWER_WITHIN_S) as ws:
        ws.send(json.dumps({"type": "reset", "data": {}}))
        opened = json.loads(ws.recv(timeout=ANSWER_WITHIN_S))
        ws.send(json.dumps({"type": "step", "data": {"message": "@calculator(1)"}}))
        stepped = json.loads(ws.recv(timeout=ANSWER_WITHIN_S))
    return opened["type"] == "observation" and stepped["data"]["done"] is True


def test_hostile_json_to_reset_and_step_is_answered_below_500(openenv_port):
    findings = []
    for name, body in hostile_bodies(random.Random(SEED)).items():
        for path in ("/reset", "/step"):
            started = time.monotonic()
            status = _post(openenv_port, path, body)
            if status is None or status >= 500 or time.monotonic() - started > ANSWER_WITHIN_S:
                findings.append(f"{path} {name}: {status} after {time.monotonic() - started:.1f} s")
    assert not findings, "\n".join(findings)
    health = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{openenv_port}/health", timeout=10).read())
    assert health["status"] == "healthy" and _plays(openenv_port)


def test_garbage_websocket_messages_get_errors_and_the_session_goes_on(openenv_port):
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    answers = {}
    for message in WS_GARBAGE:
        with connect(f"ws://127.0.0.1:{openenv_port}/ws", open_timeout=ANSWER_WITHIN_S) as ws:
            ws.send(message)
            try:
                answers[message[:40]] = json.loads(ws.recv(timeout=ANSWER_WITHIN_S))["type"]
            except ConnectionClosed:
                answers[message[:40]] = "closed"
    assert set(answers.values()) <= {"error", "closed"}, answers
    assert _plays(openenv_port)


@pytest.mark.parametrize("part", ["head", "body"])
@pytest.mark.parametrize("path", ["/reset", "/step"])
def test_a_trickling_sender_is_cut_at_the_requests_deadline(openenv_port, part, path):
    waited, answer = trickle("127.0.0.1", openenv_port, path, part, every_s=0.5, give_up_s=6 * DEADLINE_S)
    assert waited < 3 * DEADLINE_S and answer.startswith(b"HTTP/1.1 408"), (waited, answer[:200])
    assert _plays(openenv_port)


def _status_of_declared(port: int, path: str, declared: int) -> bytes:
    """The status line answered to a head declaring a `declared`-byte body, of which 64 KiB are sent."""
    with socket.create_connection(("127.0.0.1", port), timeout=ANSWER_WITHIN_S) as conn:
        conn.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {declared}\r\n\r\n".encode() + b'{"row": {"x": "' + b"a" * 65536)
        return conn.makefile("rb").readline()


def test_a_body_over_the_limit_is_refused_with_413(openenv_port):
    for path in ("/reset", "/step"):
        assert _post(openenv_port, path, b'{"row": {"x": "' + b"a" * MAX_BODY + b'"}}') == 413, path
        for declared in (MAX_BODY + 1, 100 * MAX_BODY):
            status = _status_of_declared(openenv_port, path, declared)
            assert status.startswith(b"HTTP/1.1 413"), (path, declared, status)
    assert _plays(openenv_port)


@pytest.mark.parametrize("headers", [{"Host": "rebind.evil.example"}, {"Origin": "http://evil.example"},
                                     {"Origin": "null"}])
def test_a_request_or_websocket_from_elsewhere_is_refused(openenv_port, headers):
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    request = urllib.request.Request(f"http://127.0.0.1:{openenv_port}/reset", data=b"{}",
                                     headers={"Content-Type": "application/json", **headers})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=ANSWER_WITHIN_S)
    assert refused.value.code == 403
    sock = socket.create_connection(("127.0.0.1", openenv_port), timeout=ANSWER_WITHIN_S)
    host = headers.get("Host", f"127.0.0.1:{openenv_port}")
    with pytest.raises(InvalidStatus) as refused:
        connect(f"ws://{host}/ws", sock=sock, origin=headers.get("Origin"), open_timeout=ANSWER_WITHIN_S)
    assert refused.value.response.status_code == 403
    assert _plays(openenv_port)
