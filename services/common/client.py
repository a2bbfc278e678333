"""One client helper: TLS, bearer token, message limits, a deadline on every call, and retry with
backoff on UNAVAILABLE only (any other status is an answer and is returned at once)."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from zerobubble.common.config import ClientConfig, ConfigError

T = TypeVar("T")
log = logging.getLogger(__name__)
# How often a service waiting for a peer at its start says so.
WAITING_LOG_SECONDS = 10.0


class PeerUnreachable(ConfigError):
    """A peer a service needs at its start did not answer within its client's retry_seconds."""


def open_channel(config: ClientConfig) -> grpc.Channel:
    options = [
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.max_send_message_length", config.max_message_bytes),
        # Long streams (PullBatch, WatchWeights, PushExperience) are quiet for minutes: the pings keep them
        # answering the server's keepalive and find a peer that went away without closing.
        ("grpc.keepalive_time_ms", int(config.keepalive_seconds * 1000)),
        ("grpc.keepalive_timeout_ms", int(config.keepalive_timeout_seconds * 1000)),
        ("grpc.http2.ping_timeout_ms", int(config.keepalive_timeout_seconds * 1000)),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    tls = config.tls
    if not tls.enabled:
        return grpc.insecure_channel(config.address, options=options)
    if tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    credentials = grpc.ssl_channel_credentials(
        root_certificates=tls.ca.read_bytes() if tls.ca else None,
        private_key=tls.key.read_bytes() if tls.key else None,
        certificate_chain=tls.cert.read_bytes() if tls.cert else None,
    )
    return grpc.secure_channel(config.address, credentials, options=options)


def retry_unavailable(
    attempt: Callable[[], T],
    *,
    retry_seconds: float,
    first_backoff: float = 0.05,
    max_backoff: float = 2.0,
) -> T:
    """Call `attempt` until it does not fail with UNAVAILABLE or `retry_seconds` have passed."""
    give_up = time.monotonic() + retry_seconds
    backoff = first_backoff
    while True:
        try:
            return attempt()
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            pause = backoff * random.uniform(0.5, 1.0)
            if time.monotonic() + pause > give_up:
                raise
            time.sleep(pause)
            backoff = min(max_backoff, backoff * 2)


class ServiceClient:
    """Base for the typed clients (RewardClient, ...): owns the channel and the call policy. `retries`: whether
    unary calls retry UNAVAILABLE themselves; False for a caller that retries whole operations itself
    (common/persistence.py), so that one retry loop never runs inside another."""

    stub_class: Callable[[grpc.Channel], Any]

    def __init__(self, config: ClientConfig | str, *, retries: bool = True):
        self.config = ClientConfig(address=config) if isinstance(config, str) else config
        self.retries = retries
        token = self.config.bearer_token()
        if warning := self.config.exposure(token):
            log.warning(warning)
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.channel = open_channel(self.config)
        self.stub = self.stub_class(self.channel)

    def unary(self, method: str, request: Any, *, timeout: float | None = None, retry: bool | None = None) -> Any:
        """A unary call with a deadline; UNAVAILABLE is retried for `retry_seconds` (retry None: as the client's
        `retries` says)."""
        rpc = getattr(self.stub, method)
        deadline = timeout or self.config.timeout_seconds

        def attempt():
            return rpc(request, timeout=deadline, metadata=self.metadata)

        retry = self.retries if retry is None else retry
        return retry_unavailable(attempt, retry_seconds=self.config.retry_seconds if retry else 0)

    def first_call(self, method: str, request: Any, *, peer: str, field: str, timeout: float | None = None) -> Any:
        """A service's first call to a peer that may not be up yet (started by hand, in any order): while it is
        unavailable a line says so every WAITING_LOG_SECONDS, and after `retry_seconds` PeerUnreachable names the
        address and the config `field` that gave it."""
        rpc = getattr(self.stub, method)
        said = [0.0]

        def attempt():
            try:
                return rpc(request, timeout=timeout or self.config.timeout_seconds, metadata=self.metadata)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() - said[0] >= WAITING_LOG_SECONDS:
                    said[0] = time.monotonic()
                    log.info("waiting for the %s at %s (%s.address)", peer, self.config.address, field)
                raise

        try:
            return retry_unavailable(attempt, retry_seconds=self.config.retry_seconds)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            raise PeerUnreachable(f"{field}.address: no {peer} answered at {self.config.address} within "
                                  f"{self.config.retry_seconds:g} s ({field}.retry_seconds): start it first, or "
                                  "correct the address") from None

    def stream(self, method: str, request: Any, *, timeout: float | None = None) -> Any:
        """A streaming call with a deadline over the whole stream (not retried: it may be half done)."""
        return getattr(self.stub, method)(
            request, timeout=timeout or self.config.timeout_seconds, metadata=self.metadata
        )

    def close(self) -> None:
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
