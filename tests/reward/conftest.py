"""A real reward service on a loopback port, shared by the integration tests of this folder."""

from __future__ import annotations

import pytest
from reward_helpers import start_reward

from zerobubble.common.clients.reward import RewardClient
from zerobubble.common.config import ClientConfig


@pytest.fixture(scope="session")
def reward_host():
    app = start_reward()
    yield app
    app.stop(grace=1.0)


@pytest.fixture(scope="session")
def reward(reward_host):
    with RewardClient(ClientConfig(address=reward_host.address, timeout_seconds=120)) as client:
        yield client
