"""The warm start: supervised steps lower the response loss and save the model; evaluation scores with the verifier."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from zerobubble.rollout.episodes.render import TurnRenderer
from zerobubble.tooling.tiny.model import make_tiny_model
from zerobubble.tooling.tiny.task import read_task
from zerobubble.tooling.tiny.tool_use import ToolCallShape
from zerobubble.tooling.tiny.warm_start import IGNORE_INDEX, collate, encode_examples, evaluate, warm_start

# The rollout workers' prompt layout when the run sends no system prompt, as the demo does.
NO_SYSTEM_PROMPT = ""


def write_rows(path, rows: dict[str, str]):
    path.write_text("".join(
        json.dumps({"messages": [{"role": "user", "content": q}], "gt_answer": a}) + "\n" for q, a in rows.items()
    ))
    return path


@pytest.fixture(autouse=True)
def one_thread():
    # Many times faster than two spinning threads on a shared 2-core machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def two_questions(tmp_path):
    return write_rows(tmp_path / "two.jsonl", {"3+4=": "7", "8-5=": "3"})


def response_loss(model_dir, jsonl) -> float:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.inference_mode():
        batch = collate(encode_examples(tokenizer, read_task(jsonl), NO_SYSTEM_PROMPT), tokenizer.pad_token_id)
        return model(**batch).loss.item()


def test_collate_trains_only_on_the_response_and_end_of_turn(tmp_path, two_questions):
    tokenizer = AutoTokenizer.from_pretrained(make_tiny_model(tmp_path / "m", size="1m"))
    batch = collate(encode_examples(tokenizer, read_task(two_questions), NO_SYSTEM_PROMPT), tokenizer.pad_token_id)
    for labels in batch["labels"]:
        targets = labels[labels != IGNORE_INDEX].tolist()
        assert targets[-1] == tokenizer.eos_token_id
        assert tokenizer.decode(targets[:-1]) in ("\\boxed{7}", "\\boxed{3}")
    assert batch["attention_mask"].sum().item() == (batch["input_ids"] != tokenizer.pad_token_id).sum().item()


def test_warm_start_lowers_the_loss_saves_in_place_and_is_scored(tmp_path):
    one_question = write_rows(tmp_path / "one.jsonl", {"3+4=": "7"})
    model_dir = make_tiny_model(tmp_path / "m", size="1m", seed=0)
    before_weights = load_file(model_dir / "model.safetensors")
    before_loss = response_loss(model_dir, one_question)
    assert evaluate(model_dir, one_question, samples_per_prompt=1, temperature=0.0, max_new_tokens=8,
                    system_prompt=NO_SYSTEM_PROMPT)["accuracy"] == 0.0

    figures = warm_start(model_dir, one_question, steps=60, batch_size=4, lr=3e-3, system_prompt=NO_SYSTEM_PROMPT)

    assert figures["steps"] == 60 and figures["seconds"] > 0
    assert figures["final_loss"] < figures["initial_loss"]
    after_weights = load_file(model_dir / "model.safetensors")
    assert not torch.equal(before_weights["model.embed_tokens.weight"], after_weights["model.embed_tokens.weight"])
    assert response_loss(model_dir, one_question) < before_loss / 4
    # Memorised: the greedy answer is boxed, ends the turn, and the verifier's logic accepts it...
    assert evaluate(model_dir, one_question, samples_per_prompt=1, temperature=0.0, max_new_tokens=12,
                    system_prompt=NO_SYSTEM_PROMPT) == {
        "accuracy": 1.0, "format": 1.0, "samples": 1, "temperature": 0.0}
    # ...and refuses it against another gold answer.
    other_gold = write_rows(tmp_path / "other.jsonl", {"3+4=": "8"})
    assert evaluate(model_dir, other_gold, samples_per_prompt=2, temperature=0.0, max_new_tokens=12,
                    system_prompt=NO_SYSTEM_PROMPT)["accuracy"] == 0.0


def test_warm_start_reports_its_progress_with_an_estimate(tmp_path, two_questions, caplog):
    model_dir = make_tiny_model(tmp_path / "m", size="1m", seed=0)
    with caplog.at_level("INFO", logger="zerobubble.tooling.tiny.warm_start"):
        warm_start(model_dir, two_questions, steps=5, batch_size=2, system_prompt=NO_SYSTEM_PROMPT,
                   report_seconds=3600)
    lines = [record.getMessage() for record in caplog.records]
    # The first step (so the estimate shows at once) and the last; nothing between within the interval.
    assert [line.split(",")[0] for line in lines] == ["warm start: step 1/5", "warm start: step 5/5"]
    assert "s left" in lines[0] and lines[1].endswith("about 0 s left")


def test_tool_using_examples_are_the_episode_as_the_worker_plays_it_with_the_tools_answer_no_target(tmp_path):
    rows = write_rows(tmp_path / "sums.jsonl", {f"{a}+{a + 11}=": str(2 * a + 11) for a in range(10, 30)})
    tokenizer = AutoTokenizer.from_pretrained(make_tiny_model(tmp_path / "m", size="1m"))
    shape = ToolCallShape("@calculator({expression})", "calculator")
    examples = encode_examples(tokenizer, read_task(rows), NO_SYSTEM_PROMPT, tool_use=shape, tool_fraction=0.25)
    tool_using = [e for e in examples if e.targets is not None]
    assert len(tool_using) == 5
    renderer = TurnRenderer(tokenizer, max_observation_tokens=64)
    for example in tool_using:
        question = tokenizer.decode(example.prompt_ids).split("user\n")[1].split("=")[0]
        answer = str(eval(question))   # noqa: S307 - the test's own sums
        call = tokenizer.encode(f"@calculator({question})") + [tokenizer.eos_token_id]
        observation = renderer.observation_tokens([{"role": "tool", "name": "calculator", "content": answer}],
                                                  ended_with_eos=True)
        boxed = tokenizer.encode(f"\\boxed{{{answer}}}") + [tokenizer.eos_token_id]
        assert example.response_ids == call + observation + boxed
        assert example.targets == [1] * len(call) + [0] * len(observation) + [1] * len(boxed)
    labels = collate(tool_using[:1], tokenizer.pad_token_id)["labels"][0]
    assert tokenizer.decode(labels[labels != IGNORE_INDEX].tolist()).count("<|im_start|>") == 0
