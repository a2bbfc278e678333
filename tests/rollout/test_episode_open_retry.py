"""The episode driver's OpenEpisode against the client's contract, through a real environment service: an open whose
deadline passed is not retried (the service may have opened it: a retry would open a second episode nobody holds),
and one the service refused for being full is retried until a slot frees, opening exactly one."""

from __future__ import annotations

import textwrap
import threading
import time

import pytest

from zerobubble.common.clients.environment import EnvironmentClient
from zerobubble.common.config import ClientConfig, load_config
from zerobubble.environment.app import build
from zerobubble.environment.config import EnvironmentServiceConfig
from zerobubble.rollout.episodes.remote import RemoteSessions
from zerobubble.rollout.episodes.sessions import UNAVAILABLE

RESET_SECONDS = 1.5
IDLE_SECONDS = 2.0
ENVIRONMENTS = '''
import time


class SlowReset:
    def reset(self, row):
        time.sleep(row.get("sleep", 0))
        return None

    def step(self, assistant_text):
        return {"done": True}
'''


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    folder = tmp_path_factory.mktemp("my_envs")
    (folder / "slow_envs.py").write_text(textwrap.dedent(ENVIRONMENTS))
    host = build(load_config(EnvironmentServiceConfig, overrides={
        "server.listen": "127.0.0.1:0", "limits.step_timeout_s": 10.0, "limits.max_episodes": 1,
        "limits.idle_timeout_s": IDLE_SECONDS,
        "environments": [{"name": "slow", "environment": "slow_envs:SlowReset", "path": str(folder)}],
    })).start()
    yield host
    host.stop(grace=1.0)


def opened(host) -> float:
    """Episodes the service has opened so far (its own counter), resets still running not yet among them."""
    return host.registry.get_sample_value("zerobubble_environment_episodes_opened_total",
                                          {"environment": "slow"}) or 0.0


def expired(host) -> float:
    return host.registry.get_sample_value("zerobubble_environment_episodes_ended_total",
                                          {"environment": "slow", "reason": "expired"}) or 0.0


def test_an_open_past_its_deadline_is_not_retried(host):
    before, expired_before = opened(host), expired(host)
    sessions = RemoteSessions(ClientConfig(address=host.address, timeout_seconds=0.3, retry_seconds=5))
    try:
        started = time.monotonic()
        opening = sessions.open("slow", {"sleep": RESET_SECONDS})
        assert time.monotonic() - started < RESET_SECONDS  # it gave up at its deadline, not after retries
    finally:
        sessions.client.close()
    assert (opening.failed, opening.error) == (UNAVAILABLE, "Deadline Exceeded")
    # The service goes on with that one open, and no other: a retry within retry_seconds would have opened more.
    deadline = time.monotonic() + 30
    while opened(host) < before + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(RESET_SECONDS)
    assert opened(host) == before + 1
    # Nobody holds it: the service expires it after limits.idle_timeout_s, which frees its slot.
    while expired(host) < expired_before + 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert expired(host) == expired_before + 1


def test_an_open_refused_for_a_full_service_is_retried_until_a_slot_frees(host):
    client = EnvironmentClient(ClientConfig(address=host.address, timeout_seconds=30))
    sessions = RemoteSessions(ClientConfig(address=host.address, timeout_seconds=30, retry_seconds=30))
    try:
        holder = client.open_episode("slow", {})  # limits.max_episodes is 1: the next open is refused
        before = opened(host)
        closer = threading.Timer(0.5, client.close_episode, args=(holder.episode_id,))
        closer.start()
        opening = sessions.open("slow", {})
        closer.join()
        assert not opening.failed and opening.episode_id
        assert opened(host) == before + 1
        sessions.close(opening.episode_id)
    finally:
        client.close()
        sessions.client.close()
