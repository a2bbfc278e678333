"""Buffer fixtures: a fake clock and a real buffer service on loopback."""

from __future__ import annotations

from typing import Any

import pytest
from buffer_helpers import FakeClock, make_config

from zerobubble.buffer.app import build
from zerobubble.common.clients.buffer import BufferClient


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def serve(tmp_path):
    """serve(**overrides) -> (host, client): a started buffer service on loopback, stopped afterwards."""
    started = []

    def start(prompts: int = 8, **overrides: Any):
        host = build(make_config(tmp_path, prompts, **overrides)).start()
        client = BufferClient(host.address)
        started.append((host, client))
        return host, client

    yield start
    for host, client in started:
        client.close()
        host.stop(0)
