"""Typed service configuration: one pydantic schema per service, loaded from YAML plus overrides.

Every default lives in the schema classes; YAML files in configs/ only say what differs.
"""

from __future__ import annotations

import ipaddress
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from zerobubble.common.config_tree import ConfigError, invalid_config, read_tree, unknown_key_message

# The variable `zerobubble up` hands its per-run token to its services in; also a name for deployments to use.
TOKEN_ENV = "ZEROBUBBLE_AUTH_TOKEN"
# gRPC metadata values are printable ASCII; a space would also split the "Bearer <token>" header.
_TOKEN_CHARS = re.compile(r"[\x21-\x7e]+")


class Schema(BaseModel):
    """Base for every config section: unknown keys are errors, so a typo never passes silently."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TLSConfig(Schema):
    """Server side: cert/key enable TLS; client_ca also requires client certificates (mutual TLS).
    Client side: ca verifies the server; cert/key present a client certificate."""

    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None
    require_client_cert: bool = False
    server_name: str | None = Field(None, description="override the name checked in the server cert")

    @property
    def enabled(self) -> bool:
        return self.cert is not None or self.ca is not None


class BearerToken(Schema):
    """Where the bearer token comes from: at most one of the three. The file and the variable are read when
    the server or client is built, so a config file never holds the secret and can be shared."""

    auth_token: str | None = Field(None, description="a server requires 'authorization: Bearer <token>' of every "
                                   "call but health checks, a client sends it; prefer auth_token_file or _env")
    auth_token_file: Path | None = Field(None, description="read the token from this file (e.g. a docker secret)")
    auth_token_env: str | None = Field(None, min_length=1, description="read the token from this environment variable")

    @field_validator("auth_token")
    @classmethod
    def _sendable(cls, value: str | None) -> str | None:
        if value is not None and not _TOKEN_CHARS.fullmatch(value):
            raise ValueError("must be printable ASCII without spaces")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> BearerToken:
        given = [name for name in ("auth_token", "auth_token_file", "auth_token_env")
                 if getattr(self, name) is not None]
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)}: give at most one source of the bearer token")
        return self

    def bearer_token(self) -> str | None:
        """The token, or None when none is configured; ConfigError names the field whose source fails."""
        if self.auth_token_file is not None:
            field, source = "auth_token_file", self.auth_token_file
            try:
                token = self.auth_token_file.read_text().strip()
            except OSError as exc:
                raise ConfigError(f"auth_token_file: cannot read {source}: {exc.strerror}") from None
        elif self.auth_token_env is not None:
            field, source = "auth_token_env", f"${self.auth_token_env}"
            token = os.environ.get(self.auth_token_env, "").strip()
        else:
            return self.auth_token
        if not token:
            raise ConfigError(f"{field}: {source} is empty or not set")
        if not _TOKEN_CHARS.fullmatch(token):
            raise ConfigError(f"{field}: the token in {source} must be printable ASCII without spaces")
        return token


def host_port(value: str) -> str:
    """`value` if it is HOST:PORT (port 0 to 65535), the rule of every address a service listens on."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return value


