"""The HTTP side's connection and body bounds, through a real `zerobubble serve reward` process: silent and slow
connections are closed within their timeouts and cannot take the descriptors that gRPC, health checks and
authenticated calls need (300 of them at a 256-descriptor limit); bodies are refused by size and item count
before they are parsed whole; hostile JSON and a client that leaves mid-upload get a 4xx or one log line, never
a 500 or a traceback."""

from __future__ import annotations

import errno
import json
import os
import socket
import time
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from http_helpers import serve_reward

from zerobubble.common.clients.reward import RewardClient
from zerobubble.common.config import ClientConfig

TOKEN = "limits-token"
HEAD_SECONDS = 2.0
BODY_SECONDS = 2.0
SLOW = 300
PARTIAL_HEAD = b"POST /v1/score HTTP/1.1\r\nHost: x\r\n"


@pytest.fixture(scope="module")
def served():
    with serve_reward(open_files=256, **{
            "server.auth_token": TOKEN, "http.header_timeout_seconds": HEAD_SECONDS,
            "http.body_timeout_seconds": BODY_SECONDS, "http.max_connections": 64,
            "http.max_connections_per_peer": 48, "limits.max_batch_items": 8,
            "server.max_message_bytes": 1024 * 1024}) as served:
        yield served


def _port(served) -> int:
    return int(served.url.rpartition(":")[2])


def _raw(served, data: bytes, wait: float = 30.0) -> bytes:
    """What the server answers to `data` sent on a fresh connection, until it closes or `wait` passes."""
    with socket.create_connection(("127.0.0.1", _port(served)), timeout=wait) as conn:
        conn.sendall(data)
        answer = b""
        try:
            while chunk := conn.recv(65536):
                answer += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return answer


def _post(served, path: str, body: bytes, **headers: str) -> tuple[int, dict]:
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {headers.pop('length', len(body))}\r\n\r\n")
    answer = _raw(served, head.encode() + body)
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2] or b"null")


def _closed(conn: socket.socket) -> bool:
    try:
        return conn.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    except OSError as exc:
        # Not connected yet: its handshake waits in the listen backlog.
        if exc.errno == errno.ENOTCONN:
            return False
        raise


def _descriptors(served) -> int:
    return len(os.listdir(f"/proc/{served.pid}/fd"))


def test_slow_connections_are_closed_while_health_and_authenticated_calls_answer(served):
    before = _descriptors(served)
    slow = []
    for _ in range(SLOW):
        conn = socket.socket()
        conn.setblocking(False)
        conn.connect_ex(("127.0.0.1", _port(served)))
        slow.append(conn)
    time.sleep(0.5)
    for conn in slow:
        try:
            conn.send(PARTIAL_HEAD)
        except OSError:
            pass   # refused over the connection bound, or still in the listen backlog
    try:
        started = time.monotonic()
        with grpc.insecure_channel(served.address) as channel:
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        with RewardClient(ClientConfig(address=served.address, auth_token=TOKEN, timeout_seconds=10)) as client:
            assert client.score("boxed", "\\boxed{2}", "2").answer_ok
        with urllib.request.urlopen(f"{served.url}/healthz", timeout=10) as reply:
            assert reply.status == 200
        assert time.monotonic() - started < 10
        # The service holds none of them past the head timeout (what the kernel still queues is not its own).
        deadline = time.monotonic() + HEAD_SECONDS + 3
        while time.monotonic() < deadline and _descriptors(served) > before + 4:
            time.sleep(0.2)
        assert _descriptors(served) <= before + 4
        assert any(_closed(conn) for conn in slow)
    finally:
        for conn in slow:
            conn.close()
    assert "out of system resource" not in served.log()


def test_a_body_that_does_not_arrive_in_time_is_408(served):
    started = time.monotonic()
    status, error = _post(served, "/v1/score", b'{"verifier": ', length=100)
    assert (status, error["error"]["field"]) == (408, "body")
    assert time.monotonic() - started < BODY_SECONDS + 5


def test_content_length_over_the_limit_is_413_before_the_body_is_sent(served):
    status, error = _post(served, "/v1/score", b"", length=2 * 1024 * 1024)
    assert (status, error["error"]["field"]) == (413, "body")
    assert "Content-Length" in error["error"]["message"]


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/v1/score", {"items": [{"verifier": "boxed", "response": "x", "gt_answer": "1"}] * 9}, "items"),
    ("/get_reward", {"query": ["x"] * 9, "prompts": [""] * 9, "labels": ["1"] * 9}, "query"),
])
def test_item_count_is_checked_before_the_items(served, path, body, field):
    status, error = _post(served, path, json.dumps(body).encode())
    assert (status, error["error"]["field"]) == (413, field)


@pytest.mark.parametrize(("body", "words"), [
    (b"[" * 1000 + b"]" * 1000, "nested too deep"),
    (b'{"verifier": "boxed", "response": "x", "gt_answer": "1", "id": ' + b"7" * 5000 + b"}", "5000 digits"),
    (b'{"verifier": "boxed", "response": "x", "gt_answer": ' + b"[" * 100_000 + b"}", "nested too deep"),
])
def test_hostile_json_is_400_naming_the_body(served, body, words):
    status, error = _post(served, "/v1/score", body)
    assert (status, error["error"]["field"]) == (400, "body"), error
    assert words in error["error"]["message"]


def test_a_client_leaving_mid_upload_is_one_log_line(served):
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", _port(served))) as conn:
            conn.sendall(b"POST /v1/score HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode()
                         + b"\r\nContent-Length: 100000\r\n\r\n{\"items\": [")
            time.sleep(0.05)
    with urllib.request.urlopen(f"{served.url}/healthz", timeout=10) as reply:
        assert reply.status == 200
    time.sleep(0.5)
    assert "Traceback" not in served.log()
    assert served.log().count("the client left") <= 20


def test_grpc_batch_count_is_refused_before_its_items(served):
    items = [{"verifier": "boxed", "response": "x", "gt_answer": "1"}] * 9
    from zerobubble.common.clients.reward import score_request
    with RewardClient(ClientConfig(address=served.address, auth_token=TOKEN, timeout_seconds=10)) as client:
        with pytest.raises(grpc.RpcError) as refused:
            client.score_batch([score_request(**item) for item in items])
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert refused.value.details().startswith("items: 9 items exceed limits.max_batch_items=8")
