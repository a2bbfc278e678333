"""A TRL reward function scored by the reward service:

    from zerobubble.reward.adapters.trl import TRLReward
    trainer = GRPOTrainer(model=..., reward_funcs=[TRLReward(url="http://HOST:8000")], train_dataset=dataset, ...)

TRL calls it with the batch's prompts and completions and every other dataset column as a keyword (the
ground truth comes from the column `answer_column`, gt_answer by default); it answers one reward per
completion, in order, from one POST /v1/score of the whole batch.
"""

from __future__ import annotations

from typing import Any

from zerobubble.reward.adapters import RewardEndpoint, truth_fields


def _text(completion: Any) -> str:
    """A completion is text, or (conversational datasets) a list of messages whose last is the answer."""
    return completion[-1]["content"] if isinstance(completion, list) else completion


class TRLReward:
    """`reward_funcs` entry for TRL's GRPOTrainer (and its other online trainers). Picklable; its __name__,
    which TRL logs rewards under, is zerobubble_<verifier>."""

    def __init__(self, url: str | None = None, *, verifier: str | None = None, answer_column: str = "gt_answer",
                 token: str | None = None, ca: str | None = None, timeout: float | None = None):
        self.endpoint = RewardEndpoint.from_env(url=url, verifier=verifier, token=token, ca=ca, timeout=timeout)
        self.answer_column = answer_column
        self.__name__ = f"zerobubble_{self.endpoint.verifier}"

    def __call__(self, prompts: list, completions: list, **columns: Any) -> list[float]:
        truths = columns.get(self.answer_column)
        if truths is None:
            raise ValueError(f"the dataset has no column {self.answer_column!r} with the ground truth "
                             f"(columns: {sorted(columns)}); name it with TRLReward(answer_column=...)")
        items = [
            {"id": str(i), "verifier": self.endpoint.verifier, "response": _text(completion), **truth_fields(truth)}
            for i, (completion, truth) in enumerate(zip(completions, truths, strict=True))
        ]
        reply = self.endpoint.post("/v1/score", {"items": items})
        return [result["reward"] for result in reply["results"]]
