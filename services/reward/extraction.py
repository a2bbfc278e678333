"""Answer extraction and format rules, as the reference (Colossal-RL) defines them (DESIGN.md 5)."""

from __future__ import annotations

import re
from dataclasses import dataclass

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_THINK_ANSWER_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_PYTHON_BLOCK = re.compile(r"```python[^\n]*\n(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class Extraction:
    format_ok: bool
    answer: str | None


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...}, braces matched, so \\boxed{\\frac{1}{2}} gives \\frac{1}{2}."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    for start in reversed(starts):
        depth = 1
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i].strip()
    return None


def extract_boxed(response: str) -> Extraction:
    """`boxed`: the format is met when a complete \\boxed{} is present."""
    answer = last_boxed(response)
    return Extraction(format_ok=answer is not None, answer=answer)


def extract_think_answer(response: str) -> Extraction:
    """`think_answer_tags`: answer = last <answer>...</answer>; format ok when each of the four tags
    appears exactly once, in order, and the text ends with </answer>."""
    found = _ANSWER.findall(response)
    answer = found[-1].strip() if found else None
    positions = [response.find(tag) for tag in _THINK_ANSWER_TAGS]
    once = all(response.count(tag) == 1 for tag in _THINK_ANSWER_TAGS)
    in_order = once and positions == sorted(positions)
    format_ok = in_order and response.rstrip().endswith("</answer>")
    return Extraction(format_ok=format_ok, answer=answer)


def extract_python(response: str) -> Extraction:
    """`code`: the last ```python fenced block."""
    blocks = _PYTHON_BLOCK.findall(response)
    return Extraction(format_ok=bool(blocks), answer=blocks[-1] if blocks else None)
