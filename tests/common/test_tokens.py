"""Bearer tokens from a file or an environment variable, over real sockets; the warnings a service logs at start
when its port is open to the network without a token, or a token travels there without TLS."""

from __future__ import annotations

import logging
import subprocess
import sys

import grpc
import pytest
from echo_service import SERVICE, EchoClient, EchoCore, register

from zerobubble.common.config import ClientConfig, ConfigError, ServerConfig, TLSConfig, load_config
from zerobubble.common.server import ServiceHost
from zerobubble.reward.config import RewardServiceConfig

TOKEN = "a-token-from-a-file"
VARIABLE = "ZEROBUBBLE_TEST_TOKEN"


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")  # as `echo` or an editor leaves it
    return path


def echo_host(**server) -> ServiceHost:
    host = ServiceHost("echo", ServerConfig(metrics_port=None, **server))
    host.add(register, EchoCore(), SERVICE)
    return host.start()


def call(address: str, **client) -> grpc.StatusCode:
    with EchoClient(ClientConfig(address=address, retry_seconds=0, **client)) as echo:
        try:
            echo.unary("Echo", b"hi")
        except grpc.RpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def test_a_token_from_a_file_is_required_and_a_token_from_a_variable_is_sent(token_file, monkeypatch):
    monkeypatch.setenv(VARIABLE, TOKEN)
    host = echo_host(listen="127.0.0.1:0", auth_token_file=token_file)
    try:
        assert call(host.address) == grpc.StatusCode.UNAUTHENTICATED
        assert call(host.address, auth_token="not-the-token") == grpc.StatusCode.UNAUTHENTICATED
        assert call(host.address, auth_token_env=VARIABLE) == grpc.StatusCode.OK
        assert call(host.address, auth_token_file=token_file) == grpc.StatusCode.OK
    finally:
        host.stop(0)


def test_one_source_at_most_and_a_sendable_token_naming_the_field(tmp_path, token_file, monkeypatch):
    with pytest.raises(ConfigError, match=r"server: .*auth_token and auth_token_file"):
        load_config(RewardServiceConfig, overrides={"server.auth_token": TOKEN, "server.auth_token_file": token_file})
    with pytest.raises(ConfigError, match=r"server\.auth_token: .*printable ASCII"):
        load_config(RewardServiceConfig, overrides={"server.auth_token": "two words"})

    with pytest.raises(ConfigError, match=r"auth_token_file: cannot read .*missing"):
        ServerConfig(auth_token_file=tmp_path / "missing").bearer_token()
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match=r"auth_token_file: .*empty"):
        ClientConfig(auth_token_file=tmp_path / "empty").bearer_token()
    monkeypatch.delenv(VARIABLE, raising=False)
    with pytest.raises(ConfigError, match=rf"auth_token_env: \${VARIABLE} is empty or not set"):
        ClientConfig(auth_token_env=VARIABLE).bearer_token()
    monkeypatch.setenv(VARIABLE, "caf\u00e9")
    with pytest.raises(ConfigError, match=r"auth_token_env: .*printable ASCII"):
        ServerConfig(auth_token_env=VARIABLE).bearer_token()


def test_a_service_whose_token_cannot_be_read_does_not_start(tmp_path):
    missing = tmp_path / "no-such-token"
    result = subprocess.run(
        [sys.executable, "-m", "zerobubble", "serve", "reward", "--set", f"server.auth_token_file={missing}",
         "--set", "server.metrics_port=null"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert f"auth_token_file: cannot read {missing}" in result.stderr


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_token_without_tls_over_the_network_is_a_warning_on_both_sides(token_file, tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    host = echo_host(listen="0.0.0.0:0", auth_token_file=token_file)
    host.stop(0)
    assert any("reaches 0.0.0.0:" in w and "unencrypted" in w and "server.tls.cert" in w for w in warnings(caplog))

    caplog.clear()
    EchoClient(ClientConfig(address="10.0.0.5:50055", auth_token_file=token_file)).close()
    assert any("goes to 10.0.0.5:50055 unencrypted" in w for w in warnings(caplog))

    caplog.clear()
    ca = tmp_path / "ca.pem"
    ca.write_bytes(b"")
    # TLS on, or loopback only: the token crosses no network in clear, so nothing to say.
    ServiceHost("quiet", ServerConfig(listen="0.0.0.0:0", auth_token_file=token_file,
                                      tls=TLSConfig(cert=tmp_path / "cert.pem", key=tmp_path / "key.pem")))
    EchoClient(ClientConfig(address="10.0.0.5:50055", auth_token_file=token_file, tls=TLSConfig(ca=ca))).close()
    ServiceHost("local", ServerConfig(listen="127.0.0.1:0", auth_token_file=token_file))
    EchoClient(ClientConfig(address="localhost:50055", auth_token_file=token_file)).close()
    assert warnings(caplog) == []


def test_a_port_open_to_the_network_without_a_token_is_a_warning(caplog):
    caplog.set_level(logging.WARNING)
    ServiceHost("open", ServerConfig(listen="0.0.0.0:0"))
    assert any("answers every caller" in w and "auth_token_file" in w for w in warnings(caplog))
    caplog.clear()
    ServiceHost("local", ServerConfig(listen="127.0.0.1:0"))
    assert warnings(caplog) == []
