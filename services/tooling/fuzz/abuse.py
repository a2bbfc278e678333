"""What the message fuzz cannot send: streams cancelled midway or cut inside a message, junk instead of HTTP/2,
bodies that are not protobuf messages, and connections that open and say nothing. Each returns its findings
(see campaign.py for what counts as one)."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Iterator

import grpc
from google.protobuf.message import Message

from zerobubble.tooling.fuzz import wire
from zerobubble.tooling.fuzz.campaign import NEVER_ACCEPTABLE, Finding, call
from zerobubble.tooling.fuzz.targets import RPCS, Deployment, Rpc, health, valid_call

# More than any service's server threads: a cancelled stream that kept its thread would lock the service out.
CANCELLED_STREAMS = 24
HALF_OPEN_CONNECTIONS = 200
# Generous for a loaded 2-core machine: these answers need no work.
ANSWER_AT_ONCE_S = 5.0


def _rpc(name: str) -> Rpc:
    return next(rpc for rpc in RPCS if rpc.name == name)


def _held_open(first: Message, release: threading.Event) -> Iterator[Message]:
    """A request stream that sends one message and then waits, as a client that went quiet midway does."""
    yield first
    release.wait()


def _first_reply(answer) -> None:
    with contextlib.suppress(grpc.RpcError):
        next(answer, None)


def _cancel_after_first_reply(deployment: Deployment, rpc: Rpc, request, settle_s: float = 0.5) -> str | None:
    """Start the call, read at most one reply, cancel; the status name when it was not the cancellation."""
    channel = deployment.channel(rpc.service)
    release = threading.Event()
    kind = channel.stream_stream if rpc.streams_requests else channel.unary_stream
    method = kind(rpc.path, request_serializer=type(request).SerializeToString)
    answer = method(_held_open(request, release) if rpc.streams_requests else request, timeout=rpc.deadline_s)
    reader = threading.Thread(target=_first_reply, args=(answer,), daemon=True)
    try:
        reader.start()
        reader.join(settle_s)
        answer.cancel()
    except grpc.RpcError:
        pass
    finally:
        release.set()
        reader.join(rpc.deadline_s)
    code = answer.code()
    return None if code in (grpc.StatusCode.CANCELLED, grpc.StatusCode.OK) else code.name


def cancelled_streams(deployment: Deployment) -> list[Finding]:
    """Every streaming RPC, CANCELLED_STREAMS times: a stream cancelled after its first reply (or while the
    server still works on it); then the service must answer health checks and valid calls at once."""
    findings = []
    group = _rpc("buffer.PushExperience").seeds(deployment)[0]
    cases = {
        "reward.ScoreStream": lambda i: _rpc("reward.ScoreStream").seeds(deployment)[i % 3],
        "buffer.PushExperience": lambda i: _with_sequence(group, 10_000 + i),
        "buffer.PullBatch": lambda i: _rpc("buffer.PullBatch").seeds(deployment)[0],
        "trainer.WatchWeights": lambda i: _rpc("trainer.WatchWeights").seeds(deployment)[0],
    }
    for name, request_of in cases.items():
        rpc = _rpc(name)
        for i in range(CANCELLED_STREAMS):
            if name == "buffer.PullBatch":
                # Something to deliver, so the stream is cut between groups.
                call(deployment, _rpc("buffer.PushExperience"), [_with_sequence(group, 20_000 + 2 * i + k)
                                                                 for k in range(2)])
            status = _cancel_after_first_reply(deployment, rpc, request_of(i))
            if status is not None:
                findings.append(Finding(name, status, "a stream cancelled after its first reply", f"stream {i}"))
        findings += serving(deployment, rpc.service, f"after {CANCELLED_STREAMS} cancelled {name} streams")
    return findings


def _with_sequence(group: Message, sequence: int) -> Message:
    copy = type(group)()
    copy.CopyFrom(group)
    copy.sequence = sequence
    return copy


def serving(deployment: Deployment, service: str, after: str) -> list[Finding]:
    """Findings when the service is dead, fails its health check or does not answer a valid call at once."""
    process = deployment.processes[service]
    if not process.alive():
        return [Finding(service, "crash", f"exit {process.process.returncode}; log: {process.log_tail(1500)}",
                        after)]
    started = time.monotonic()
    if not health(deployment, service, timeout=ANSWER_AT_ONCE_S):
        return [Finding(service, "hang", "no health answer", after)]
    problem = valid_call(deployment, service)
    if problem is not None:
        return [Finding(service, "hang" if "DEADLINE" in problem else "refused", problem, after)]
    if time.monotonic() - started > 2 * ANSWER_AT_ONCE_S:
        return [Finding(service, "slow", f"{time.monotonic() - started:.1f} s for health and a valid call", after)]
    return []


# Field 100, varint 1: unknown to every request, so that even an empty request has bytes to cut.
UNKNOWN_FIELD = b"\xa0\x06\x01"
# gRPC Python answers a unary call whose only message was cut with UNIMPLEMENTED ("requires exactly one request
# message") before any servicer runs: misleading, but neither an unhandled error nor a hang.
CUT_ACCEPTABLE = NEVER_ACCEPTABLE - {grpc.StatusCode.UNIMPLEMENTED}


def _status(number: int) -> grpc.StatusCode:
    return next(code for code in grpc.StatusCode if code.value[0] == number)


def cut_messages(deployment: Deployment, service: str) -> list[Finding]:
    """Each RPC of the service gets a valid message cut short inside its gRPC frame, once half-closed and once
    with the connection dropped; a client-streaming one after a whole first message."""
    findings = []
    address = deployment.processes[service].address
    for rpc in (rpc for rpc in RPCS if rpc.service == service):
        seeds = rpc.seeds(deployment)
        message = seeds[0].SerializeToString() if seeds else b""
        body = wire.grpc_frame(message + UNKNOWN_FIELD)
        head = body if rpc.streams_requests else b""
        for cut in (3, len(body) - 1):
            sent = f"a message cut after {cut} of {len(body)} bytes"
            answer = wire.raw_call(address, rpc.path, head + body[:cut])
            if answer.status is not None and _status(answer.status) in CUT_ACCEPTABLE:
                findings.append(Finding(rpc.name, _status(answer.status).name, answer.message, f"{sent}, half-closed"))
            elif answer.status is None:
                findings.append(Finding(rpc.name, "hang" if "timeout" in answer.ended else "no status",
                                        answer.ended, f"{sent}, half-closed"))
            wire.raw_call(address, rpc.path, head + body[:cut], close_after=True)
    return findings + serving(deployment, service, f"cut messages to every RPC of {service}")


def undecodable_bodies(deployment: Deployment, service: str, rng: random.Random) -> list[Finding]:
    """Each RPC of the service gets bodies that are no message of its request type: random bytes, a string field
    that is not UTF-8, a length running past the end."""
    bodies = {"random bytes": rng.randbytes(64) + b"\xff\xff", "a string that is not UTF-8": b"\x0a\x02\xff\xfe",
              "a length past the end": b"\x0a\x7f\x01"}
    findings = []
    channel = deployment.channel(service)
    for rpc in (rpc for rpc in RPCS if rpc.service == service):
        for name, body in bodies.items():
            code, details = wire.bytes_call(channel, rpc.path, body, client_streaming=rpc.streams_requests,
                                            server_streaming=rpc.streams_replies, timeout=rpc.deadline_s)
            if code in NEVER_ACCEPTABLE:
                findings.append(Finding(rpc.name, code.name, details, f"a body that is {name}"))
    return findings + serving(deployment, service, f"undecodable bodies to every RPC of {service}")


def junk(deployment: Deployment, service: str, rng: random.Random) -> list[Finding]:
    """Junk instead of HTTP/2: the service must close the connection at once and go on serving."""
    findings = []
    address = deployment.processes[service].address
    for name, payload in wire.junk_payloads(rng).items():
        started = time.monotonic()
        wire.send_junk(address, payload, timeout=2 * ANSWER_AT_ONCE_S)
        if time.monotonic() - started > ANSWER_AT_ONCE_S:
            findings.append(Finding(service, "hang", "the connection stayed open", name))
    return findings + serving(deployment, service, f"junk bytes to {service}")


def half_open(deployment: Deployment, service: str) -> list[Finding]:
    """HALF_OPEN_CONNECTIONS connections that say nothing and as many that send only the HTTP/2 preface: with
    all of them open the service answers at once."""
    address = deployment.processes[service].address
    with wire.half_open(address, HALF_OPEN_CONNECTIONS), \
            wire.half_open(address, HALF_OPEN_CONNECTIONS, opening=wire.HTTP2_PREFACE):
        return serving(deployment, service, f"with {2 * HALF_OPEN_CONNECTIONS} half-open connections to {service}")
