"""Typed service configuration: one pydantic schema per service, loaded from YAML plus overrides.

Every default lives in the schema classes; YAML files in configs/ only say what differs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the offending field."""


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


class ServerConfig(Schema):
    listen: str = "127.0.0.1:0"
    metrics_port: int | None = Field(0, description="Prometheus /metrics port; 0 picks one, null disables")
    metrics_host: str = "127.0.0.1"
    max_message_bytes: int = Field(64 * 1024 * 1024, gt=0)
    max_workers: int = Field(16, gt=0, description="threads for sync handlers and blocking core work; streams "
                             "that wait hold none")
    grace_seconds: float = Field(10.0, ge=0, description="on SIGTERM, how long in-flight calls may finish; "
                                 "those still open then are cancelled")
    tls: TLSConfig = TLSConfig()
    auth_token: str | None = Field(None, description="if set, calls must send 'authorization: Bearer <token>'")

    @field_validator("listen")
    @classmethod
    def _host_port(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ValueError(f"expected HOST:PORT, got {value!r}")
        return value


class ClientConfig(Schema):
    """How one service calls another."""

    address: str = "127.0.0.1:50051"
    timeout_seconds: float = Field(30.0, gt=0, description="deadline of each call")
    retry_seconds: float = Field(60.0, ge=0, description="keep retrying UNAVAILABLE for this long")
    max_message_bytes: int = Field(64 * 1024 * 1024, gt=0)
    tls: TLSConfig = TLSConfig()
    auth_token: str | None = None


S = TypeVar("S", bound=BaseModel)


def _set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {dotted!r}: {key!r} is not a section")
        node = child
    node[keys[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """'a.b=value' -> ('a.b', value), the value read as YAML so numbers, lists and null work."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r}: expected KEY=VALUE, e.g. server.listen=0.0.0.0:50051")
    return key.strip(), yaml.safe_load(raw) if raw.strip() else ""


def _describe(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"]) or "(top level)"
        lines.append(f"  {field}: {item['msg']}")
    return "\n".join(lines)


def load_config(
    schema: type[S],
    path: str | Path | None = None,
    overrides: list[str] | dict[str, Any] | None = None,
) -> S:
    """Build a validated config: schema defaults, then the YAML file, then dotted overrides."""
    tree: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        try:
            loaded = yaml.safe_load(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {path}: the top level must be a mapping")
        tree = loaded or {}
    items = overrides.items() if isinstance(overrides, dict) else map(parse_override, overrides or [])
    for key, value in items:
        _set_path(tree, key, value)
    try:
        return schema.model_validate(tree)
    except ValidationError as exc:
        source = f" in {path}" if path else ""
        raise ConfigError(f"invalid {schema.__name__} configuration{source}:\n{_describe(exc)}") from None
