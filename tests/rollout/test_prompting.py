"""Prompt building (chat template, system prompt, truncation that keeps the template) and annealing."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from zerobubble.common.run_spec import SamplingSchedule
from zerobubble.rollout.prompting import SYSTEM_PROMPTS, PromptBuilder, PromptTooLong
from zerobubble.tooling.tiny.model import make_tiny_model


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return AutoTokenizer.from_pretrained(make_tiny_model(tmp_path_factory.mktemp("tok"), size="1m"))


def test_system_prompt_and_generation_header_are_added(tokenizer):
    builder = PromptBuilder(tokenizer, SYSTEM_PROMPTS["boxed"], 512)
    text = tokenizer.decode(builder.build(json.dumps({"role": "user", "content": "2+3="})))
    assert text.index("\\boxed{}") < text.index("2+3=")
    assert text.endswith("<|im_start|>assistant\n")
    own = builder.build(json.dumps([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "x"}]))
    assert "boxed" not in tokenizer.decode(own), "a prompt's own system message wins"


def test_long_prompts_lose_the_start_of_their_content_not_the_template(tokenizer):
    builder = PromptBuilder(tokenizer, SYSTEM_PROMPTS["boxed"], 120)
    content = "".join(f"word{i} " for i in range(200)) + "THE QUESTION"
    ids = builder.build(json.dumps([{"role": "user", "content": content}]))
    text = tokenizer.decode(ids)
    assert len(ids) <= 120
    assert text.endswith("THE QUESTION<|im_end|>\n<|im_start|>assistant\n")
    assert "word0 " not in text and text.startswith("<|im_start|>system\n")
    with pytest.raises(PromptTooLong, match="max_prompt_tokens=10"):
        PromptBuilder(tokenizer, SYSTEM_PROMPTS["boxed"], 10).build(json.dumps({"role": "user", "content": content}))


def test_temperature_anneals_over_the_first_epoch_only():
    schedule = SamplingSchedule(temperature=1.2, temperature_annealing=True, annealed_temperature=0.9)
    assert schedule.temperature_at(0, 0.0) == pytest.approx(1.2)
    assert schedule.temperature_at(0, 0.5) == pytest.approx(1.05)
    assert schedule.temperature_at(0, 1.0) == pytest.approx(0.9)
    assert schedule.temperature_at(1, 0.1) == pytest.approx(0.9)
    fixed = schedule.model_copy(update={"temperature_annealing": False})
    assert fixed.temperature_at(0, 0.5) == fixed.temperature_at(1, 0.5) == pytest.approx(1.2)
