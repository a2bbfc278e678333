"""The built-in verifiers. Each turns one response and its ground truth into a Verdict."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zerobubble.common.sandbox.runner import CodeSandbox
from zerobubble.reward.config import RewardValues
from zerobubble.reward.extraction import extract_boxed, extract_python, extract_think_answer
from zerobubble.reward.math_pool import VerifierPool


@dataclass(frozen=True)
class ScoreItem:
    """One request to score, as the core sees it (no protobuf here)."""

    verifier: str
    response: str
    gt_answer: str | None = None
    test_inputs: list[str] | None = None
    test_outputs: list[str] | None = None
    partial_credit: bool = False
    id: str = ""
    prompt: str = ""
    metadata: dict[str, Any] | None = None


@dataclass(frozen=True)
class Verdict:
    format_ok: bool
    answer_ok: bool
    extracted: str = ""
    reason: str = ""
    fraction: float = 0.0   # share of tests passed (code) or 1/0 (math)
    tests_passed: int = 0
    tests_total: int = 0
    reward: float | None = None   # set by verifiers that price their own verdict (custom, reward model)


def price(verdict: Verdict, rewards: RewardValues, partial_credit: bool) -> float:
    """The verdict's reward: its own when it has one, else rewards.correct/wrong. Format never adds reward (as
    in the reference); code with partial credit pays per test."""
    if verdict.reward is not None:
        return verdict.reward
    share = verdict.fraction if partial_credit else float(verdict.answer_ok)
    return rewards.wrong + (rewards.correct - rewards.wrong) * share


class MathVerifier:
    """Extract the final answer, then ask math_verify (in the worker pool) if it equals the gold."""

    ground_truth = "gt_answer"
    lane = "math"

    def __init__(self, name: str, description: str, extract, pool: VerifierPool):
        self.name = name
        self.description = description
        self._extract = extract
        self._pool = pool

    def check(self, item: ScoreItem) -> Verdict:
        extraction = self._extract(item.response)
        if extraction.answer is None:
            return Verdict(format_ok=extraction.format_ok, answer_ok=False, reason="no_answer")
        verdict = self._pool.verify(item.gt_answer, extraction.answer)
        return Verdict(
            format_ok=extraction.format_ok,
            answer_ok=verdict.answer_ok,
            extracted=extraction.answer,
            reason=verdict.reason,
            fraction=float(verdict.answer_ok),
        )


def boxed_verifier(pool: VerifierPool) -> MathVerifier:
    return MathVerifier("boxed", "math answer in the last \\boxed{...}", extract_boxed, pool)


def think_answer_verifier(pool: VerifierPool) -> MathVerifier:
    return MathVerifier(
        "think_answer_tags",
        "math answer in the last <answer>...</answer>; format: <think></think><answer></answer> once each",
        extract_think_answer,
        pool,
    )


class CodeVerifier:
    """Run the last ```python block against stdin/stdout tests in the sandbox."""

    name = "code"
    description = "python program in the last ```python block, run on stdin/stdout tests in a sandbox"
    ground_truth = "test_cases"
    lane = "code"

    def __init__(self, sandbox: CodeSandbox):
        self.sandbox = sandbox

    def check(self, item: ScoreItem) -> Verdict:
        extraction = extract_python(item.response)
        total = len(item.test_inputs or [])
        if extraction.answer is None:
            return Verdict(format_ok=False, answer_ok=False, reason="no_answer", tests_total=total)
        report = self.sandbox.run_tests(
            extraction.answer,
            item.test_inputs,
            item.test_outputs,
            stop_at_first_failure=not item.partial_credit,
        )
        all_passed = report.passed == report.total
        return Verdict(
            format_ok=True,
            answer_ok=all_passed,
            extracted=extraction.answer,
            reason="" if all_passed else report.status,
            fraction=report.passed / report.total,
            tests_passed=report.passed,
            tests_total=report.total,
        )
