"""The shared bootstrap over real sockets: health, reflection, metrics, auth, TLS, limits, shutdown."""

import datetime
import statistics
import threading
import time
import urllib.request

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from echo_service import SERVICE, EchoClient, EchoCore, register
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from idle_streams import health_check_seconds, idle_streams
from prometheus_client import Counter

from zerobubble.common.config import ClientConfig, ServerConfig, TLSConfig
from zerobubble.common.server import ServiceHost
from zerobubble.tooling.fuzz import wire
from zerobubble.tooling.ports import free_port


def start(**server) -> tuple[ServiceHost, EchoCore]:
    core = EchoCore()
    host = ServiceHost("echo", ServerConfig(listen="127.0.0.1:0", **server))
    host.add(register, core, SERVICE)
    return host.start(), core


@pytest.fixture
def echo():
    host, core = start()
    yield host, core
    host.stop(0)


def test_health_reflection_and_metrics(echo):
    host, _ = echo
    channel = grpc.insecure_channel(host.address)
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", SERVICE):
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    services = ProtoReflectionDescriptorDatabase(channel).get_services()
    assert SERVICE in services and "grpc.health.v1.Health" in services
    Counter("echo_things", "things", registry=host.registry).inc(3)
    body = urllib.request.urlopen(f"http://127.0.0.1:{host.metrics_port}/metrics", timeout=5).read().decode()
    assert "echo_things_total 3.0" in body


def test_bearer_token():
    host, _ = start(auth_token="s3cret")
    try:
        with EchoClient(ClientConfig(address=host.address, retry_seconds=0)) as anonymous:
            with pytest.raises(grpc.RpcError) as refused:
                anonymous.unary("Echo", b"hi")
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.RpcError) as refused:
                list(anonymous.stream("Stream", iter([b"hi"])))
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with EchoClient(ClientConfig(address=host.address, auth_token="s3cret")) as client:
            assert client.unary("Echo", b"hi") == b"hi"
            assert list(client.stream("Stream", iter([b"hi"]))) == [b"hi"]
        # Probes need no token.
        health = health_pb2_grpc.HealthStub(grpc.insecure_channel(host.address))
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == 1
    finally:
        host.stop(0)


def test_message_size_limit():
    host, core = start(max_message_bytes=1024)
    try:
        with EchoClient(ClientConfig(address=host.address, retry_seconds=0)) as client:
            with pytest.raises(grpc.RpcError) as err:
                client.unary("Echo", b"x" * 4096)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert client.unary("Echo", b"small") == b"small"
    finally:
        host.stop(0)


def test_graceful_stop_lets_in_flight_calls_finish(echo):
    host, core = echo
    client = EchoClient(host.address)
    outcome = {}
    caller = threading.Thread(target=lambda: outcome.setdefault("reply", client.unary("Echo", b"sleep:1.0")))
    caller.start()
    while core.calls == 0:
        time.sleep(0.01)
    host.stop(grace=10)
    caller.join(10)
    assert outcome.get("reply") == b"sleep:1.0"


def test_a_thousand_idle_streams_leave_health_checks_and_unary_calls_answering(echo):
    host, _ = echo
    with idle_streams(host.address, f"/{SERVICE}/Stream", [b"open"] * 1000, client_streaming=True):
        health = health_check_seconds(host.address)
        assert statistics.median(health) < 0.1, health
        with EchoClient(ClientConfig(address=host.address, timeout_seconds=5, retry_seconds=0)) as client:
            started = time.monotonic()
            assert client.unary("Echo", b"still here") == b"still here"
            assert time.monotonic() - started < 1.0


@pytest.mark.parametrize("method", ["Checked", "Stream"])
def test_core_errors_of_async_handlers_become_their_status(echo, method):
    host, _ = echo
    with EchoClient(ClientConfig(address=host.address, retry_seconds=0)) as client:
        received = []
        with pytest.raises(grpc.RpcError) as err:
            if method == "Checked":
                client.unary(method, b"invalid")
            else:
                received.extend(client.stream(method, iter([b"a", b"b", b"invalid", b"c"])))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details() == "payload: invalid on purpose"
        assert received == ([] if method == "Checked" else [b"a", b"b"])


@pytest.mark.parametrize("method", ["Echo", "Checked"])
def test_a_unary_call_whose_message_is_missing_or_cut_short_is_refused(echo, method):
    host, _ = echo
    body = wire.grpc_frame(b"a whole message")
    for sent in (b"", body[:3], body[:-1]):
        answer = wire.raw_call(host.address, f"/{SERVICE}/{method}", sent, timeout=10)
        assert answer.status == grpc.StatusCode.INVALID_ARGUMENT.value[0], (sent, answer)
        assert "missing or cut short" in answer.message
    assert wire.raw_call(host.address, f"/{SERVICE}/{method}", body, timeout=10).status == grpc.StatusCode.OK.value[0]


def test_stop_cancels_the_calls_still_open_after_the_grace():
    host, core = start()
    with idle_streams(host.address, f"/{SERVICE}/Stream", [b"open"] * 100, client_streaming=True) as streams, \
            EchoClient(ClientConfig(address=host.address, timeout_seconds=60, retry_seconds=0)) as client:
        # A sync handler too, busy far beyond the grace.
        busy = client.stub.Echo.future(b"sleep:30", timeout=60)
        while core.calls == 0:
            time.sleep(0.01)
        started = time.monotonic()
        host.stop(grace=1.0)
        assert time.monotonic() - started < 4.0
        assert busy.exception(10) is not None
        codes = streams.codes(timeout=10)
        assert set(codes) <= {grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE}, set(codes)


