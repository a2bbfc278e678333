"""Our environments served the OpenEnv way: a real environment service, the OpenEnv server in a process of its own
in front of it, and openenv-core's own client (EnvClient over the WebSocket session) and plain HTTP on the other
side. Both hold the environment service's token: the server is a door to it and is locked as one."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from peers_helpers import wait_for_port

from zerobubble.common.config import load_config
from zerobubble.environment.app import build
from zerobubble.environment.config import EnvironmentServiceConfig
from zerobubble.tooling.ports import free_port

ROW = {"messages": [{"role": "user", "content": "What is 6 * 7?"}], "ground_truth": "42"}
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "6 * 7"}}</tool_call>'
TOKEN = "openenv-door-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DEADLINE_S = 2.0
SESSION_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(base URL, the server's stderr file) of an OpenEnv server in front of a token-holding environment service,
    with short deadlines, two sessions at most and one page origin allowed."""
    os.environ["OPENENV_DOOR_TOKEN"] = TOKEN
    config = load_config(EnvironmentServiceConfig, overrides={
        "server.listen": "127.0.0.1:0", "server.auth_token_env": "OPENENV_DOOR_TOKEN",
        "environments": [{"name": "calculator", "builtin": "calculator", "final_answer": "last_number"},
                         {"name": "compact", "builtin": "calculator", "tool_format": "compact",
                          "final_answer": "exact"}]})
    host = build(config).start()
    port = free_port()
    stderr = tmp_path_factory.mktemp("openenv") / "stderr.log"
    with open(stderr, "wb") as sink:
        process = subprocess.Popen([sys.executable, "-m", "zerobubble.environment.openenv_server",
                                    "--set", f"listen=127.0.0.1:{port}", "--set", f"environment.address={host.address}",
                                    "--set", "environment.auth_token_env=OPENENV_DOOR_TOKEN",
                                    "--set", f"request_deadline_s={DEADLINE_S}", "--set", "max_sessions=2",
                                    "--set", f"session_timeout_s={SESSION_TIMEOUT_S}",
                                    "--set", "max_body_bytes=1048576",
                                    "--set", 'allowed_origins=["http://notebook.example:8888"]'], stderr=sink)
    wait_for_port(port, process, within=120)
    yield f"http://127.0.0.1:{port}", stderr
    process.kill()
    process.wait()
    host.stop(grace=1.0)


@pytest.fixture(scope="module")
def openenv_url(served):
    return served[0]


def http(url: str, body: dict | None = None, headers: dict | None = None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json",
                                                              **(AUTH if headers is None else headers)})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_openenv_core_client_plays_an_episode_over_the_websocket_session(openenv_url):
    from openenv.core.generic_client import GenericEnvClient

    # openenv-core's client sends no headers of its own: the token goes as the URL's password (Basic credentials).
    with GenericEnvClient(base_url=openenv_url.replace("://", f"://zb:{TOKEN}@")).sync() as env:
        opened = env.reset(row=ROW)
        assert opened.done is False
        assert opened.observation["tools"][0]["function"]["name"] == "calculator"
        assert opened.observation["tool_format"] == "hermes"
        step = env.step({"message": f"Let me compute. {CALL}"})
        assert step.observation["messages"] == [{"role": "tool", "name": "calculator", "content": "42"}]
        assert (step.reward, step.done) == (0.0, False)
        assert env.state()["step_count"] == 1
        final = env.step({"message": "It is 42."})
        assert (final.reward, final.done, final.observation["ended_reason"]) == (1.0, True, "")
        # Another environment of the service, named at reset, in the same session.
        env.reset(environment="compact", row=ROW)
        step = env.step({"message": "@calculator(6*7)"})
        assert step.observation["messages"][0]["content"] == "42"


