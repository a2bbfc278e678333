"""The reward service's HTTP side under abuse: connections that send a request head or a body slowly or not at
all, and JSON bodies built to cost the parser (deep nesting, huge numbers, cut or mutated documents). The service
answers 4xx to every bad body, closes every slow connection within its timeouts, and keeps serving meanwhile."""

from __future__ import annotations

import contextlib
import json
import random
import socket
import time

from zerobubble.tooling.fuzz import wire
from zerobubble.tooling.fuzz.abuse import ANSWER_AT_ONCE_S, serving
from zerobubble.tooling.fuzz.campaign import Finding
from zerobubble.tooling.fuzz.targets import HTTP_BODY_TIMEOUT_S, HTTP_HEAD_TIMEOUT_S, Deployment

SLOW_CONNECTIONS = 60
PATHS = ("/v1/score", "/get_reward", "/reward")
VALID = {"/v1/score": {"verifier": "boxed", "response": "\\boxed{1}", "gt_answer": "1"},
         "/get_reward": {"query": ["\\boxed{1}"], "prompts": [""], "labels": ["1"]},
         "/reward": {"prompt": "p", "response": "\\boxed{1}", "label": "1"}}
# How slow connections start: a head cut short, a head and part of a promised body, nothing at all.
SLOW_STARTS = {
    "a partial head": b"POST /v1/score HTTP/1.1\r\nHost: x\r\n",
    "a partial body": b"POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"items\": [",
    "nothing": b"",
}


def post(deployment: Deployment, path: str, body: bytes, timeout: float = 2 * ANSWER_AT_ONCE_S) -> int | None:
    """The HTTP status of `body` POSTed to `path` of the reward service on a fresh connection (None: no answer)."""
    return wire.post_status(deployment.reward_http, path, body, timeout=timeout)


def hostile_bodies(rng: random.Random) -> dict[str, bytes]:
    """JSON documents, by name, that cost a naive parser or a naive handler."""
    valid = json.dumps(VALID["/v1/score"]).encode()
    cut = rng.randint(1, len(valid) - 1)
    mutated = bytearray(valid)
    for _ in range(4):
        mutated[rng.randrange(len(mutated))] = rng.randrange(256)
    return {
        "arrays nested 1,000 deep": b"[" * 1000 + b"]" * 1000,
        "objects nested 100,000 deep, unclosed": b'{"a":' * 100_000,
        "metadata nested 200 deep": json.dumps({**VALID["/v1/score"], "metadata": _nested(200)}).encode(),
        "an integer of 5,000 digits": b'{"id": ' + b"9" * 5000 + b"}",
        "a negative integer of 100,000 digits": b'{"verifier": -' + b"1" * 100_000 + b"}",
        "a float of 100,000 digits": b'{"reward": 1.' + b"5" * 100_000 + b"}",
        "a cut document": valid[:cut],
        "a mutated document": bytes(mutated),
        "not UTF-8": b'{"verifier": "\xff\xfe"}',
        "NaN where a string goes": b'{"verifier": NaN, "response": "x"}',
    }


def hostile_chat_fields() -> list[tuple[str, object]]:
    """Chat-completion fields of the wrong type or range (field, value): each must be a 400 naming the field, never
    a failure inside the engine."""
    return [("stop", 5), ("stop", [1, 2]), ("stop", {"a": 1}), ("stop", ["x"] * 100), ("seed", "x"),
            ("seed", 2 ** 70), ("seed", -1), ("seed", 1.5), ("seed", True), ("temperature", "hot"),
            ("temperature", 1e309), ("top_p", [1]), ("max_tokens", "5"), ("n", 2), ("messages", [{"role": 5}]),
            ("tools", "x")]


