"""A real reward service on a loopback port, shared by the integration tests of this folder."""

from __future__ import annotations

import pytest
from zerobubble.common.config import ClientConfig, load_config
from zerobubble.reward.app import build
from zerobubble.reward.client import RewardClient
from zerobubble.reward.config import RewardServiceConfig

TEST_SETTINGS = {
    "server.listen": "127.0.0.1:0",
    "math.workers": 2,
    "math.timeout_seconds": 3.0,
    "sandbox.slots": 2,
    "sandbox.wall_seconds": 3.0,
    "sandbox.cpu_seconds": 3,
    "sandbox.memory_bytes": 512 * 1024 * 1024,
}


def start_reward(**overrides):
    return build(load_config(RewardServiceConfig, overrides={**TEST_SETTINGS, **overrides})).start()


@pytest.fixture(scope="session")
def reward_app():
    app = start_reward()
    yield app
    app.close(grace=1.0)


@pytest.fixture(scope="session")
def reward(reward_app):
    with RewardClient(ClientConfig(address=reward_app.host.address, timeout_seconds=120)) as client:
        yield client
