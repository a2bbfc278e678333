"""New weights mid-generation in the transformers engine: per-token versions, the log-probs of each version, and
swaps that land only between decode steps while another thread loads weights as fast as it can."""

from __future__ import annotations

import numpy as np
import pytest
from engine_cases import (
    chat_prompts,
    check_concurrent_loads,
    checkpoint_weights,
    long_samples,
    recompute_logprobs,
    swap_once,
)
from transformers import AutoModelForCausalLM

from zerobubble.rollout.engine import SamplingSettings
from zerobubble.rollout.engine_transformers import TransformersEngine

TOLERANCE = 1e-4
SWAP_AT = 6   # the first token drawn by the new weights
SAMPLING = SamplingSettings(n=2, temperature=1.0, max_new_tokens=20, seed=3)


@pytest.fixture(scope="module")
def models(varied_model, other_varied_model):
    """The two versions as plain models (the reference forward) and as checkpoint weights (what a load takes)."""
    plain = [AutoModelForCausalLM.from_pretrained(path).eval() for path in (varied_model, other_varied_model)]
    return plain, [checkpoint_weights(path) for path in (varied_model, other_varied_model)]


def test_a_swap_mid_sequence_gives_tokens_of_both_versions_with_each_versions_logprobs(varied_model, models):
    (first, second), (_, new_weights) = models
    engine = TransformersEngine(varied_model, seed=0, prefix_on_new_weights="recompute")
    engine.between_steps = swap_once(engine, new_weights, SWAP_AT)
    prompts = chat_prompts(varied_model, 3)
    groups = engine.generate(prompts, SAMPLING)
    for prompt, group in zip(prompts, groups, strict=True):
        for sample in long_samples([group], SWAP_AT):
            expected = np.where(np.arange(len(sample.token_ids)) < SWAP_AT, 0, 1)
            np.testing.assert_array_equal(sample.versions, expected)
            # Each token's behaviour log-prob is that of a plain forward of the version that drew it.
            before = recompute_logprobs(first, prompt, sample, SAMPLING.temperature)
            after = recompute_logprobs(second, prompt, sample, SAMPLING.temperature)
            np.testing.assert_allclose(sample.logprobs[:SWAP_AT], before[:SWAP_AT], atol=TOLERANCE)
            np.testing.assert_allclose(sample.logprobs[SWAP_AT:], after[SWAP_AT:], atol=TOLERANCE)
            assert np.abs(before[SWAP_AT:] - after[SWAP_AT:]).max() > 0.01, "the two versions must differ here"
    assert engine.policy_version == 1


def test_keeping_the_prefix_cache_matches_the_old_version_before_and_neither_exactly_after(varied_model, models):
    """What keeping the KV cache costs: after the swap the new weights attend to keys and values the old ones
    computed, so a token's log-prob is close to, not equal to, a plain forward of the new version."""
    (first, second), (_, new_weights) = models
    engine = TransformersEngine(varied_model, seed=0)
    assert engine.prefix_on_new_weights == "keep"
    engine.between_steps = swap_once(engine, new_weights, SWAP_AT)
    prompts = chat_prompts(varied_model, 3)
    gaps = []
    for prompt, group in zip(prompts, engine.generate(prompts, SAMPLING), strict=True):
        for sample in long_samples([group], SWAP_AT):
            assert sample.versions[SWAP_AT - 1] == 0 and sample.versions[SWAP_AT] == 1
            before = recompute_logprobs(first, prompt, sample, SAMPLING.temperature)
            np.testing.assert_allclose(sample.logprobs[:SWAP_AT], before[:SWAP_AT], atol=TOLERANCE)
            gaps.append(np.abs(sample.logprobs[SWAP_AT:] -
                               recompute_logprobs(second, prompt, sample, SAMPLING.temperature)[SWAP_AT:]).max())
    assert max(gaps) > TOLERANCE, "the kept cache should leave the new version's log-probs inexact"


def test_loads_from_another_thread_land_only_between_decode_steps(varied_model, models):
    """A thread loads the two versions alternately, as fast as it can, while generation runs: every token's
    log-prob must be that of one version's forward, the one its version names (a load inside a step would give
    log-probs of half-old, half-new weights, matching neither)."""
    plain, weights = models
    engine = TransformersEngine(varied_model, seed=0, prefix_on_new_weights="recompute")
    check_concurrent_loads(engine, plain, weights, chat_prompts(varied_model, 2), TOLERANCE)