# A request trickled a part at a time: its head a header line at a time, or its body a byte at a time.
_TRICKLES = {"head": (b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\n", b"X-Drip: 1\r\n"),
             "body": (b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%sContent-Type: application/json\r\n"
                      b"Content-Length: 100000\r\n\r\n{", b" ")}


def trickle(host: str, port: int, path: str, part: str, *, every_s: float, give_up_s: float,
            headers: bytes = b"") -> tuple[float, bytes]:
    """Sends a request's `part` ("head" or "body") a little every `every_s` until the server closes or `give_up_s`
    passes; how long the server read on, and what it answered. `headers` (whole lines) go with a body's head."""
    opening, drip = _TRICKLES[part]
    opening = opening % ((path.encode(),) if part == "head" else (path.encode(), headers))
    answer = b""
    with socket.create_connection((host, port), timeout=give_up_s) as conn:
        started = time.monotonic()
        try:
            conn.sendall(opening)
            while time.monotonic() - started < give_up_s:
                time.sleep(every_s)
                conn.sendall(drip)
        except OSError:
            pass  # the server closed: it answered (or not) first
        waited = time.monotonic() - started
        with contextlib.suppress(OSError):
            conn.settimeout(give_up_s)
            while chunk := conn.recv(65536):
                answer += chunk
    return waited, answer


def _nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def hostile_json(deployment: Deployment, rng: random.Random) -> list[Finding]:
    """Every hostile body to every HTTP path: each gets an answer below 500, at once (a 4xx, unless a mutation
    happened to leave the document valid)."""
    findings = []
    for name, body in hostile_bodies(rng).items():
        for path in PATHS:
            started = time.monotonic()
            status = post(deployment, path, body)
            if status is None or status >= 500:
                findings.append(Finding(f"HTTP {path}", str(status), "expected an answer below 500", name))
            elif time.monotonic() - started > ANSWER_AT_ONCE_S:
                findings.append(Finding(f"HTTP {path}", "slow", f"{time.monotonic() - started:.1f} s", name))
    return findings + _http_serving(deployment, "hostile JSON bodies") + serving(deployment, "reward",
                                                                               "hostile JSON over HTTP")


def _closed_by_server(conn: socket.socket, within: float) -> bool:
    """Whether the server ends the connection (after an answer such as 408, or none) within `within` seconds."""
    conn.settimeout(within)
    try:
        while conn.recv(4096):
            pass
    except TimeoutError:
        return False
    except OSError:
        pass
    return True


def slow_connections(deployment: Deployment) -> list[Finding]:
    """SLOW_CONNECTIONS connections of each slow start: the service answers meanwhile, and closes each within
    its head or body timeout (plus the time to read a body's rest and a margin for a loaded machine)."""
    findings = []
    with contextlib.ExitStack() as stack:
        held = {name: stack.enter_context(wire.half_open(deployment.reward_http, SLOW_CONNECTIONS, opening=start,
                                                         timeout=ANSWER_AT_ONCE_S))
                for name, start in SLOW_STARTS.items()}
        findings += _http_serving(deployment, f"{len(held) * SLOW_CONNECTIONS} slow HTTP connections")
        findings += serving(deployment, "reward", f"{len(held) * SLOW_CONNECTIONS} slow HTTP connections")
        limit = max(HTTP_HEAD_TIMEOUT_S, HTTP_BODY_TIMEOUT_S) + 2 * ANSWER_AT_ONCE_S
        deadline = time.monotonic() + limit
        for name, sockets in held.items():
            still_open = sum(not _closed_by_server(conn, max(0.1, deadline - time.monotonic())) for conn in sockets)
            if still_open:
                findings.append(Finding("HTTP", "hang", f"{still_open} connections open after {limit:.0f} s",
                                        f"connections that sent {name}"))
    return findings


def _http_serving(deployment: Deployment, after: str) -> list[Finding]:
    started = time.monotonic()
    status = post(deployment, "/v1/score", json.dumps(VALID["/v1/score"]).encode(), timeout=2 * ANSWER_AT_ONCE_S)
    if status != 200:
        return [Finding("HTTP /v1/score", str(status), "a valid request was not answered 200", after)]
    if time.monotonic() - started > 2 * ANSWER_AT_ONCE_S:
        return [Finding("HTTP /v1/score", "slow", f"{time.monotonic() - started:.1f} s", after)]
    return []
