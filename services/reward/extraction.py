"""Answer extraction and format rules, as the reference (Colossal-RL) defines them (DESIGN.md 5)."""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_THINK_ANSWER_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_PYTHON_BLOCK = re.compile(r"```python[^\n]*\n(.*?)```", re.DOTALL)
_BRACE = re.compile(r"[{}]")
_MATH_DELIMITER = re.compile(r"(?<!\\)\$\$|(?<!\\)\$|\\\(|\\\)|\\\[|\\\]")
_CLOSERS = {"$$": "$$", "$": "$", "\\(": "\\)", "\\[": "\\]"}
# What may stand between two boxes of one answer outside math: ", ", " and ", ", or ", LaTeX spacing.
_JOINER = re.compile(r"(?:\s|[,;]|\band\b|\bor\b|\\(?:q?quad\b|[,;:! ])|\\text\s*\{\s*(?:and|or)?\s*\})*")


@dataclass(frozen=True)
class Extraction:
    format_ok: bool
    answer: str | None


def _boxes(text: str) -> list[tuple[int, int, int]]:
    """(start, content start, end past the closing brace) of every complete \\boxed{...}, by start, in one
    pass over the braces (a response may hold thousands of unclosed boxes)."""
    box_at = {match.end() - 1: match.start() for match in _BOXED.finditer(text)}
    found, open_boxes, depth = [], [], 0
    for brace in _BRACE.finditer(text):
        position = brace.start()
        if brace.group() == "{":
            depth += 1
            if position in box_at:
                open_boxes.append((box_at[position], position + 1, depth))
        else:
            if open_boxes and open_boxes[-1][2] == depth:
                start, content, _ = open_boxes.pop()
                found.append((start, content, position + 1))
            depth -= 1
    return sorted(found)


def _math_spans(text: str) -> list[tuple[int, int]]:
    """Where $...$, $$...$$, \\(...\\) and \\[...\\] enclose math; one left open runs to the end."""
    spans, opened, closer = [], 0, None
    for match in _MATH_DELIMITER.finditer(text):
        token = match.group()
        if closer is None and token in _CLOSERS:
            opened, closer = match.start(), _CLOSERS[token]
        elif token == closer:
            spans.append((opened, match.end()))
            closer = None
    if closer is not None:
        spans.append((opened, len(text)))
    return spans


def _joins(text: str, start: int, end: int, spans: list[tuple[int, int]]) -> bool:
    """Whether text[start:end], the stretch between two boxes, ties them into one answer: outside math it
    holds only commas, 'and', 'or' and spacing; inside math anything goes, as math_verify reads every box
    of one math environment."""
    outside, cursor = [], start
    # Spans do not overlap: only the last one opened before `start` can reach into the stretch.
    first = max(0, bisect.bisect_right(spans, (start, len(text))) - 1)
    for span_start, span_end in spans[first:]:
        if span_start >= end:
            break
        if span_end > cursor:
            outside.append(text[cursor:max(cursor, span_start)])
            cursor = min(end, span_end)
    outside.append(text[cursor:end])
    return all(_JOINER.fullmatch(part) for part in outside)


def final_boxes(text: str) -> list[str]:
    """Contents of the last complete \\boxed{...} (braces matched) and of the boxes joined to it, in order:
    `\\boxed{(1,2)}, \\boxed{(2,1)}` or `\\(\\boxed{1}\\) and \\(\\boxed{-2}\\)` answer with both boxes."""
    boxes = _boxes(text)
    if not boxes:
        return []
    spans = _math_spans(text)
    run = [boxes[-1]]
    for box in reversed(boxes[:-1]):
        if box[2] > run[-1][0] or not _joins(text, box[2], run[-1][0], spans):
            break
        run.append(box)
    return [text[content:end - 1].strip() for _, content, end in reversed(run)]


def last_boxed(text: str) -> str | None:
    """Content of the last complete \\boxed{...}, so \\boxed{\\frac{1}{2}} gives \\frac{1}{2}."""
    boxes = final_boxes(text)
    return boxes[-1] if boxes else None


def extract_boxed(response: str) -> Extraction:
    """`boxed`: the format is met when a complete \\boxed{} is present. Several boxes joined into one
    answer are handed on as `\\boxed{a}, \\boxed{b}`, which math_verify reads as the set of them."""
    boxes = final_boxes(response)
    if len(boxes) > 1:
        return Extraction(format_ok=True, answer=", ".join(f"\\boxed{{{box}}}" for box in boxes))
    return Extraction(format_ok=bool(boxes), answer=boxes[0] if boxes else None)


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
