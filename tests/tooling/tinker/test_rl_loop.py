"""The RL loop as Tinker users write it, through the official client: sample from the newest weights, reward the
samples, train on them with importance_sampling using the sampler's own log-probs, repeat. Rewarding a digit as
the first token after the prompt raises the model's probability of a digit."""

from __future__ import annotations

import math

import pytest
from tinker import types
from tinker_data import DEADLINE, MODEL, next_token_datum, target_logprobs

pytestmark = pytest.mark.slow

SAMPLES = 64


def _digit_probability(client, prompt: list[int], digits: list[int]) -> float:
    data = [next_token_datum(prompt + [digit]) for digit in digits]
    return sum(math.exp(logprobs[-1]) for logprobs in target_logprobs(client.forward(data, "cross_entropy")
                                                                       .result(DEADLINE)))


def test_sampling_and_importance_sampling_raise_the_rewarded_tokens(service_client):
    client = service_client.create_lora_training_client(base_model=MODEL, rank=8, seed=13).result(DEADLINE)
    tokenizer = client.get_tokenizer()
    prompt = tokenizer.encode("12+30=")
    digits = [tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    before = _digit_probability(client, prompt, digits)
    for step in range(12):
        sampler = client.save_weights_and_get_sampling_client().result(DEADLINE)
        result = sampler.sample(types.ModelInput.from_ints(prompt), SAMPLES,
                                types.SamplingParams(max_tokens=1, temperature=1.0, seed=step)).result(DEADLINE)
        rewards = [float(sequence.tokens[0] in digits) for sequence in result.sequences]
        mean = sum(rewards) / len(rewards)
        data = []
        for sequence, reward in zip(result.sequences, rewards, strict=True):
            zeros = [0.0] * (len(prompt) - 1)  # the prompt's own positions carry no loss
            data.append(next_token_datum(prompt + list(sequence.tokens), logprobs=zeros + list(sequence.logprobs),
                                         advantages=zeros + [reward - mean]))
        client.forward_backward(data, "importance_sampling").result(DEADLINE)
        client.optim_step(types.AdamParams(learning_rate=5e-2)).result(DEADLINE)
    after = _digit_probability(client, prompt, digits)
    assert after > 1.5 * before, (before, after)  # 0.034 to 0.084 here


def test_the_client_keeps_its_own_pyqwest_transport(service_client):
    """The front's client/config leaves the client its default transport: with httpx's, an RL loop's client spent
    a fifth of its time scanning its connection pool (one connection per sample awaited) on every request."""
    assert service_client.holder.get_client_config().use_pyqwest_transport
