"""The warm start's filler before the answer: lengths spread log-normally up to the limit, and the answer still
scored as the boxed verifier scores it."""

from __future__ import annotations

import statistics

from transformers import AutoTokenizer

from zerobubble.tooling.tiny.model import make_tiny_model
from zerobubble.tooling.tiny.task import TaskRow, filler_lengths, target_response
from zerobubble.tooling.tiny.warm_start import encode_examples


def test_filler_lengths_are_uneven_bounded_and_seeded():
    lengths = filler_lengths(2000, 232, seed=0)
    assert lengths == filler_lengths(2000, 232, seed=0) != filler_lengths(2000, 232, seed=1)
    assert min(lengths) >= 0 and max(lengths) == 232, "the long tail reaches the limit"
    assert 25 <= statistics.median(lengths) <= 55, "about a sixth of the limit"
    assert sum(n < 20 for n in lengths) > 100 and sum(n > 150 for n in lengths) > 20
    assert filler_lengths(5, 0, seed=0) == [0] * 5


def test_warm_start_targets_carry_their_rows_filler_before_the_answer(tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(make_tiny_model(tmp_path, size="1m"))
    rows = [TaskRow([{"role": "user", "content": "1+2="}], "3"), TaskRow([{"role": "user", "content": "2+2="}], "4")]
    examples = encode_examples(tokenizer, rows, "", fillers=[0, 7])
    assert tokenizer.decode(examples[0].response_ids, skip_special_tokens=True) == target_response("3")
    assert tokenizer.decode(examples[1].response_ids, skip_special_tokens=True) == "......." + "\\boxed{4}"
    assert len(examples[1].response_ids) == len(examples[0].response_ids) + 7