def test_deadline_on_every_call(echo):
    host, _ = echo
    with EchoClient(ClientConfig(address=host.address, timeout_seconds=0.2)) as client:
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            client.unary("Echo", b"sleep:2")
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - started < 1.5


def test_retry_on_unavailable_until_the_server_comes(echo):
    port = free_port()
    core = EchoCore()
    host = ServiceHost("late", ServerConfig(listen=f"127.0.0.1:{port}", metrics_port=None))
    host.add(register, core, SERVICE)
    threading.Timer(0.7, host.start).start()
    try:
        with EchoClient(ClientConfig(address=f"127.0.0.1:{port}", timeout_seconds=2, retry_seconds=10)) as client:
            assert client.unary("Echo", b"late") == b"late"
    finally:
        time.sleep(0.1)
        host.stop(0)


def test_no_retry_on_other_errors(echo):
    host, core = echo
    with EchoClient(ClientConfig(address=host.address, retry_seconds=10)) as client:
        with pytest.raises(grpc.RpcError) as err:
            client.unary("Echo", b"invalid")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert core.calls == 1


def test_unavailable_gives_up_after_retry_budget():
    with EchoClient(ClientConfig(address=f"127.0.0.1:{free_port()}", timeout_seconds=0.5,
                                 retry_seconds=0.6)) as client:
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            client.unary("Echo", b"x")
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - started < 3


# -- TLS -------------------------------------------------------------------------------------------
def _key():
    return ec.generate_private_key(ec.SECP256R1())


def _cert(subject_cn, key, issuer_cn, issuer_key, *, ca=False, sans=()):
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject_cn)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_cn)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(s) for s in sans]), False)
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pki")
    ca_key = _key()
    ca = _cert("test-ca", ca_key, "test-ca", ca_key, ca=True)
    files = {}
    for name, key, cert in [
        ("ca", ca_key, ca),
        ("server", server_key := _key(), _cert("localhost", server_key, "test-ca", ca_key, sans=["localhost"])),
        ("client", client_key := _key(), _cert("worker-1", client_key, "test-ca", ca_key)),
    ]:
        (folder / f"{name}.key").write_bytes(
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))
        (folder / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        files[name] = (folder / f"{name}.pem", folder / f"{name}.key")
    return files


def test_tls_and_mutual_tls(pki):
    server_cert, server_key = pki["server"]
    ca_cert, _ = pki["ca"]
    client_cert, client_key = pki["client"]
    host, _ = start(tls=TLSConfig(cert=server_cert, key=server_key, ca=ca_cert, require_client_cert=True))
    address = f"localhost:{host.port}"
    try:
        mutual = TLSConfig(ca=ca_cert, cert=client_cert, key=client_key)
        with EchoClient(ClientConfig(address=address, tls=mutual)) as c:
            assert c.unary("Echo", b"mtls") == b"mtls"
        no_client_cert = ClientConfig(address=address, retry_seconds=0, timeout_seconds=2, tls=TLSConfig(ca=ca_cert))
        with EchoClient(no_client_cert) as c, pytest.raises(grpc.RpcError) as err:
            c.unary("Echo", b"x")
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        with EchoClient(ClientConfig(address=address, retry_seconds=0, timeout_seconds=2)) as plain:
            with pytest.raises(grpc.RpcError):
                plain.unary("Echo", b"x")
    finally:
        host.stop(0)


QUIET_LIMITS = {"idle_seconds": 1.0, "keepalive_seconds": 1.0, "keepalive_timeout_seconds": 1.0}


@pytest.mark.parametrize("open_stream", [None, f"/{SERVICE}/Stream"], ids=["no call", "a call open"])
def test_connections_quiet_after_the_handshake_are_closed_within_the_limits(open_stream):
    # With no call open the idle limit closes it; with one open, the unanswered keepalive ping does.
    host, _ = start(connections=QUIET_LIMITS)
    try:
        quiet = [wire.quiet_http2(host.address, open_stream=open_stream) for _ in range(20)]
        try:
            assert statistics.median(health_check_seconds(host.address)) < 0.1
            # idle or keepalive (1 s) plus the unanswered ping's timeout (1 s), and the timers' slack
            closed = [wire.closed_within(sock, 6.0) for sock in quiet]
        finally:
            for sock in quiet:
                sock.close()
        assert None not in closed, closed
        assert statistics.median(health_check_seconds(host.address)) < 0.1
    finally:
        host.stop(0)


def test_a_quiet_grpc_client_with_a_long_stream_is_not_cut_by_the_limits():
    # grpc clients answer the server's pings: a stream quiet for longer than every limit stays open.
    host, _ = start(connections=QUIET_LIMITS)

    def requests():
        yield b"before"
        time.sleep(4.0)
        yield b"after"

    try:
        with EchoClient(ClientConfig(address=host.address, timeout_seconds=30, retry_seconds=0)) as client:
            assert list(client.stub.Stream(requests(), timeout=30)) == [b"before", b"after"]
    finally:
        host.stop(0)


def test_connection_limits_reach_grpc_as_its_options():
    options = dict(ServerConfig(connections={"idle_seconds": 2, "max_age_seconds": 5, "max_connections": 7})
                   .connections.grpc_options())
    assert options["grpc.max_connection_idle_ms"] == 2000
    assert options["grpc.max_connection_age_ms"] == 5000
    assert options["grpc.max_connection_age_grace_ms"] == 30000
    assert options["grpc.max_allowed_incoming_connections"] == 7
    assert "grpc.max_connection_age_ms" not in dict(ServerConfig().connections.grpc_options())
