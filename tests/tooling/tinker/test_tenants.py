"""Two sessions train LoRA adapters on the one base model at once, isolated: a client whose steps are interleaved
with another tenant's ends exactly where the same client run alone ends (adapter, gradients and Adam state all
its own), and each samples with its own weights."""

from __future__ import annotations

import pytest
import tinker
from tinker import types
from tinker_data import DEADLINE, MODEL, TOKEN, next_token_datum, target_logprobs

pytestmark = pytest.mark.slow

ADAM = types.AdamParams(learning_rate=5e-3)


def test_one_tenants_steps_never_touch_another_tenants_adapter_or_optimizer(service_client, tinker_server):
    other_session = tinker.ServiceClient(base_url=tinker_server.url, api_key=TOKEN)
    # Two clients from one seed start from one adapter; "alone" trains by itself, "shared" with an intruder of
    # another session whose forward_backward and optim_step run between its own forward_backward and optim_step.
    alone = service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=7).result(DEADLINE)
    shared = other_session.create_lora_training_client(base_model=MODEL, rank=4, seed=7).result(DEADLINE)
    intruder = service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=8).result(DEADLINE)
    tokenizer = alone.get_tokenizer()
    data = [next_token_datum(tokenizer.encode(text)) for text in ("12+30=42", "7+8=15")]
    other_data = [next_token_datum(tokenizer.encode("99-1=98 and more"))]
    for _ in range(3):
        alone.forward_backward(data, "cross_entropy").result(DEADLINE)
        alone.optim_step(ADAM).result(DEADLINE)
    for _ in range(3):
        shared.forward_backward(data, "cross_entropy").result(DEADLINE)
        intruder.forward_backward(other_data, "cross_entropy").result(DEADLINE)
        intruder.optim_step(types.AdamParams(learning_rate=5e-2)).result(DEADLINE)
        shared.optim_step(ADAM).result(DEADLINE)
    probe = [next_token_datum(tokenizer.encode("20+22=42"))]
    alone_logprobs = target_logprobs(alone.forward(probe, "cross_entropy").result(DEADLINE))
    shared_logprobs = target_logprobs(shared.forward(probe, "cross_entropy").result(DEADLINE))
    intruder_logprobs = target_logprobs(intruder.forward(probe, "cross_entropy").result(DEADLINE))
    assert shared_logprobs[0] == pytest.approx(alone_logprobs[0], abs=1e-6)
    assert intruder_logprobs[0] != pytest.approx(alone_logprobs[0], abs=1e-3)

    # Each samples with its own weights: the same draw from the twins' weights, another from the intruder's.
    prompt = types.ModelInput.from_ints(tokenizer.encode("12+30="))
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=11)

    def draw(client):
        sampler = client.save_weights_and_get_sampling_client().result(DEADLINE)
        (sequence,) = sampler.sample(prompt, 1, params).result(DEADLINE).sequences
        return sequence

    alone_draw, shared_draw, intruder_draw = draw(alone), draw(shared), draw(intruder)
    assert shared_draw.tokens == alone_draw.tokens
    assert shared_draw.logprobs == pytest.approx(alone_draw.logprobs, abs=1e-5)
    assert intruder_draw.logprobs[:1] != pytest.approx(alone_draw.logprobs[:1], abs=1e-3)