def test_the_http_endpoints_answer_in_openenvs_shapes(openenv_url):
    status, health = http(f"{openenv_url}/health")
    assert status == 200 and health["status"] == "healthy"
    status, schema = http(f"{openenv_url}/schema")
    assert status == 200 and "message" in schema["action"]["properties"]
    assert "ended_reason" in schema["observation"]["properties"]
    status, reset = http(f"{openenv_url}/reset", {"row": ROW})
    assert status == 200 and reset["done"] is False
    assert reset["observation"]["tools"][0]["function"]["name"] == "calculator"
    # Plain HTTP holds no episode across requests (OpenEnv makes an environment per request): it says so.
    status, step = http(f"{openenv_url}/step", {"action": {"message": CALL}})
    assert status == 200 and step["done"] is True and step["observation"]["ended_reason"] == "no_episode"
    status, bad = http(f"{openenv_url}/step", {"action": {"text": CALL}})
    assert status == 422 and "message" in json.dumps(bad)


def test_an_unknown_environment_is_refused_naming_it(openenv_url):
    from openenv.core.generic_client import GenericEnvClient

    client = GenericEnvClient(base_url=openenv_url.replace("://", f"://zb:{TOKEN}@"))
    with client.sync() as env, pytest.raises(Exception) as refused:
        env.reset(environment="nowhere")
    assert "nowhere" in str(refused.value)
    status, body = http(f"{openenv_url}/reset", {"environment": "nowhere"})
    assert status == 404 and "nowhere" in body["detail"]
    status, body = http(f"{openenv_url}/reset", {"row": [1, 2]})
    assert status == 422 and body["detail"].startswith("row:")


def _ws(url: str, headers: dict | None = None, origin: str | None = None, host: str | None = None):
    """A WebSocket session on the server at `url`, asked for as `host` (the name in the URL, the Host header)."""
    from websockets.sync.client import connect

    address = url.removeprefix("http://")
    return connect(f"ws://{host or address}/ws", open_timeout=10, sock=_raw(url),
                   additional_headers=AUTH if headers is None else headers, origin=origin)


def test_reset_step_and_ws_need_the_services_token(openenv_url):
    from websockets.exceptions import InvalidStatus

    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        for path, body in (("/reset", {"row": ROW}), ("/step", {"action": {"message": CALL}})):
            status, refused = http(f"{openenv_url}{path}", body, headers=headers)
            assert (status, refused["field"]) == (401, "Authorization"), (path, headers)
        with pytest.raises(InvalidStatus) as refused:
            _ws(openenv_url, headers=headers)
        assert refused.value.response.status_code == 403
    status, _ = http(f"{openenv_url}/reset", {"row": ROW})
    assert status == 200


def test_a_page_from_another_origin_cannot_open_the_websocket_nor_post(openenv_url):
    """What a browser on this machine sends for `new WebSocket("ws://127.0.0.1:PORT/ws")` from a page elsewhere: its
    Origin (the token it could hold or not: refused either way)."""
    from websockets.exceptions import InvalidStatus

    with pytest.raises(InvalidStatus) as refused:
        _ws(openenv_url, origin="http://evil.example")
    assert refused.value.response.status_code == 403
    status, body = http(f"{openenv_url}/reset", {"row": ROW}, headers={**AUTH, "Origin": "http://evil.example"})
    assert (status, body["field"]) == (403, "Origin")
    # The origin the server was told to allow, and its own, are let in.
    with _ws(openenv_url, origin="http://notebook.example:8888") as ws:
        ws.send(json.dumps({"type": "reset", "data": {"row": ROW}}))
        assert json.loads(ws.recv(timeout=30))["type"] == "observation"
    status, _ = http(f"{openenv_url}/reset", {"row": ROW}, headers={**AUTH, "Origin": openenv_url})
    assert status == 200


def test_a_dns_rebinding_host_is_refused(openenv_url):
    from websockets.exceptions import InvalidStatus

    port = openenv_url.rsplit(":", 1)[1]
    for host in (f"rebind.evil.example:{port}", "evil.example"):
        status, body = http(f"{openenv_url}/reset", {"row": ROW}, headers={**AUTH, "Host": host})
        assert (status, body["field"]) == (403, "Host")
        with pytest.raises(InvalidStatus) as refused:
            _ws(openenv_url, host=host)
        assert refused.value.response.status_code == 403
    status, _ = http(f"{openenv_url}/health", headers={**AUTH, "Host": f"localhost:{port}"})
    assert status == 200


