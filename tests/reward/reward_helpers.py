"""Starting a real reward service on a loopback port with small test settings."""

from __future__ import annotations

from zerobubble.common.config import load_config
from zerobubble.reward.app import build
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
