"""The arithmetic task: files in the reference's math format, a disjoint eval set, answers the boxed verifier takes."""

from __future__ import annotations

import json
import re

import pytest

from zerobubble.reward.extraction import extract_boxed
from zerobubble.reward.math_judge import judge
from zerobubble.rollout.prompting import SYSTEM_PROMPTS
from zerobubble.tooling.tiny.task import (
    all_questions,
    chat_messages,
    make_arithmetic_task,
    read_task,
    target_response,
)


def boxed_accepts(gold: str, response: str) -> bool:
    """The `boxed` verifier's decision, made in-process."""
    extraction = extract_boxed(response)
    return extraction.answer is not None and judge(gold, extraction.answer)[0]


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return make_arithmetic_task(tmp_path_factory.mktemp("task"), seed=0)


def test_files_follow_the_math_format(task):
    train_path, eval_path = task
    train = [json.loads(line) for line in train_path.read_text().splitlines()]
    held_out = [json.loads(line) for line in eval_path.read_text().splitlines()]
    assert len(train) == 150 and len(held_out) == 50
    assert all(set(row) == {"messages", "gt_answer"} for row in train + held_out)
    assert all(isinstance(row["messages"], dict) and row["messages"]["role"] == "user" for row in train)
    assert all(isinstance(row["messages"], list) and row["messages"][0]["role"] == "user" for row in held_out)
    assert all(isinstance(row["gt_answer"], str) for row in train + held_out)


def test_eval_is_disjoint_from_train(task):
    train, held_out = (read_task(path) for path in task)
    train_questions = {row.messages[0]["content"] for row in train}
    eval_questions = {row.messages[0]["content"] for row in held_out}
    assert len(train_questions) == len(train) and len(eval_questions) == len(held_out)
    assert not train_questions & eval_questions


def test_answers_are_the_arithmetic(task):
    for row in read_task(task[0]) + read_task(task[1]):
        question = row.messages[0]["content"]
        left, op, right = re.fullmatch(r"(\d+)([+-])(\d+)=", question).groups()
        assert int(row.gt_answer) == (int(left) + int(right) if op == "+" else int(left) - int(right))


def test_boxed_verifier_accepts_gold_and_refuses_wrong(task):
    rows = read_task(task[0])[:40] + read_task(task[1])[:40]
    for row in rows:
        assert boxed_accepts(row.gt_answer, target_response(row.gt_answer))
        assert boxed_accepts(row.gt_answer, "so " + target_response(row.gt_answer))
        assert not boxed_accepts(row.gt_answer, target_response(str(int(row.gt_answer) + 1)))
        assert not boxed_accepts(row.gt_answer, row.gt_answer)  # no \boxed{}: no answer


def test_same_seed_same_files_other_seed_differs(tmp_path):
    first = make_arithmetic_task(tmp_path / "a", seed=1)
    again = make_arithmetic_task(tmp_path / "b", seed=1)
    other = make_arithmetic_task(tmp_path / "c", seed=2)
    assert [p.read_text() for p in first] == [p.read_text() for p in again]
    assert first[0].read_text() != other[0].read_text()


def test_too_many_questions_is_refused(tmp_path):
    assert len(all_questions(9)) == 200
    with pytest.raises(ValueError, match="distinct questions"):
        make_arithmetic_task(tmp_path, train_size=190, eval_size=20, max_operand=9)


def test_two_digit_additions_have_carries_and_a_held_out_set_of_the_same_kind(tmp_path):
    train, held_out = (read_task(path) for path in make_arithmetic_task(
        tmp_path, train_size=9950, eval_size=50, max_operand=99, operations="+"))
    assert len(all_questions(99, "+")) == 10_000 == len(train) + len(held_out)
    for rows in (train, held_out):
        operands = [re.fullmatch(r"(\d+)\+(\d+)=", row.messages[0]["content"]).groups() for row in rows]
        assert all(int(row.gt_answer) == int(a) + int(b) for row, (a, b) in zip(rows, operands, strict=True))
        carries = sum(int(a) % 10 + int(b) % 10 >= 10 for a, b in operands)
        # About 45% of two-digit sums carry: both sets hold many of each kind.
        assert 0.3 * len(rows) < carries < 0.6 * len(rows)


def test_unknown_operations_are_refused(tmp_path):
    for operations in ("", "*", "+/"):
        with pytest.raises(ValueError, match="operations"):
            make_arithmetic_task(tmp_path, operations=operations)


def test_chat_layout_puts_the_system_prompt_first_or_none(task):
    row = read_task(task[1])[0]
    assert chat_messages(row, SYSTEM_PROMPTS["boxed"]) == [{"role": "system", "content": SYSTEM_PROMPTS["boxed"]},
                                                          *row.messages]
    assert chat_messages(row, "") == row.messages


def test_three_operand_sums_are_worked_left_to_right_and_all_distinct(tmp_path):
    questions = all_questions(9, "+-", operands=3)
    assert len(questions) == len(set(questions)) == 10 ** 3 * 2 ** 2
    answers = dict(questions)
    assert answers["9-4+7="] == "12" and answers["0-9-9="] == "-18" and answers["3+8+6="] == "17"
    # Two operands keep the order (and so the cached files) of the two-operand task.
    assert all_questions(9, "+-", operands=2) == all_questions(9)
    with pytest.raises(ValueError, match="operands"):
        all_questions(9, "+", operands=1)
