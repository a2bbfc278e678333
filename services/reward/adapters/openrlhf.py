"""OpenRLHF's reward function file, scored by the reward service's /get_reward:

    --reward.remote_url $(python -c "import zerobubble.reward.adapters.openrlhf as m; print(m.__file__)")

OpenRLHF (0.11.2) loads a `--reward.remote_url` ending in .py as a file and calls its
reward_func(queries, prompts, labels) in a thread. Beside pointing --reward.remote_url at
http://HOST:PORT/get_reward, this file adds what OpenRLHF's own HTTP client lacks: the bearer token,
a CA for https, and a deadline of its own. Settings come from the environment (see the package's doc).
"""

from __future__ import annotations

from typing import Any

from zerobubble.reward.adapters import RewardEndpoint


def reward_func(queries: list[str], prompts: list[str], labels: list[Any], **_unused: Any) -> dict:
    """{"rewards", "scores", "extra_logs"} for each query (prompt + response) against its label."""
    endpoint = RewardEndpoint.from_env()
    return endpoint.post("/get_reward", {"query": list(queries), "prompts": list(prompts), "labels": list(labels)},
                         verifier=endpoint.verifier)
