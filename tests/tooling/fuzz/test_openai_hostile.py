"""The rollout worker's OpenAI-compatible endpoint under the fuzz: the hostile JSON bodies of the reward service's
HTTP fuzz and the hostile chat fields to each of its routes, and slow and trickling senders, each answered below
500 at once (a trickler cut at the request's deadline) while a normal call still answers."""

from __future__ import annotations

import json
import os
import random
import socket
import time
import urllib.request

import pytest
from stack import start_buffer, tiny_assets

from zerobubble.common.config import load_config
from zerobubble.rollout.app import build
from zerobubble.rollout.config import RolloutServiceConfig
from zerobubble.tooling.fuzz.http_abuse import hostile_bodies, hostile_chat_fields, trickle
from zerobubble.tooling.fuzz.wire import post_status
from zerobubble.tooling.ports import free_port

ANSWER_WITHIN_S = 10.0
DEADLINE_S = 2.0
# As tests/tooling/fuzz/conftest.py reads it (not imported from there: another folder's conftest may hold that name).
SEED = int(os.environ.get("ZEROBUBBLE_FUZZ_SEED", "0"))


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    model, train, _ = tiny_assets(folder, train_size=2, eval_size=1)
    buffer = start_buffer(train, folder / "wal", **{"run_spec.max_new_tokens": 4})
    config = load_config(RolloutServiceConfig, None, {
        "server.listen": "127.0.0.1:0", "server.metrics_port": None, "server.grace_seconds": 0.5,
        "worker_id": "openai-fuzz", "model.path": str(model), "trainer": None, "buffer.address": buffer.address,
        "reward_service.address": f"127.0.0.1:{free_port()}", "reward_service.retry_seconds": 3600,
        "openai.enabled": True, "openai.io_timeout_s": DEADLINE_S})
    host = build(config).start()
    yield host.openai.port
    host.stop(0.5)
    buffer.stop(0)


def _post(port: int, path: str, body: bytes) -> int | None:
    return post_status(f"127.0.0.1:{port}", path, body, timeout=ANSWER_WITHIN_S)


def _session(port: int) -> str:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/sessions", data=b"{}")
    return json.loads(urllib.request.urlopen(request, timeout=ANSWER_WITHIN_S).read())["session_id"]


def _answers(port: int) -> bool:
    session = _session(port)
    body = json.dumps({"messages": [{"role": "user", "content": "1+1="}], "max_tokens": 2}).encode()
    return _post(port, f"/sessions/{session}/v1/chat/completions", body) == 200


def test_hostile_json_to_every_route_is_answered_below_500(port):
    session = _session(port)
    paths = ("/v1/sessions", "/v1/groups", f"/sessions/{session}/v1/chat/completions",
             f"/v1/sessions/{session}/close")
    findings = []
    for name, body in hostile_bodies(random.Random(SEED)).items():
        for path in paths:
            started = time.monotonic()
            status = _post(port, path, body)
            if status is None or status >= 500 or time.monotonic() - started > ANSWER_WITHIN_S:
                findings.append(f"{path} {name}: {status} after {time.monotonic() - started:.1f} s")
    assert not findings, "\n".join(findings)
    assert _answers(port)


def test_a_slow_sender_is_cut_and_the_endpoint_goes_on(port):
    with socket.create_connection(("127.0.0.1", port), timeout=ANSWER_WITHIN_S) as slow:
        slow.sendall(b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
        assert _answers(port)
        slow.settimeout(ANSWER_WITHIN_S)
        started = time.monotonic()
        answer = b""
        while chunk := slow.recv(4096):
            answer += chunk
        assert time.monotonic() - started < ANSWER_WITHIN_S
        assert answer.startswith(b"HTTP/1.0 408") and b"io_timeout_s" in answer


def test_hostile_chat_fields_are_refused_with_400_naming_them(port):
    session = _session(port)
    findings = []
    for field, value in hostile_chat_fields():
        body = json.dumps({"messages": [{"role": "user", "content": "1+1="}], "max_tokens": 2, field: value})
        status = _post(port, f"/sessions/{session}/v1/chat/completions", body.encode())
        if status != 400:
            findings.append(f"{field}={value!r:.60}: {status}")
    assert not findings, "\n".join(findings)
    assert _answers(port)


@pytest.mark.parametrize("part", ["head", "body"])
def test_a_trickling_sender_is_cut_at_the_requests_deadline(port, part):
    """A byte or a header line every 0.5 s never waits out a per-read timeout; the whole request has a deadline."""
    waited, answer = trickle("127.0.0.1", port, "/v1/sessions", part, every_s=0.5, give_up_s=6 * DEADLINE_S)
    assert waited < 3 * DEADLINE_S, f"a trickling {part} was still read after {waited:.1f} s"
    assert answer.startswith(b"HTTP/1.0 408") and b"io_timeout_s" in answer, answer[:300]
    assert _answers(port)
