"""The tiny model: reloads with the Auto classes, sizes as advertised, deterministic, exact tokenizer."""

from __future__ import annotations

import unicodedata

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from zerobubble.tooling.tiny.model import IM_END, PAD_TOKEN, SIZES, make_tiny_model, make_tokenizer, parameter_count

EXPECTED_PARAMETERS = {"1m": (0.9e6, 1.2e6), "2m": (1.8e6, 2.6e6), "5m": (4.5e6, 5.6e6), "20m": (18e6, 23e6)}

TRICKY = [
    "Hello  world",
    "  leading and trailing  ",
    "line one\nline two\n\n\ttabbed\r\nwindows",
    "\\frac{1}{2} + \\sqrt{x^2} = \\boxed{\\dfrac{3}{4}} $a_{i}$",
    "ünïcødé 日本語 emoji 🙂👍🏽 Ωmega",
    "<|im_start|>user\n12+7=<|im_end|>\n",
    "\x00\x01\x7f bytes",
    "",
]


@pytest.fixture(scope="module")
def one_m(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", size="1m", seed=0)


def test_presets_have_the_advertised_parameter_counts(tmp_path):
    assert set(SIZES) == set(EXPECTED_PARAMETERS)
    for size, (low, high) in EXPECTED_PARAMETERS.items():
        model = AutoModelForCausalLM.from_pretrained(make_tiny_model(tmp_path / size, size=size))
        assert low <= parameter_count(model) <= high, size
        assert model.config.model_type == "qwen2"
        assert model.config.tie_word_embeddings


def test_reloads_with_auto_classes_and_generates(one_m):
    model = AutoModelForCausalLM.from_pretrained(one_m)
    tokenizer = AutoTokenizer.from_pretrained(one_m)
    assert len(tokenizer) == model.config.vocab_size == 259
    assert tokenizer.eos_token == IM_END and tokenizer.pad_token == PAD_TOKEN
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert model.generation_config.pad_token_id == tokenizer.pad_token_id
    prompt = tokenizer("1+1=", return_tensors="pt")
    out = model.generate(**prompt, max_new_tokens=5, do_sample=False)
    assert out.shape[1] > prompt["input_ids"].shape[1]
    assert (one_m / "model.safetensors").is_file()


def test_same_seed_same_weights_other_seed_differs(tmp_path):
    first = load_file(make_tiny_model(tmp_path / "a", size="1m", seed=3) / "model.safetensors")
    again = load_file(make_tiny_model(tmp_path / "b", size="1m", seed=3) / "model.safetensors")
    other = load_file(make_tiny_model(tmp_path / "c", size="1m", seed=4) / "model.safetensors")
    assert first.keys() == again.keys() == other.keys()
    assert all(torch.equal(first[name], again[name]) for name in first)
    assert not torch.equal(first["model.embed_tokens.weight"], other["model.embed_tokens.weight"])


def test_making_a_model_leaves_the_callers_rng_alone(tmp_path):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    make_tiny_model(tmp_path / "m", size="1m", seed=9)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("text", TRICKY)
def test_tokenizer_round_trips_exactly(one_m, text):
    for tokenizer in (AutoTokenizer.from_pretrained(one_m), make_tokenizer()):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == text
        plain = text.replace("<|im_start|>", "").replace("<|im_end|>", "")
        if plain == text:
            # No merges: one token per UTF-8 byte.
            assert len(ids) == len(text.encode("utf-8"))


def test_special_tokens_are_single_ids_and_text_is_nfc(one_m):
    tokenizer = AutoTokenizer.from_pretrained(one_m)
    ids = tokenizer("<|im_start|>a<|im_end|>", add_special_tokens=False)["input_ids"]
    assert ids == [tokenizer.convert_tokens_to_ids("<|im_start|>"), ord("a"), tokenizer.eos_token_id]
    decomposed = "e\u0301"
    assert tokenizer.decode(tokenizer(decomposed)["input_ids"]) == unicodedata.normalize("NFC", decomposed)


def test_in_memory_and_reloaded_tokenizers_agree(one_m):
    reloaded = AutoTokenizer.from_pretrained(one_m)
    fresh = make_tokenizer()
    for text in TRICKY:
        assert reloaded(text)["input_ids"] == fresh(text)["input_ids"]


def test_chat_template_renders_chatml(one_m):
    tokenizer = AutoTokenizer.from_pretrained(one_m)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "12+7="}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n12+7=<|im_end|>\n<|im_start|>assistant\n"
    )
    closed = tokenizer.apply_chat_template(messages[1:], tokenize=False, add_generation_prompt=False)
    assert closed == "<|im_start|>user\n12+7=<|im_end|>\n"
