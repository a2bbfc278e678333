"""Combined verifiers: a weighted sum of other verifiers' rewards (config `combined_verifiers`)."""

from __future__ import annotations

import dataclasses

from zerobubble.reward.config import CombinedVerifierConfig, RewardValues
from zerobubble.reward.verifiers import ScoreItem, Verdict, price


class CombinedVerifier:
    """reward = sum of weight x each part's reward (priced as that part alone would be). answer_ok and format_ok
    hold when they hold for every part; the reason is the first part's that has one, named by its part; the
    extracted answer is the first part's that has one."""

    lane = "combined"

    def __init__(self, config: CombinedVerifierConfig, verifiers: dict, ground_truth: str, rewards: RewardValues):
        self.name = config.name
        self.description = config.description or "weighted sum: " + " + ".join(
            f"{part.weight:g} x {part.verifier}" for part in config.parts)
        self.ground_truth = ground_truth
        self.parts = [(verifiers[part.verifier], part.weight) for part in config.parts]
        self._rewards = rewards

    def check(self, item: ScoreItem) -> Verdict:
        reward, verdicts = 0.0, []
        for verifier, weight in self.parts:
            verdict = verifier.check(dataclasses.replace(item, verifier=verifier.name))
            reward += weight * price(verdict, self._rewards, item.partial_credit)
            verdicts.append((verifier.name, verdict))
        answer_ok = all(verdict.answer_ok for _, verdict in verdicts)
        return Verdict(
            format_ok=all(verdict.format_ok for _, verdict in verdicts),
            answer_ok=answer_ok,
            extracted=next((verdict.extracted for _, verdict in verdicts if verdict.extracted), ""),
            reason=next((f"{name}: {verdict.reason}" for name, verdict in verdicts if verdict.reason), ""),
            fraction=float(answer_ok),
            tests_passed=sum(verdict.tests_passed for _, verdict in verdicts),
            tests_total=sum(verdict.tests_total for _, verdict in verdicts),
            reward=reward,
        )
