"""The math equivalence check that runs inside verification worker processes.

math_verify's own time limits use signal.alarm, which only works on a main thread; workers run
this on their main thread with those limits off, and the pool enforces the time limit by killing.
"""

from __future__ import annotations

import functools
import logging
import re

from math_verify import parse, verify

from zerobubble.reward.extraction import final_boxes

# math_verify warns on every call that its own timeouts are off; the pool enforces them instead.
logging.getLogger("math_verify").setLevel(logging.ERROR)

# An unescaped $, \( or \[, or a \boxed: the text says itself where its math is.
_DELIMITED = re.compile(r"(?<!\\)\$|\\\(|\\\[|\\boxed")


def _delimited(text: str) -> bool:
    return _DELIMITED.search(text) is not None


def wrap_gold(gold: str) -> str:
    """Bare LaTeX often does not parse: wrap the gold in $...$ unless it is already delimited."""
    gold = gold.strip()
    return gold if _delimited(gold) else f"${gold}$"


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str):
    # Every response of a group shares one gold answer: parse it once.
    return parse(wrap_gold(gold), parsing_timeout=None)


def _has_math(parsed: list) -> bool:
    # parse() falls back to the raw string when it finds no expression.
    return any(not isinstance(item, str) for item in parsed)


def judge(gold: str, answer: str) -> tuple[bool, str]:
    """(answer equals gold, reason). The reason is "parse_error" when either side yields no math."""
    gold_parsed = _parse_gold(gold)
    if not gold_parsed:
        return False, "parse_error"
    # Read bare, "4\\sqrt{2}" would yield only its first number, so the answer is read as a boxed
    # expression, then as inline LaTeX; one with its own delimiters (e.g. "$2,3$" inside <answer> tags)
    # is first read as written. One with boxes of its own ("\\boxed{1}, \\boxed{-2}") is read only as
    # written: boxed again, math_verify would read its last box alone.
    if final_boxes(answer):
        readings = [answer]
    elif _delimited(answer):
        readings = [answer, f"\\boxed{{{answer}}}"]
    else:
        readings = [f"\\boxed{{{answer}}}", f"${answer}$"]
    answer_has_math = False
    for reading in readings:
        predicted = parse(reading, parsing_timeout=None)
        answer_has_math = answer_has_math or _has_math(predicted)
        if predicted and verify(gold_parsed, predicted, timeout_seconds=None):
            return True, ""
    return False, "" if answer_has_math and _has_math(gold_parsed) else "parse_error"
