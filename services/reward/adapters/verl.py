"""verl's custom reward function, scored by the reward service. In verl's config:

    custom_reward_function:
      path: pkg://zerobubble.reward.adapters.verl
      name: compute_score
      reward_kwargs: {url: "http://HOST:8000", verifier: boxed}   # optional; else the environment

verl calls it once per response with data_source, solution_str, ground_truth and extra_info (and, with a
reward model router, more keywords it does not read); `score` is the reward, `acc`, `format_ok` and `pred`
(the extracted answer, which verl's majority-vote metrics read) go to verl's reward_extra_info.
"""

from __future__ import annotations

from typing import Any

from zerobubble.reward.adapters import RewardEndpoint, truth_fields


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, *,
                  url: str | None = None, verifier: str | None = None, timeout: float | None = None,
                  **_router: Any) -> dict:
    endpoint = RewardEndpoint.from_env(url=url, verifier=verifier, timeout=timeout)
    result = endpoint.post("/v1/score", {"verifier": endpoint.verifier, "response": solution_str,
                                         **truth_fields(ground_truth)})
    return {"score": result["reward"], "acc": float(result["answer_ok"]), "format_ok": float(result["format_ok"]),
            "pred": result["extracted_answer"]}
