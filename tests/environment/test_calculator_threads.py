"""The calculator under many concurrent clients of a real service never answers CPython 3.11's spurious
"SystemError: AST constructor recursion depth mismatch" (python/cpython#106905): parses that interleave across the
service's threads shared one depth counter."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from env_helpers import client_of, start_environment

# Deep and long, so that building its tree allocates enough to let another thread's parse run in between.
_EXPRESSION = "(" * 40 + "+".join(["1"] * 100) + ")" * 40
_TURN = " ".join([f"@calculator({_EXPRESSION})"] * 8)
CLIENTS, EPISODES, STEPS = 32, 3, 4


@pytest.mark.slow
def test_thirty_two_concurrent_clients_never_read_a_spurious_system_error():
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # the service runs in this process: switch threads as often as a busy service does
    host = start_environment(environments=[{"name": "calc", "builtin": "calculator", "tool_format": "compact"}])
    try:
        def play(_: int) -> list[str]:
            answers = []
            with client_of(host) as client:
                for _ in range(EPISODES):
                    episode = client.open_episode("calc", {}).episode_id
                    answers += [client.step_episode(episode, _TURN).observation_json for _ in range(STEPS)]
                    client.close_episode(episode)
            return answers

        with ThreadPoolExecutor(CLIENTS) as pool:
            answers = [answer for answers in pool.map(play, range(CLIENTS)) for answer in answers]
    finally:
        sys.setswitchinterval(interval)
        host.stop(grace=1.0)
    assert len(answers) == CLIENTS * EPISODES * STEPS
    assert not [answer for answer in answers if "SystemError" in answer]
    assert all(answer.count('"content": "100"') == 8 for answer in answers)
