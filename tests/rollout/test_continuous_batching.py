"""The transformers engine's continuous batcher: requests that join the running batch between decode steps, leave it
as each finishes, and reuse their key's kept KV cache, give the tokens and log-probs of the sequence alone;
new weights, closing and a failing request behave as the engine's contract says."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from engine_cases import ascii_pair_stop, chat_prompts, checkpoint_weights, recompute_logprobs
from transformers import AutoModelForCausalLM

from zerobubble.rollout.continuous import BatcherClosed, ContinuousBatcher
from zerobubble.rollout.engine import SamplingSettings
from zerobubble.rollout.engine_transformers import TransformersEngine

GREEDY = SamplingSettings(n=1, temperature=0.0, max_new_tokens=12)


@pytest.fixture(scope="module")
def engine(varied_model):
    engine = TransformersEngine(varied_model, seed=0)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def plain(varied_model):
    return AutoModelForCausalLM.from_pretrained(varied_model).eval()


def test_requests_joining_while_others_run_get_the_greedy_tokens_of_each_sequence_alone(engine, varied_model):
    prompts = chat_prompts(varied_model, 6)
    alone = [engine.generate([p], GREEDY)[0][0] for p in prompts]
    batcher = engine.continuous()
    steps_before = batcher.stats.decode_steps
    # Three start together; the others join at the step boundaries after each of the first three returns.
    first = [batcher.submit(p, GREEDY) for p in prompts[:3]]
    later = []
    for future, prompt in zip(first, prompts[3:], strict=True):
        future.result(timeout=60)
        later.append(batcher.submit(prompt, GREEDY))
    for sample, reference in zip([f.result(timeout=60) for f in first + later], alone, strict=True):
        assert sample.token_ids.tolist() == reference.token_ids.tolist()
        np.testing.assert_allclose(sample.logprobs, reference.logprobs, atol=1e-5)
        assert sample.finish_reason == reference.finish_reason == "length"
    assert batcher.stats.decode_steps > steps_before


def test_a_keys_next_request_reuses_its_kept_cache_and_draws_from_the_whole_sequences_distribution(engine, plain,
                                                                                                    varied_model):
    batcher = engine.continuous()
    sampling = SamplingSettings(n=1, temperature=0.9, top_k=40, top_p=0.8, max_new_tokens=10, seed=11)
    prompts = chat_prompts(varied_model, 4)
    turns = [batcher.submit(p, sampling, key=("episode", i)) for i, p in enumerate(prompts)]
    first = [f.result(timeout=60) for f in turns]
    assert len(batcher.kept) >= 4
    reused = batcher.stats.reused_tokens
    # Each key's next context extends its last: the context, the turn, then an observation's tokens. Keyed and
    # unkeyed requests share a batch, so kept prefixes of different lengths leave holes the mask must mark, and
    # the third turn reuses caches kept from rows with such holes.
    observation = [10, 60, 70, 80, 10]
    contexts, samples = prompts, first
    for _ in range(2):
        contexts = [c + s.token_ids.tolist() + observation for c, s in zip(contexts, samples, strict=True)]
        futures = [batcher.submit(c, sampling, key=("episode", i) if i % 2 else None)
                   for i, c in enumerate(contexts)]
        samples = [f.result(timeout=60) for f in futures]
        for context, sample in zip(contexts, samples, strict=True):
            expected = recompute_logprobs(plain, context, sample, 0.9, top_k=40, top_p=0.8)
            np.testing.assert_allclose(sample.logprobs, expected, atol=2e-4)
            assert sample.support is not None and (sample.support >= 1).all() and (sample.support <= 40).all()
    assert batcher.stats.reused_tokens - reused >= sum(len(p) for p in prompts[1::2])
    second = samples
    # The same seed and context replay the same tokens without any kept cache.
    again = batcher.submit(contexts[0], sampling).result(timeout=60)
    assert again.token_ids.tolist() == second[0].token_ids.tolist()


def test_the_kept_caches_stay_within_their_token_bound_least_recent_first_and_forget_frees_one(engine,
                                                                                             varied_model):
    batcher = ContinuousBatcher(engine, max_kept_tokens=120)
    try:
        prompts = chat_prompts(varied_model, 5)
        for i, prompt in enumerate(prompts):
            batcher.submit(prompt, GREEDY, key=i).result(timeout=60)
            assert batcher.kept.tokens <= 120
        assert batcher.kept.evictions >= 1 and len(batcher.kept) < 5
        assert batcher.kept.take(0) is None            # the oldest went first
        newest = batcher.kept.tokens
        batcher.forget(4)
        assert batcher.kept.tokens < newest and batcher.kept.take(4) is None
    finally:
        batcher.close()


def test_a_stop_string_ends_a_request_with_the_text_cut_at_it(engine, varied_model):
    prompt = chat_prompts(varied_model, 1)[0]
    free = engine.continuous().submit(prompt, SamplingSettings(n=1, temperature=0.0, max_new_tokens=24)).result(60)
    stop, length = ascii_pair_stop(free)
    stopped = engine.continuous().submit(prompt, SamplingSettings(n=1, temperature=0.0, max_new_tokens=24,
                                                                  stop=(stop,))).result(timeout=60)
    assert stopped.finish_reason == "stop" and len(stopped.token_ids) == length and stopped.text.endswith(stop)


def test_weights_loaded_mid_request_tag_the_later_tokens_and_recompute_drops_the_kept_caches(varied_model,
                                                                                             other_varied_model):
    engine = TransformersEngine(varied_model, seed=0, prefix_on_new_weights="recompute")
    other = checkpoint_weights(other_varied_model)
    try:
        batcher = engine.continuous()
        prompt = chat_prompts(varied_model, 1)[0]
        batcher.submit(prompt, GREEDY, key="kept").result(timeout=60)
        assert len(batcher.kept) == 1
        boundaries = iter(range(10_000))

        def at_boundary() -> None:
            if next(boundaries) == 4:
                engine.load_weights(other, version=7)
        engine.between_steps = at_boundary
        sample = batcher.submit(prompt, SamplingSettings(n=1, temperature=0.0, max_new_tokens=12)).result(60)
        engine.between_steps = None
        versions = sample.versions.tolist()
        assert versions[0] == 0 and versions[-1] == 7 and versions == sorted(versions)
        assert len(batcher.kept) == 0     # the old weights' keys and values are not reused under "recompute"
        # After the swap the prefix was computed again: the later tokens' log-probs are the new model's.
        new_model = AutoModelForCausalLM.from_pretrained(other_varied_model).eval()
        swapped = versions.index(7)
        expected = recompute_logprobs(new_model, prompt, sample, 0.0)
        np.testing.assert_allclose(sample.logprobs[swapped:], expected[swapped:], atol=2e-4)
    finally:
        engine.close()


def test_a_failing_request_fails_alone_and_closing_fails_what_is_left(varied_model):
    engine = TransformersEngine(varied_model, seed=0)
    batcher = engine.continuous()
    prompt = chat_prompts(varied_model, 1)[0]
    running = batcher.submit(prompt, GREEDY)
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        batcher.submit([*prompt, 10 ** 6], GREEDY)   # refused before the batch, which goes on
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        batcher.submit([-1], GREEDY)
    assert len(running.result(timeout=60).token_ids) == GREEDY.max_new_tokens
    # A forward that fails all the same (out of memory, say) fails its batch, and the next request is served.
    real = engine.model.forward
    engine.model.forward = lambda *args, **kwargs: (_ for _ in ()).throw(RuntimeError("out of memory"))
    with pytest.raises(RuntimeError, match="out of memory"):
        batcher.submit(prompt, GREEDY).result(timeout=60)
    engine.model.forward = real
    assert len(batcher.submit(prompt, GREEDY).result(timeout=60).token_ids) == GREEDY.max_new_tokens
    with pytest.raises(ValueError, match="n=1"):
        batcher.submit(prompt, SamplingSettings(n=2, temperature=1.0, max_new_tokens=4))
    with pytest.raises(ValueError, match="at least one"):
        batcher.submit([], GREEDY)
    started = threading.Event()
    engine.between_steps = started.set
    pending = batcher.submit(prompt, SamplingSettings(n=1, temperature=0.0, max_new_tokens=10_000))
    assert started.wait(60)
    engine.close()
    with pytest.raises(BatcherClosed):
        pending.result(timeout=60)
    with pytest.raises(BatcherClosed):
        batcher.submit(prompt, GREEDY)


def test_the_workers_metrics_show_the_batchers_kept_caches_once_it_runs(engine, varied_model):
    from prometheus_client import CollectorRegistry

    from zerobubble.rollout.metrics import RolloutMetrics

    registry = CollectorRegistry()
    started = []
    RolloutMetrics(registry).watch_batcher(lambda: started[0] if started else None)
    assert registry.get_sample_value("zerobubble_rollout_kept_kv_cache_bytes") == 0   # nothing started yet
    batcher = ContinuousBatcher(engine)
    started.append(batcher)
    try:
        batcher.submit(chat_prompts(varied_model, 1)[0], GREEDY, key="episode").result(timeout=60)
        assert registry.get_sample_value("zerobubble_rollout_kept_kv_cache_episodes") == 1
        assert registry.get_sample_value("zerobubble_rollout_kept_kv_cache_bytes") == batcher.kept.bytes > 0
        assert registry.get_sample_value("zerobubble_rollout_batcher_running") == 0
    finally:
        batcher.close()