def is_loopback(address: str) -> bool:
    """Whether HOST:PORT stays on this machine."""
    host = address.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ConnectionLimits(Schema):
    """How long a gRPC connection may sit quiet, and how much one may hold. A peer that completes the HTTP/2
    handshake and then says nothing costs the server a descriptor until one of these closes it; without them
    such connections stay forever, and enough of them leave no descriptor for a real caller."""

    idle_seconds: float = Field(60.0, gt=0, description="a connection with no call open for this long is sent "
                                "GOAWAY and closed (grpc.max_connection_idle_ms)")
    keepalive_seconds: float = Field(30.0, gt=0, description="the server pings a connection quiet for this long, "
                                     "calls open or not (grpc.keepalive_time_ms)")
    keepalive_timeout_seconds: float = Field(10.0, gt=0, description="a ping not answered within this closes the "
                                             "connection and its calls (grpc.keepalive_timeout_ms)")
    max_age_seconds: float | None = Field(None, gt=0, description="every connection is sent GOAWAY after this long "
                                          "(grpc.max_connection_age_ms); null: no limit, as streams such as "
                                          "PullBatch and WatchWeights live for the whole run")
    age_grace_seconds: float = Field(30.0, ge=0, description="after max_age_seconds, how long the calls open on "
                                     "the connection may finish before it is closed (grpc.max_connection_age_grace_ms)")
    min_client_ping_seconds: float = Field(10.0, gt=0, description="a client pinging more often than this is sent "
                                           "GOAWAY (grpc.http2.min_ping_interval_without_data_ms); clients of this "
                                           "project ping every ClientConfig.keepalive_seconds")
    max_concurrent_streams: int = Field(4096, gt=0, description="calls open at once on one connection "
                                        "(grpc.max_concurrent_streams)")
    max_connections: int | None = Field(None, gt=0, description="connections accepted at once; those beyond are "
                                        "closed at accept (grpc.max_allowed_incoming_connections); null: no limit "
                                        "but the process's descriptors")

    def grpc_options(self) -> list[tuple[str, int]]:
        def ms(seconds: float) -> int:
            return int(seconds * 1000)

        options = [
            ("grpc.max_connection_idle_ms", ms(self.idle_seconds)),
            ("grpc.keepalive_time_ms", ms(self.keepalive_seconds)),
            ("grpc.keepalive_timeout_ms", ms(self.keepalive_timeout_seconds)),
            # grpc waits this long for any ping's answer (a minute unless set), whatever the keepalive timeout.
            ("grpc.http2.ping_timeout_ms", ms(self.keepalive_timeout_seconds)),
            ("grpc.keepalive_permit_without_calls", 1),
            # Server pings are not to be held back waiting for data on a quiet connection: that is when they matter.
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.http2.min_ping_interval_without_data_ms", ms(self.min_client_ping_seconds)),
            ("grpc.max_concurrent_streams", self.max_concurrent_streams),
        ]
        if self.max_age_seconds is not None:
            options += [("grpc.max_connection_age_ms", ms(self.max_age_seconds)),
                        ("grpc.max_connection_age_grace_ms", ms(self.age_grace_seconds))]
        if self.max_connections is not None:
            options.append(("grpc.max_allowed_incoming_connections", self.max_connections))
        return options


class ServerConfig(BearerToken):
    listen: str = "127.0.0.1:0"
    metrics_port: int | None = Field(0, description="Prometheus /metrics port; 0 picks one, null disables")
    metrics_host: str = "127.0.0.1"
    max_message_bytes: int = Field(64 * 1024 * 1024, gt=0)
    max_workers: int = Field(16, gt=0, description="threads for sync handlers and blocking core work; streams "
                             "that wait hold none")
    grace_seconds: float = Field(10.0, ge=0, description="on SIGTERM, how long in-flight calls may finish; "
                                 "those still open then are cancelled")
    connections: ConnectionLimits = ConnectionLimits()
    tls: TLSConfig = TLSConfig()

    @field_validator("listen")
    @classmethod
    def _host_port(cls, value: str) -> str:
        return host_port(value)

    def exposure(self, token: str | None) -> str | None:
        """What to warn about at start when other machines can reach this server: no token, or a token in clear."""
        if is_loopback(self.listen):
            return None
        if token is None:
            return (f"{self.listen} answers every caller that reaches it: no bearer token is set "
                    f"(server.auth_token_file or server.auth_token_env)")
        if self.tls.cert is None:
            return (f"the bearer token reaches {self.listen} unencrypted, so anyone on the network path can read "
                    f"and replay it: set server.tls.cert and server.tls.key")
        return None


