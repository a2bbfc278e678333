"""A synthetic arithmetic task small enough for a 1-5M parameter byte-level model to learn in minutes.

Questions are short additions and subtractions of small numbers ("12+7=", "5-9=", "3+8+6="), worked left to
right; the answer is the integer, written by the model as \\boxed{19} and checked by the `boxed` verifier. Files
follow the math format of the reference: one JSON object per line with `messages` and `gt_answer`.
"""

from __future__ import annotations

import itertools
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

# Two single-digit operands: 200 distinct questions, learnable by a 1M-parameter model in a few hundred steps.
DEFAULT_MAX_OPERAND = 9
DEFAULT_OPERATIONS = "+-"
DEFAULT_OPERANDS = 2
OPERATIONS = {"+": int.__add__, "-": int.__sub__}
DEFAULT_TRAIN_SIZE = 150
DEFAULT_EVAL_SIZE = 50


@dataclass(frozen=True)
class TaskRow:
    messages: list[dict[str, str]]
    gt_answer: str


def all_questions(max_operand: int, operations: str = DEFAULT_OPERATIONS,
                  operands: int = DEFAULT_OPERANDS) -> list[tuple[str, str]]:
    """Every (question, answer) of `operands` numbers in [0, max_operand] joined by operators of `operations`,
    in a fixed order."""
    unknown = set(operations) - set(OPERATIONS)
    if not operations or unknown:
        raise ValueError(f"operations {operations!r}: give one or more of {''.join(OPERATIONS)}")
    if operands < 2:
        raise ValueError(f"operands {operands}: a question needs at least 2")
    questions = []
    for numbers in itertools.product(range(max_operand + 1), repeat=operands):
        for operators in itertools.product(dict.fromkeys(operations), repeat=operands - 1):
            value, text = numbers[0], str(numbers[0])
            for operator, number in zip(operators, numbers[1:], strict=True):
                value, text = OPERATIONS[operator](value, number), f"{text}{operator}{number}"
            questions.append((f"{text}=", str(value)))
    return questions


def make_arithmetic_task(
    out_dir: Path,
    *,
    train_size: int = DEFAULT_TRAIN_SIZE,
    eval_size: int = DEFAULT_EVAL_SIZE,
    seed: int = 0,
    max_operand: int = DEFAULT_MAX_OPERAND,
    operations: str = DEFAULT_OPERATIONS,
    operands: int = DEFAULT_OPERANDS,
) -> tuple[Path, Path]:
    """Write train.jsonl and a held-out eval.jsonl (no question in both); return their paths.

    Train rows carry `messages` as one object, eval rows as a one-element list: readers must take both.
    """
    questions = all_questions(max_operand, operations, operands)
    if train_size + eval_size > len(questions):
        raise ValueError(
            f"train_size + eval_size = {train_size + eval_size} exceeds the {len(questions)} distinct questions "
            f"of {operands} operands up to {max_operand} and operations {operations!r}"
        )
    random.Random(seed).shuffle(questions)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    train_path, eval_path = out_dir / "train.jsonl", out_dir / "eval.jsonl"
    with train_path.open("w") as train:
        for question, answer in questions[:train_size]:
            train.write(json.dumps({"messages": {"role": "user", "content": question}, "gt_answer": answer}) + "\n")
    with eval_path.open("w") as held_out:
        for question, answer in questions[train_size : train_size + eval_size]:
            row = {"messages": [{"role": "user", "content": question}], "gt_answer": answer}
            held_out.write(json.dumps(row) + "\n")
    return train_path, eval_path


def read_task(path: Path) -> list[TaskRow]:
    """Rows of a math JSONL file, `messages` always as a list."""
    rows = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            messages = record["messages"]
            rows.append(TaskRow(messages=[messages] if isinstance(messages, dict) else messages,
                                gt_answer=str(record["gt_answer"])))
    return rows


def chat_messages(row: TaskRow, system_prompt: str) -> list[dict[str, str]]:
    """The conversation the rollout worker sends: its system prompt for the verifier (if any), then the row's."""
    return [{"role": "system", "content": system_prompt}, *row.messages] if system_prompt else list(row.messages)


def target_response(gt_answer: str, filler: int = 0) -> str:
    """What a correct, well-formed answer looks like (the end-of-turn token follows it), after `filler` dots."""
    return "." * filler + f"\\boxed{{{gt_answer}}}"


def filler_lengths(count: int, longest: int, seed: int) -> list[int]:
    """Lengths of the filler before each row's answer, spread as real answers' lengths are (log-normal: many
    short, a long tail), cut at `longest`; the median is about a sixth of it."""
    if longest == 0:
        return [0] * count
    rng = random.Random(seed)
    median = max(1.0, longest / 6)
    return [min(longest, int(rng.lognormvariate(math.log(median), 0.9))) for _ in range(count)]
