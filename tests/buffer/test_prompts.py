"""The prompt file: both data formats, errors that name line and field, a seeded order per epoch."""

from __future__ import annotations

import json

import numpy as np
import pytest
from buffer_helpers import write_prompts

from zerobubble.buffer.prompts import PromptFileError, PromptSource


def test_loads_math_and_code_rows(tmp_path):
    source = PromptSource.load(write_prompts(tmp_path / "p.jsonl", 4))
    assert len(source) == 4
    math, code = source.rows[0].to_message(epoch=2), source.rows[1].to_message(epoch=2)
    assert math.gt_answer == "1" and math.epoch == 2
    assert json.loads(math.messages_json) == [{"role": "user", "content": "What is 0 + 1?"}]
    assert list(code.test_cases.inputs) == ["1\n"] and list(code.test_cases.outputs) == ["2\n"]
    assert code.WhichOneof("ground_truth") == "test_cases"


def test_explicit_ids_name_prompts(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": "gsm-7", "messages": {"role": "user", "content": "x"}, "gt_answer": 3}\n\n')
    source = PromptSource.load(path)
    assert source.index_of == {"gsm-7": 0}
    assert source.rows[0].gt_answer == "3"


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ('{"messages": [], "gt_answer": "1"}', "line 2: messages: expected"),
        ('{"messages": [{"role": "user"}], "gt_answer": "1"}', "line 2: messages[0].content: expected a string"),
        ('{"messages": {"role": "user", "content": "x"}}', "line 2: no ground truth: expected gt_answer"),
        ('{"messages": {"role": "user", "content": "x"}, "test_cases": {"inputs": ["1"], "outputs": []}}',
         "line 2: test_cases: expected as many outputs as inputs"),
        ('{"messages": {"role": "user", "content": "x"}, "test_cases": {"inputs": [1], "outputs": ["1"]}}',
         "line 2: test_cases.inputs: expected a list of strings"),
        # A null is no value, as in a parquet column where the row has none.
        ('{"messages": {"role": "user", "content": "x"}, "gt_answer": null}', "line 2: no ground truth"),
        ('{"messages": {"role": "user", "content": "x"}, "gt_answer": [1]}', "line 2: gt_answer: expected"),
        ('{"messages": {"role": "user", "content": "x"}, "gt_answer": "1", "test_cases": {}}',
         "line 2: expected exactly one of gt_answer"),
        ("[1, 2]", "line 2: expected a JSON object"),
        ("{not json", "line 2: not JSON"),
        ('{"id": 0, "messages": {"role": "user", "content": "x"}, "gt_answer": "1"}', "'0' appears more than once"),
    ],
)
def test_bad_rows_are_refused_naming_line_and_field(tmp_path, row, message):
    path = tmp_path / "p.jsonl"
    path.write_text('{"messages": {"role": "user", "content": "ok"}, "gt_answer": "1"}\n' + row + "\n")
    with pytest.raises(PromptFileError, match=message.replace("[", r"\[").replace("]", r"\]")):
        PromptSource.load(path)


def test_missing_and_empty_files_are_refused(tmp_path):
    with pytest.raises(PromptFileError, match="cannot read"):
        PromptSource.load(tmp_path / "absent.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(PromptFileError, match="no prompts"):
        PromptSource.load(tmp_path / "empty.jsonl")


def test_order_is_a_seeded_permutation_per_epoch(tmp_path):
    path = write_prompts(tmp_path / "p.jsonl", 50)
    first, again = PromptSource.load(path, seed=3), PromptSource.load(path, seed=3)
    assert sorted(first.order(0)) == list(range(50))
    assert np.array_equal(first.order(0), again.order(0))
    assert not np.array_equal(first.order(0), first.order(1))
    assert not np.array_equal(first.order(0), PromptSource.load(path, seed=4).order(0))
    assert list(PromptSource.load(path, shuffle=False).order(5)) == list(range(50))
