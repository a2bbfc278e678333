"""Sample requests waiting for the front's worker are sampled together when they can be: same weights, same
settings, no seed of their own; the first one's work samples the others, whose own work then only answers."""

from __future__ import annotations

import pytest

from zerobubble.rollout.engine import SamplingSettings
from zerobubble.tooling.tinker.sampler import Sampler, SamplerWeights
from zerobubble.tooling.tiny.model import make_tiny_model

BASE = SamplerWeights(key="", adapter=None)


@pytest.fixture(scope="module")
def sampler(tmp_path_factory) -> Sampler:
    model_dir = make_tiny_model(tmp_path_factory.mktemp("model"), size="1m", seed=0)
    return Sampler(model_dir, seed=0, max_new_tokens=8, default_max_new_tokens=8, max_batch_samples=5)


@pytest.fixture
def calls(sampler, monkeypatch) -> list[int]:
    """The prompts of each call the sampler makes to the real engine's generate."""
    sizes: list[int] = []
    generate = sampler.engine.generate
    monkeypatch.setattr(sampler.engine, "generate",
                        lambda prompts, how: sizes.append(len(prompts)) or generate(prompts, how))
    return sizes


def settings(n: int = 1, seed: int | None = None) -> SamplingSettings:
    return SamplingSettings(n=n, temperature=1.0, max_new_tokens=4, seed=seed)


def test_waiting_requests_that_match_are_sampled_in_one_batch(sampler, calls):
    first, second, third = (sampler.queue(BASE, [10 + i, 11], settings()) for i in range(3))
    other_settings = sampler.queue(BASE, [20, 21], settings(n=2))
    seeded = sampler.queue(BASE, [30, 31], settings(seed=7))
    answers = [sampler.take(request) for request in (first, second, third, other_settings, seeded)]
    assert calls == [3, 1, 1]
    assert [len(answer) for answer in answers] == [1, 1, 1, 2, 1]
    assert all(len(sequence.tokens) == len(sequence.logprobs) > 0 for answer in answers for sequence in answer)


def test_a_batch_holds_at_most_max_batch_samples(sampler, calls):
    requests = [sampler.queue(BASE, [40, 41 + i], settings(n=2)) for i in range(4)]
    for request in requests:
        sampler.take(request)
    assert calls == [2, 2]


def test_a_forgotten_request_is_not_sampled(sampler, calls):
    kept, withdrawn = sampler.queue(BASE, [50, 51], settings()), sampler.queue(BASE, [52, 53], settings())
    sampler.forget(withdrawn)
    sampler.take(kept)
    assert calls == [1] and withdrawn.result is None
