"""Training prompts: the JSONL file, validated once at start, and a seeded order per epoch."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zerobubble.common.config import ConfigError
from zerobubble.v1 import common_pb2


class PromptFileError(ConfigError):
    """The prompt file cannot be used; the message names the line and the field."""


@dataclass(frozen=True)
class PromptRow:
    prompt_id: str
    messages_json: str
    gt_answer: str | None = None
    test_inputs: tuple[str, ...] = ()
    test_outputs: tuple[str, ...] = ()

    def to_message(self, epoch: int) -> common_pb2.Prompt:
        prompt = common_pb2.Prompt(prompt_id=self.prompt_id, epoch=epoch, messages_json=self.messages_json)
        if self.gt_answer is not None:
            prompt.gt_answer = self.gt_answer
        else:
            prompt.test_cases.inputs.extend(self.test_inputs)
            prompt.test_cases.outputs.extend(self.test_outputs)
        return prompt


def _messages(value: Any) -> list[dict[str, str]]:
    items = [value] if isinstance(value, dict) else value
    if not isinstance(items, list) or not items:
        raise PromptFileError("messages: expected a {role, content} object or a non-empty list of them")
    for i, item in enumerate(items):
        where = f"messages[{i}]" if isinstance(value, list) else "messages"
        if not isinstance(item, dict):
            raise PromptFileError(f"{where}: expected an object with role and content")
        for key in ("role", "content"):
            if not isinstance(item.get(key), str):
                raise PromptFileError(f"{where}.{key}: expected a string")
    return items


def _strings(value: Any, field: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PromptFileError(f"{field}: expected a list of strings")
    return tuple(value)


def parse_row(row: Any, index: int) -> PromptRow:
    """One decoded JSONL row -> PromptRow; `id` names the prompt when present, else its row number."""
    if not isinstance(row, dict):
        raise PromptFileError("expected a JSON object")
    raw_id = row.get("id", index)
    if not isinstance(raw_id, str | int) or isinstance(raw_id, bool) or str(raw_id) == "":
        raise PromptFileError("id: expected a non-empty string or an integer")
    messages_json = json.dumps(_messages(row.get("messages")), ensure_ascii=False)
    has_answer, has_tests = "gt_answer" in row, "test_cases" in row
    if has_answer == has_tests:
        raise PromptFileError("expected exactly one of gt_answer (math) and test_cases (code)")
    if has_answer:
        answer = row["gt_answer"]
        if not isinstance(answer, str | int | float) or isinstance(answer, bool):
            raise PromptFileError("gt_answer: expected a string or a number")
        return PromptRow(str(raw_id), messages_json, gt_answer=str(answer))
    tests = row["test_cases"]
    if not isinstance(tests, dict):
        raise PromptFileError("test_cases: expected an object with inputs and outputs")
    inputs = _strings(tests.get("inputs"), "test_cases.inputs")
    outputs = _strings(tests.get("outputs"), "test_cases.outputs")
    if len(inputs) != len(outputs) or not inputs:
        raise PromptFileError(f"test_cases: expected as many outputs as inputs (at least one), "
                              f"got {len(inputs)} inputs and {len(outputs)} outputs")
    return PromptRow(str(raw_id), messages_json, test_inputs=inputs, test_outputs=outputs)


class PromptSource:
    """All prompts of the training file, addressed by position or by prompt id."""

    def __init__(self, rows: list[PromptRow], *, seed: int = 0, shuffle: bool = True):
        if not rows:
            raise PromptFileError("no prompts")
        self.rows = rows
        self.seed = seed
        self.shuffle = shuffle
        self.index_of: dict[str, int] = {}
        for i, row in enumerate(rows):
            if row.prompt_id in self.index_of:
                raise PromptFileError(f"id: {row.prompt_id!r} appears more than once")
            self.index_of[row.prompt_id] = i

    @classmethod
    def load(cls, path: Path, *, seed: int = 0, shuffle: bool = True) -> PromptSource:
        rows: list[PromptRow] = []
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise PromptFileError(f"{path}: cannot read: {exc}") from None
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                rows.append(parse_row(json.loads(line), len(rows)))
            except json.JSONDecodeError as exc:
                raise PromptFileError(f"{path} line {number}: not JSON: {exc}") from None
            except PromptFileError as exc:
                raise PromptFileError(f"{path} line {number}: {exc}") from None
        try:
            return cls(rows, seed=seed, shuffle=shuffle)
        except PromptFileError as exc:
            raise PromptFileError(f"{path}: {exc}") from None

    @property
    def fingerprint(self) -> str:
        """Names the prompt set: a log written for other prompts must not be replayed against these."""
        return hashlib.sha256("\n".join(row.prompt_id for row in self.rows).encode()).hexdigest()[:16]

    def __len__(self) -> int:
        return len(self.rows)

    def order(self, epoch: int) -> np.ndarray:
        """Positions of the prompts in the order epoch `epoch` hands them out (the same after a restart)."""
        if not self.shuffle:
            return np.arange(len(self.rows))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.rows))