class ClientConfig(BearerToken):
    """How one service calls another; the bearer token, when one is given, goes with every call."""

    address: str = "127.0.0.1:50051"
    timeout_seconds: float = Field(30.0, gt=0, description="deadline of each call")
    retry_seconds: float = Field(60.0, ge=0, description="how long a call is retried while the peer is unavailable "
                                 "(a worker's or trainer's own loop: also busy or slow) before its error stands")
    max_message_bytes: int = Field(64 * 1024 * 1024, gt=0)
    keepalive_seconds: float = Field(60.0, gt=0, description="the client pings a connection with a call open but "
                                     "quiet for this long, so a peer gone without a word ends the call; at least "
                                     "the server's connections.min_client_ping_seconds, or the server hangs up")
    keepalive_timeout_seconds: float = Field(20.0, gt=0, description="a ping not answered within this ends the "
                                             "connection's calls with UNAVAILABLE")
    tls: TLSConfig = TLSConfig()

    def exposure(self, token: str | None) -> str | None:
        """What to warn about when this client sends its token in clear over a network."""
        if token is None or self.tls.enabled or is_loopback(self.address):
            return None
        return (f"the bearer token goes to {self.address} unencrypted, so anyone on the network path can read and "
                f"replay it: set tls.ca")


S = TypeVar("S", bound=BaseModel)


def nested_model(annotation: Any) -> tuple[type[BaseModel] | None, str]:
    """The schema a field's values are checked against, and how it nests: "section" (the model itself, or the model
    or null), "list" (a list of entries) or "dict" (entries by name); (None, "") for a plain value."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, "section"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        models = [arg for arg in args if isinstance(arg, type) and issubclass(arg, BaseModel)]
        if len(models) == 1 and all(arg is type(None) for arg in args if arg is not models[0]):
            return models[0], "section"
    if origin is list and len(args) == 1 and isinstance(args[0], type) and issubclass(args[0], BaseModel):
        return args[0], "list"
    if origin is dict and len(args) == 2 and isinstance(args[1], type) and issubclass(args[1], BaseModel):
        return args[1], "dict"
    return None, ""


def key_tree(schema: type[BaseModel]) -> dict[str, Any]:
    """The schema's keys as plain data (see config_tree), nested schemas expanded."""
    fields = {}
    for name, field in schema.model_fields.items():
        model, nesting = nested_model(field.annotation)
        fields[name] = {"nest": nesting, "model": key_tree(model) if model is not None else None,
                        "choices": _choices(field.annotation)}
    return {"closed": schema.model_config.get("extra") == "forbid", "fields": fields}


def _choices(annotation: Any) -> list[str] | None:
    """The strings a Literal field (or an optional one) accepts; None for any other field."""
    args = [arg for arg in typing.get_args(annotation) if arg is not type(None)] \
        if typing.get_origin(annotation) in (typing.Union, types.UnionType) else [annotation]
    if len(args) == 1 and typing.get_origin(args[0]) is typing.Literal:
        values = typing.get_args(args[0])
        return list(values) if all(isinstance(value, str) for value in values) else None
    return None


def describe_errors(error: ValidationError, schema: type[BaseModel], prefix: str = "") -> list[str]:
    """One line per error, naming the field as the user writes it (`prefix` first); an unknown key gets the
    closest key the schema has, if one is close."""
    lines = []
    for item in error.errors():
        field = prefix + ".".join(str(part) for part in item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = unknown_key_message(key_tree(schema), item["loc"], prefix)
        lines.append(f"  {field}: {message}" if field else message if message.startswith("  ") else f"  {message}")
    return lines


def load_config(
    schema: type[S],
    path: str | Path | None = None,
    overrides: list[str] | dict[str, Any] | None = None,
) -> S:
    """Build a validated config: schema defaults, then the YAML file, then dotted overrides."""
    tree = read_tree(path, overrides)
    try:
        return schema.model_validate(tree)
    except ValidationError as exc:
        raise invalid_config(schema.__name__, path, overrides, describe_errors(exc, schema)) from None