def _raw(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    """What the server answered before it closed (a reset after an answer to a body it did not read included)."""
    answer = b""
    try:
        while chunk := sock.recv(65536):
            answer += chunk
    except ConnectionResetError:
        pass
    return answer


def test_a_trickled_head_or_body_is_cut_at_the_request_deadline(openenv_url):
    for opening, drip in ((b"POST /reset HTTP/1.1\r\nHost: 127.0.0.1\r\n", b"X-Drip: 1\r\n"),
                          (b"POST /reset HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + TOKEN.encode() +
                           b"\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{", b" ")):
        sock = _raw(openenv_url)
        started = time.monotonic()
        sock.sendall(opening)
        try:
            while time.monotonic() - started < 4 * DEADLINE_S:
                time.sleep(0.3)
                sock.sendall(drip)
        except OSError:
            pass  # cut
        waited = time.monotonic() - started
        answer = _read_all(sock)
        sock.close()
        assert waited < 4 * DEADLINE_S, f"still open after {waited:.1f} s"
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]


def test_a_100_mb_reset_is_refused_with_413_unread(openenv_url):
    sock = _raw(openenv_url)
    sock.sendall(b"POST /reset HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + TOKEN.encode() +
                 b"\r\nContent-Type: application/json\r\nContent-Length: 100000000\r\n\r\n" + b'{"row": {"x": "' +
                 b"a" * 65536)
    answer = _read_all(sock)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 413") and b"max_body_bytes" in answer, answer[:300]
    # Without a length (chunked), the body is counted as it comes.
    sock = _raw(openenv_url)
    sock.sendall(b"POST /reset HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + TOKEN.encode() +
                 b"\r\nTransfer-Encoding: chunked\r\n\r\n")
    try:
        for _ in range(40):
            sock.sendall(b"10000\r\n" + b"a" * 0x10000 + b"\r\n")
    except OSError:
        pass
    answer = _read_all(sock)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 413"), answer[:300]


def _opens(url: str) -> str:
    """The answer's type to a reset in a new session ("closed" when the server ends it at once, as when full)."""
    from websockets.exceptions import ConnectionClosed

    with _ws(url) as ws:
        try:
            ws.send(json.dumps({"type": "reset", "data": {"row": ROW}}))
            return json.loads(ws.recv(timeout=30))["type"]
        except ConnectionClosed:
            return "closed"


def test_idle_websocket_sessions_are_ended_and_their_slots_freed(openenv_url):
    with contextlib.ExitStack() as stack:
        for _ in range(2):  # max_sessions, then idle
            ws = stack.enter_context(_ws(openenv_url))
            ws.send(json.dumps({"type": "reset", "data": {"row": ROW}}))
            assert json.loads(ws.recv(timeout=30))["type"] == "observation"
        assert _opens(openenv_url) != "observation"
        # openenv-core's reaper looks every max(timeout / 4, 5) s.
        deadline = time.monotonic() + SESSION_TIMEOUT_S + 15
        while (opened := _opens(openenv_url)) != "observation" and time.monotonic() < deadline:
            time.sleep(1)
        assert opened == "observation"


def test_clients_that_hang_up_log_no_tracebacks(served):
    url, stderr = served
    deadline = time.monotonic() + 20  # the sessions of the tests before are ended
    while _opens(url) != "observation" and time.monotonic() < deadline:
        time.sleep(0.5)
    before = stderr.read_bytes()
    for _ in range(2):
        ws = _ws(url).__enter__()  # hangs up in the middle of its step
        ws.send(json.dumps({"type": "reset", "data": {"row": ROW}}))
        ws.send(json.dumps({"type": "step", "data": {"message": CALL}}))
        ws.socket.shutdown(socket.SHUT_RDWR)
        ws.socket.close()
        sock = _raw(url)  # hangs up in the middle of its body
        sock.sendall(b"POST /reset HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + TOKEN.encode() +
                     b"\r\nContent-Length: 100\r\n\r\n{")
        sock.close()
        sock = _raw(url)  # hangs up before its answer
        body = json.dumps({"row": ROW}).encode()
        sock.sendall(b"POST /reset HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + TOKEN.encode() +
                     b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        sock.close()
    time.sleep(2)
    assert http(f"{url}/health")[0] == 200
    logged = stderr.read_bytes()[len(before):].decode(errors="replace")
    assert "Traceback" not in logged and "Exception in ASGI" not in logged, logged[-3000:]
