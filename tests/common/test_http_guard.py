"""The HTTP doors' shared checks (common/http_guard.py): which Hosts, Origins and credentials a server takes, and
the whole-request deadline of a handler on `http.server`, over a real socket."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from http.server import ThreadingHTTPServer

import pytest

from zerobubble.common.http_guard import GuardedRequestHandler, RequestGuard

TOKEN = "guard-token"


def _headers(**given: str):
    return {name.lower(): value for name, value in given.items()}.get


@pytest.mark.parametrize(("listen", "host", "allowed"), [
    ("127.0.0.1", "127.0.0.1:8000", True), ("127.0.0.1", "localhost:8000", True), ("127.0.0.1", "[::1]:80", True),
    ("127.0.0.1", "LOCALHOST.", True), ("127.0.0.1", "evil.example:8000", False),
    ("127.0.0.1", "127.0.0.1.evil.example", False), ("127.0.0.1", "10.0.0.5:8000", False),
    ("10.0.0.5", "10.0.0.5:8000", True), ("0.0.0.0", "10.0.0.5:8000", True), ("0.0.0.0", "[fe80::1]:1", True),
    ("0.0.0.0", "rebind.evil.example", False), ("my-box", "my-box:80", True),
])
def test_the_host_must_be_one_of_the_servers_names(listen, host, allowed):
    assert (RequestGuard(listen).check(_headers(Host=host)) is None) is allowed


def test_a_foreign_origin_is_refused_but_the_servers_own_and_the_allowed_are_taken():
    guard = RequestGuard("127.0.0.1", allowed_origins=["http://notebook.example:8888/"])
    assert guard.check(_headers(Host="127.0.0.1:8000", Origin="http://evil.example")).field == "Origin"
    assert guard.check(_headers(Host="127.0.0.1:8000", Origin="null")).field == "Origin"
    assert guard.check(_headers(Host="127.0.0.1:8000", Origin="http://127.0.0.1:8000")) is None
    assert guard.check(_headers(Host="127.0.0.1:8000", Origin="http://notebook.example:8888")) is None
    assert guard.check(_headers(Host="127.0.0.1:8000")) is None  # not a browser


def test_the_token_comes_as_bearer_or_as_a_basic_password():
    guard = RequestGuard("127.0.0.1", TOKEN)
    basic = base64.b64encode(f"anyone:{TOKEN}".encode()).decode()
    assert guard.check(_headers(Authorization=f"Bearer {TOKEN}")) is None
    assert guard.check(_headers(Authorization=f"Basic {basic}")) is None
    for wrong in ("", TOKEN, f"Bearer {TOKEN}x", "Basic !!!", "Basic " + base64.b64encode(TOKEN.encode()).decode()):
        refusal = guard.check(_headers(Authorization=wrong))
        assert refusal is not None and (refusal.status, refusal.field) == (401, "Authorization"), wrong


class _Echo(GuardedRequestHandler):
    request_deadline_s = 1.0
    max_body_bytes = 1000
    guard = RequestGuard("127.0.0.1")

    def do_POST(self) -> None:  # noqa: N802 - the base class's name
        data = json.dumps({"length": len(self.body)}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def port():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _exchange(port: int, parts: list[bytes], every_s: float = 0.0) -> tuple[bytes, float]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        started = time.monotonic()
        try:
            for part in parts:
                conn.sendall(part)
                time.sleep(every_s)
        except OSError:
            pass
        answer = b""
        try:
            while chunk := conn.recv(4096):
                answer += chunk
        except OSError:
            pass
        return answer, time.monotonic() - started


def test_a_request_is_read_whole_within_the_deadline_however_it_trickles(port):
    head = b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\nConnection: close\r\n\r\n"
    answer, _ = _exchange(port, [head + b"{}"])
    assert answer.startswith(b"HTTP/1.0 200") and answer.endswith(b'{"length": 2}')
    # A header line every 0.2 s, then a body byte every 0.2 s: each read is quick, the whole is not.
    for parts in ([b"POST / HTTP/1.1\r\n"] + [b"X: 1\r\n"] * 30,
                  [b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 30\r\n\r\n"] + [b" "] * 30):
        answer, took = _exchange(port, parts, every_s=0.2)
        assert answer.startswith(b"HTTP/1.0 408") and took < 5, (answer[:100], took)


def test_a_refused_request_is_answered_before_its_body_is_read(port):
    for head, status in ((b"Host: evil.example\r\nContent-Length: 5\r\n", b"403"),
                         (b"Host: 127.0.0.1\r\nContent-Length: 100000000\r\n", b"413"),
                         (b"Host: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n", b"411"),
                         (b"Host: 127.0.0.1\r\nContent-Length: x\r\n", b"400")):
        answer, _ = _exchange(port, [b"POST / HTTP/1.1\r\n" + head + b"\r\n"])
        assert answer.split(b" ")[1] == status, answer[:200]
