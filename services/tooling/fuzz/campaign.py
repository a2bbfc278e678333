"""Sending generated messages to one RPC and judging each answer.

A finding is an answer no caller should ever get: UNKNOWN or INTERNAL (an unhandled error), UNAVAILABLE or
a dead process (a crash), CANCELLED or DATA_LOSS that the caller did not cause, UNIMPLEMENTED for a declared
method, or DEADLINE_EXCEEDED where the service should have answered at once (a hang).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import grpc
from google.protobuf import text_format
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from zerobubble.tooling.fuzz.messages import MessageStrategies
from zerobubble.tooling.fuzz.targets import MAX_MESSAGE_BYTES, Deployment, Rpc

NEVER_ACCEPTABLE = frozenset({
    grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DATA_LOSS,
    grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.CANCELLED,
})
MAX_STREAM_REQUESTS = 3
# Past these the RPC's run stops sending: what is broken is known, and each further hang costs a deadline.
MAX_FINDINGS = 10
MAX_HANGS = 2
DESCRIPTION_CHARS = 300


@dataclass(frozen=True)
class Outcome:
    code: grpc.StatusCode
    details: str
    replies: int
    seconds: float


@dataclass(frozen=True)
class Finding:
    rpc: str
    status: str
    details: str
    request: str

    def __str__(self) -> str:
        return f"{self.rpc}: {self.status} {self.details!r} for {self.request}"


@dataclass
class Report:
    """What one RPC's run sent and what came back."""

    rpc: str
    sent: int = 0
    seconds: float = 0.0
    codes: Counter = field(default_factory=Counter)
    findings: list[Finding] = field(default_factory=list)
    crashed: bool = False

    @property
    def stopped(self) -> bool:
        hangs = sum(finding.status == "hang" for finding in self.findings)
        return self.crashed or len(self.findings) >= MAX_FINDINGS or hangs >= MAX_HANGS


def describe(request: Message | list[Message]) -> str:
    """A one-line, shortened rendering of what was sent, to name it in a finding."""
    messages = request if isinstance(request, list) else [request]
    parts = []
    for message in messages:
        text = text_format.MessageToString(message, as_one_line=True, print_unknown_fields=True)
        if len(text) > DESCRIPTION_CHARS:
            text = f"{text[:DESCRIPTION_CHARS]}... ({message.ByteSize()} bytes)"
        parts.append(f"{type(message).__name__}{{{text}}}")
    return f"stream [{', '.join(parts)}]" if isinstance(request, list) else parts[0]


def call(deployment: Deployment, rpc: Rpc, request: Message | list[Message], deadline_s: float | None = None,
         ) -> Outcome:
    """Send `request` (a list of them to a client-streaming RPC) and read every reply until the call ends."""
    channel = deployment.channel(rpc.service)
    serialize = GetMessageClass(rpc.request_type).SerializeToString
    deserialize = GetMessageClass(rpc.method.output_type).FromString
    kind = {(False, False): channel.unary_unary, (False, True): channel.unary_stream,
            (True, False): channel.stream_unary, (True, True): channel.stream_stream}
    method = kind[rpc.streams_requests, rpc.streams_replies](
        rpc.path, request_serializer=serialize, response_deserializer=deserialize)
    sent = iter(request) if rpc.streams_requests else request
    started = time.monotonic()
    replies = 0
    try:
        answer = method(sent, timeout=deadline_s or rpc.deadline_s)
        if rpc.streams_replies:
            for _ in answer:
                replies += 1
        else:
            replies = 1
    except grpc.RpcError as exc:
        return Outcome(exc.code(), exc.details() or "", replies, time.monotonic() - started)
    return Outcome(grpc.StatusCode.OK, "", replies, time.monotonic() - started)


def judge(rpc: Rpc, request: Message | list[Message], outcome: Outcome) -> str | None:
    """Why this outcome is a finding ("hang" or the status name), or None when it is an acceptable answer."""
    if outcome.code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return None if rpc.may_wait(request) else "hang"
    return outcome.code.name if outcome.code in NEVER_ACCEPTABLE else None


def requests_for(rpc: Rpc, deployment: Deployment) -> st.SearchStrategy:
    """Generated requests of `rpc`: one message, or for a client-streaming RPC a stream of up to three (or none)."""
    one = MessageStrategies(MAX_MESSAGE_BYTES).requests(rpc.request_type, rpc.seeds(deployment))
    return st.lists(one, max_size=MAX_STREAM_REQUESTS) if rpc.streams_requests else one


def fuzz_rpc(deployment: Deployment, rpc: Rpc, *, examples: int, seed: int) -> Report:
    """Send `examples` generated requests to `rpc` (fewer once the run has stopped on its findings)."""
    if rpc.fresh:
        deployment.restart(rpc.service)
    report = Report(rpc.name)
    process = deployment.processes[rpc.service]
    started = time.monotonic()

    @settings(max_examples=examples, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(requests_for(rpc, deployment))
    def send(request) -> None:
        if report.stopped:
            return
        outcome = call(deployment, rpc, request)
        report.sent += 1
        report.codes[outcome.code.name] += 1
        verdict = judge(rpc, request, outcome)
        if not process.alive():
            report.crashed = True
            verdict = f"crash (exit {process.process.returncode})"
            outcome = Outcome(outcome.code, f"{outcome.details}; log: {process.log_tail(1500)}", 0, outcome.seconds)
        if verdict is not None:
            report.findings.append(Finding(rpc.name, verdict, outcome.details, describe(request)))

    hypothesis_seed(seed)(send)()
    report.seconds = time.monotonic() - started
    return report
