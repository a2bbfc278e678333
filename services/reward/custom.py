"""Custom verifiers: a callable the user brings, `function(response, ground_truth, metadata)`, returning a number
(the reward) or a dict {reward, answer_ok, format_ok, extracted_answer}.

The callable runs in the verification workers (math_pool.py): `call_custom` and common/user_code.py's
`import_callable` run there, `CustomVerifier` in the server. Whatever the callable does (hang, raise, exit, return
garbage) becomes the item's `reason`, and the service goes on.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

from zerobubble.common.user_code import shown
from zerobubble.reward.config import CustomVerifierConfig, RewardValues
from zerobubble.reward.math_pool import CustomSpec, VerifierPool
from zerobubble.reward.verifiers import ScoreItem, Verdict

_RESULT_KEYS = ("reward", "answer_ok", "format_ok", "extracted_answer")


def _bad(why: str) -> tuple:
    return 0.0, False, False, "", f"bad_result: {why}"


def _number(value: Any) -> float | None:
    """`value` as a finite float, or None."""
    if not isinstance(value, numbers.Real):
        return None
    try:
        number = float(value)
    except Exception:  # noqa: BLE001 - a Real whose float() fails is no number
        return None
    return number if math.isfinite(number) else None


def _normalised(value: Any, max_extracted_bytes: int) -> tuple:
    """(reward, answer_ok | None, format_ok | None, extracted_answer, reason) from what the callable returned."""
    if not isinstance(value, dict):
        reward = _number(value)
        if reward is None:
            kind = "not finite" if isinstance(value, numbers.Real) else f"a {type(value).__name__}"
            return _bad(f"expected a finite number or a dict with 'reward', got {kind}")
        return reward, None, None, "", ""
    unknown = [key for key in value if key not in _RESULT_KEYS]
    if unknown:
        return _bad(f"unknown keys {shown(unknown[:3])}{' and more' if len(unknown) > 3 else ''} "
                    f"(expected {', '.join(_RESULT_KEYS)})")
    reward = _number(value.get("reward"))
    if reward is None:
        return _bad("'reward' must be a finite number")
    flags = []
    for key in ("answer_ok", "format_ok"):
        flag = value.get(key)
        if flag is not None and not isinstance(flag, bool):
            return _bad(f"{key!r} must be true or false, got a {type(flag).__name__}")
        flags.append(flag)
    extracted = value.get("extracted_answer", "")
    if not isinstance(extracted, str):
        return _bad(f"'extracted_answer' must be a string, got a {type(extracted).__name__}")
    size = len(extracted.encode(errors="replace"))
    if size > max_extracted_bytes:
        return _bad(f"'extracted_answer' has {size} bytes, over limits.max_answer_bytes={max_extracted_bytes}")
    return reward, *flags, extracted, ""


def call_custom(function: Callable, response: str, ground_truth: Any, metadata: dict | None,
                max_extracted_bytes: int) -> tuple:
    """Call it and check what it returned; in a worker process."""
    try:
        value = function(response, ground_truth, metadata or {})
    except BaseException as exc:  # noqa: BLE001 - sys.exit and KeyboardInterrupt are the callable's failures too
        return 0.0, False, False, "", f"verifier_error: {type(exc).__name__}: {shown(exc)}"
    try:
        return _normalised(value, max_extracted_bytes)
    except BaseException as exc:  # noqa: BLE001 - a dict or number subclass that fails when read
        return _bad(f"reading it raised {type(exc).__name__}: {shown(exc)}")


def custom_specs(configs: list[CustomVerifierConfig]) -> list[CustomSpec]:
    return [CustomSpec(c.name, c.function, None if c.path is None else str(c.path), f"custom_verifiers[{i}].function")
            for i, c in enumerate(configs)]


class CustomVerifier:
    """The server side of a custom verifier: hands the item to the pool and turns its reply into a Verdict. A
    bare number is the reward, answer_ok when it reaches rewards.correct, format_ok always."""

    lane = "math"

    def __init__(self, config: CustomVerifierConfig, pool: VerifierPool, rewards: RewardValues):
        self.name = config.name
        self.description = config.description or f"custom: {config.function}"
        self.ground_truth = config.ground_truth
        self._pool = pool
        self._rewards = rewards

    def _ground_truth(self, item: ScoreItem) -> Any:
        if self.ground_truth == "gt_answer":
            return item.gt_answer
        if self.ground_truth == "test_cases":
            return {"inputs": list(item.test_inputs or ()), "outputs": list(item.test_outputs or ())}
        return None

    def check(self, item: ScoreItem) -> Verdict:
        result = self._pool.custom(self.name, item.response, self._ground_truth(item), item.metadata)
        answer_ok = result.reward >= self._rewards.correct if result.answer_ok is None else result.answer_ok
        return Verdict(
            format_ok=True if result.format_ok is None else result.format_ok,
            answer_ok=answer_ok and not result.reason,
            extracted=result.extracted,
            reason=result.reason,
            fraction=float(answer_ok),
            # A callable that failed earns what a wrong answer does.
            reward=self._rewards.wrong if result.reason else result.reward,
        )
