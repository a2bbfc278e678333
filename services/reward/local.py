"""A reward service to talk to: the one at --server, or one started here on a loopback port."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from zerobubble.common.clients.reward import RewardClient
from zerobubble.common.config import ClientConfig, load_config
from zerobubble.reward.app import build
from zerobubble.reward.config import RewardServiceConfig


@contextmanager
def reward_client(server: str | None = None, config: Path | None = None, overrides: list[str] | None = None,
                  timeout: float = 300.0) -> Iterator[RewardClient]:
    if server:
        with RewardClient(ClientConfig(address=server, timeout_seconds=timeout)) as client:
            yield client
        return
    settings = load_config(RewardServiceConfig, config, ["server.listen=127.0.0.1:0",
                                                         "server.metrics_port=null", *(overrides or [])])
    app = build(settings).start()
    try:
        with RewardClient(ClientConfig(address=app.address, timeout_seconds=timeout)) as client:
            yield client
    finally:
        app.stop(grace=1.0)
