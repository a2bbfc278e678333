"""The transformers engine on a real tiny Qwen2 model: shapes, finish reasons, log-probs, seeds, weight loads."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import torch
from engine_cases import ascii_pair_stop, chat_prompts, checkpoint_weights, recompute_logprobs

from zerobubble.rollout.engine import Engine, SamplingSettings, WeightLoadError, resolve_dtype
from zerobubble.rollout.engine_factory import make_engine, vllm_available
from zerobubble.rollout.engine_transformers import TransformersEngine, processed_logprobs

LOGPROB_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def engine(varied_model):
    engine = make_engine("transformers", varied_model, seed=0)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def prompts(varied_model):
    return chat_prompts(varied_model, 6)


def greedy(max_new_tokens: int = 24, **extra) -> SamplingSettings:
    return SamplingSettings(n=1, temperature=0.0, max_new_tokens=max_new_tokens, **extra)


def tokens_of(groups) -> list[list[list[int]]]:
    return [[sample.token_ids.tolist() for sample in group] for group in groups]


def test_n_samples_per_prompt_with_matching_arrays(engine, prompts):
    assert isinstance(engine, Engine) and engine.name == "transformers"
    groups = engine.generate(prompts[:3], SamplingSettings(n=4, temperature=1.0, max_new_tokens=10, seed=1))
    assert [len(group) for group in groups] == [4, 4, 4]
    for group in groups:
        for sample in group:
            assert sample.token_ids.dtype == np.int32 and sample.logprobs.dtype == np.float32
            assert 1 <= len(sample.token_ids) == len(sample.logprobs) <= 10
            assert np.all(sample.logprobs <= 0)
            assert sample.text == engine.tokenizer.decode(sample.token_ids.tolist(), skip_special_tokens=True)
    assert len({tuple(s.token_ids.tolist()) for s in groups[0]}) > 1, "n samples of one prompt should differ"


def test_max_new_tokens_gives_length(engine, prompts):
    for group in engine.generate(prompts, greedy(max_new_tokens=5)):
        assert group[0].finish_reason == "length" and len(group[0].token_ids) == 5


def test_eos_ends_with_stop_and_is_kept(tiny_model):
    # The untouched tiny model is close to uniform, so about one token in 259 is EOS when sampling.
    engine = TransformersEngine(tiny_model, seed=0)
    eos = engine.tokenizer.eos_token_id
    samples = [s for g in engine.generate(chat_prompts(tiny_model, 4),
                                          SamplingSettings(n=8, temperature=1.0, max_new_tokens=40, seed=3)) for s in g]
    stopped = [s for s in samples if s.finish_reason == "stop"]
    assert stopped, "expected some responses to reach EOS"
    for sample in samples:
        ids = sample.token_ids.tolist()
        assert eos not in ids[:-1]
        if sample.finish_reason == "stop":
            assert ids[-1] == eos
            assert "<|im_end|>" not in sample.text
        else:
            assert len(ids) == 40


def test_stop_string_ends_response_and_is_kept(engine, prompts):
    plain = [g[0] for g in engine.generate(prompts, greedy())]
    sample = next(s for s in plain if any(32 <= a < 127 and 32 <= b < 127
                                          for a, b in zip(s.token_ids[:-1], s.token_ids[1:], strict=True)))
    prompt = prompts[plain.index(sample)]
    stop, length = ascii_pair_stop(sample)
    stopped = engine.generate([prompt], greedy(stop=("never seen", stop)))[0][0]
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids.tolist() == sample.token_ids[:length].tolist()
    assert stopped.text.endswith(stop) and stopped.text.count(stop) == 1
    np.testing.assert_allclose(stopped.logprobs, sample.logprobs[:length], atol=LOGPROB_TOLERANCE)


def test_memory_follows_the_tokens_produced_not_max_new_tokens(engine, prompts):
    plain = [g[0] for g in engine.generate(prompts, greedy())]
    sample = next(s for s in plain if any(32 <= a < 127 and 32 <= b < 127
                                          for a, b in zip(s.token_ids[:-1], s.token_ids[1:], strict=True)))
    prompt = prompts[plain.index(sample)]
    stop, length = ascii_pair_stop(sample)
    allowed = 10_000_000
    # numpy reports its buffers to tracemalloc: per-token arrays sized by the limit would be 80 MB a row.
    tracemalloc.start()
    try:
        stopped = engine.generate([prompt, prompt], greedy(max_new_tokens=allowed, stop=(stop,)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [s.token_ids.tolist() for g in stopped for s in g] == [sample.token_ids[:length].tolist()] * 2
    assert peak < allowed, f"{peak} bytes traced while generating {length} tokens a row"


@pytest.mark.parametrize("temperature", [0.7, 1.3])
def test_logprobs_match_a_plain_forward_pass(engine, prompts, temperature):
    groups = engine.generate(prompts, SamplingSettings(n=2, temperature=temperature, max_new_tokens=12, seed=5))
    for prompt, group in zip(prompts, groups, strict=True):
        for sample in group:
            expected = recompute_logprobs(engine.model, prompt, sample, temperature)
            np.testing.assert_allclose(sample.logprobs, expected, atol=LOGPROB_TOLERANCE)


def test_top_k_samples_inside_the_top_k_and_renormalises(engine, prompts):
    groups = engine.generate(prompts[:3], SamplingSettings(n=3, temperature=1.0, top_k=4, max_new_tokens=10, seed=2))
    for prompt, group in zip(prompts[:3], groups, strict=True):
        for sample in group:
            expected = recompute_logprobs(engine.model, prompt, sample, 1.0, top_k=4)
            assert np.all(np.isfinite(expected)), "a token outside the top 4 was sampled"
            np.testing.assert_allclose(sample.logprobs, expected, atol=LOGPROB_TOLERANCE)


def test_top_p_samples_inside_the_nucleus_and_renormalises(engine, prompts):
    groups = engine.generate(prompts[:3], SamplingSettings(n=3, temperature=1.0, top_p=0.3, max_new_tokens=10, seed=2))
    for prompt, group in zip(prompts[:3], groups, strict=True):
        for sample in group:
            expected = recompute_logprobs(engine.model, prompt, sample, 1.0, top_p=0.3)
            assert np.all(np.isfinite(expected)), "a token outside the nucleus was sampled"
            np.testing.assert_allclose(sample.logprobs, expected, atol=LOGPROB_TOLERANCE)
    assert any(np.any(s.logprobs < -1e-3) for g in groups for s in g), "the nucleus should hold several tokens"


def test_greedy_is_deterministic_and_follows_the_argmax(engine, prompts):
    first = engine.generate(prompts, SamplingSettings(n=2, temperature=0.0, max_new_tokens=16))
    assert tokens_of(first) == tokens_of(engine.generate(prompts, SamplingSettings(n=2, temperature=0.0,
                                                                                     max_new_tokens=16)))
    for prompt, group in zip(prompts, first, strict=True):
        assert group[0].token_ids.tolist() == group[1].token_ids.tolist()
        ids = torch.tensor([prompt + group[0].token_ids.tolist()])
        with torch.no_grad():
            argmax = engine.model(ids).logits[0, len(prompt) - 1:-1].argmax(-1)
        assert group[0].token_ids.tolist() == argmax.tolist()
        np.testing.assert_allclose(group[0].logprobs, recompute_logprobs(engine.model, prompt, group[0], 0.0),
                                   atol=LOGPROB_TOLERANCE)


def test_seed_determinism(engine, varied_model, prompts):
    settings = SamplingSettings(n=3, temperature=1.0, max_new_tokens=12, seed=11)
    first = tokens_of(engine.generate(prompts, settings))
    assert tokens_of(engine.generate(prompts, settings)) == first
    other = SamplingSettings(n=3, temperature=1.0, max_new_tokens=12, seed=12)
    assert tokens_of(engine.generate(prompts, other)) != first
    # Without a per-call seed, the engine's own seed decides: two engines made alike sample alike.
    unseeded = SamplingSettings(n=3, temperature=1.0, max_new_tokens=12)
    twins = [TransformersEngine(varied_model, seed=4) for _ in range(2)]
    assert tokens_of(twins[0].generate(prompts, unseeded)) == tokens_of(twins[1].generate(prompts, unseeded))


def test_batch_chunks_give_the_same_greedy_output(engine, varied_model, prompts):
    chunked = TransformersEngine(varied_model, max_batch_size=2)
    assert tokens_of(chunked.generate(prompts, greedy())) == tokens_of(engine.generate(prompts, greedy()))


def test_load_weights_copies_in_place_and_bumps_the_version(varied_model, other_varied_model, prompts):
    engine = TransformersEngine(varied_model)
    reference = TransformersEngine(other_varied_model)
    before = tokens_of(engine.generate(prompts, greedy()))
    pointers = {name: p.data_ptr() for name, p in engine.model.named_parameters()}
    engine.load_weights(checkpoint_weights(other_varied_model), version=7)
    assert engine.policy_version == 7
    after = tokens_of(engine.generate(prompts, greedy()))
    assert after != before
    assert after == tokens_of(reference.generate(prompts, greedy()))
    assert {name: p.data_ptr() for name, p in engine.model.named_parameters()} == pointers


def test_load_weights_handles_tied_embeddings(varied_model):
    engine = TransformersEngine(varied_model)
    assert engine.model.lm_head.weight is engine.model.model.embed_tokens.weight
    replacement = torch.randn_like(engine.model.lm_head.weight)
    engine.load_weights([("lm_head.weight", replacement)], version=1)
    assert torch.equal(engine.model.model.embed_tokens.weight, replacement)


def test_load_weights_refuses_bad_names_and_shapes_and_changes_nothing(varied_model, prompts):
    engine = TransformersEngine(varied_model)
    before = tokens_of(engine.generate(prompts, greedy()))
    good = checkpoint_weights(varied_model)
    scaled = [(name, tensor * 3) for name, tensor in good]
    with pytest.raises(WeightLoadError, match=r"unknown weight 'model\.layers\.0\.mlp\.gate\.weight'"):
        engine.load_weights(scaled + [("model.layers.0.mlp.gate.weight", torch.zeros(4))], version=1)
    name, tensor = good[3]
    with pytest.raises(WeightLoadError, match=rf"{name}.*shape \(1, {tensor.numel()}\)"):
        engine.load_weights(scaled[:3] + [(name, tensor.reshape(1, -1))], version=1)
    assert engine.policy_version == 0
    assert tokens_of(engine.generate(prompts, greedy())) == before


def test_make_engine_names_the_choices(varied_model):
    with pytest.raises(ValueError, match="transformers, vllm"):
        make_engine("onnx", varied_model)
    if not vllm_available():
        with pytest.raises(RuntimeError, match="make vllm-env"):
            make_engine("vllm", varied_model)


def test_dtype_names():
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype("bf16", "cpu") == torch.bfloat16 and resolve_dtype("fp32", "cuda") == torch.float32
    with pytest.raises(ValueError, match="unknown dtype 'int8'"):
        resolve_dtype("int8", "cpu")


def test_sampling_settings_refuse_nonsense():
    with pytest.raises(ValueError, match="top_p"):
        SamplingSettings(n=1, temperature=1.0, max_new_tokens=4, top_p=0.0)
    with pytest.raises(ValueError, match="n must"):
        SamplingSettings(n=0, temperature=1.0, max_new_tokens=4)
    with pytest.raises(ValueError, match="stop strings"):
        SamplingSettings(n=1, temperature=1.0, max_new_tokens=4, stop=("",))


def test_support_counts_the_tokens_top_k_and_top_p_kept(engine, prompts):
    settings = SamplingSettings(n=2, temperature=0.9, top_k=20, top_p=0.8, max_new_tokens=8, seed=4)
    for prompt, group in zip(prompts[:3], engine.generate(prompts[:3], settings), strict=True):
        for sample in group:
            ids = torch.tensor([prompt + sample.token_ids.tolist()])
            with torch.no_grad():
                logits = engine.model(ids).logits[0, len(prompt) - 1:-1]
            kept = torch.isfinite(processed_logprobs(logits, settings)).sum(dim=-1)
            assert sample.support.tolist() == kept.tolist()
            assert 1 <= sample.support.min() and sample.support.max() <= 20
    plain = engine.generate(prompts[:1], SamplingSettings(n=1, temperature=0.9, max_new_tokens=4, seed=4))
    assert plain[0][0].support is None, "without truncation the whole vocabulary is the support"
