"""The official tinker client (0.38) against the front: a supervised loop learns, the RL losses train, and a
sampler at saved weights draws tokens whose log-probs are the trained model's."""

from __future__ import annotations

import math

import pytest
from tinker import types
from tinker_data import DEADLINE, MODEL, next_token_datum, target_logprobs

pytestmark = pytest.mark.slow

TEXTS = ["12+30=42", "7+8=15", "20+22=42", "5+5=10"]


@pytest.fixture(scope="module")
def trained(service_client):
    """A LoRA client after a short supervised loop, with the loss of each step."""
    client = service_client.create_lora_training_client(base_model=MODEL, rank=8, seed=0).result(DEADLINE)
    tokenizer = client.get_tokenizer()
    data = [next_token_datum(tokenizer.encode(text)) for text in TEXTS]
    losses = []
    for _ in range(10):
        step = client.forward_backward(data, "cross_entropy")
        optim = client.optim_step(types.AdamParams(learning_rate=5e-3))
        losses.append(step.result(DEADLINE).metrics["loss:sum"])
        optim.result(DEADLINE)
    return client, tokenizer, losses


def test_a_supervised_loop_lowers_its_loss(trained):
    _, _, losses = trained
    assert all(math.isfinite(loss) for loss in losses)
    assert losses[-1] < 0.8 * losses[0], losses


def test_forward_gives_each_targets_log_prob_without_training(trained):
    client, tokenizer, _ = trained
    datum = next_token_datum(tokenizer.encode(TEXTS[0]))
    first = client.forward([datum], "cross_entropy").result(DEADLINE)
    again = client.forward([datum], "cross_entropy").result(DEADLINE)
    (logprobs,) = target_logprobs(first)
    assert len(logprobs) == len(tokenizer.encode(TEXTS[0])) - 1 and all(lp <= 0 for lp in logprobs)
    assert target_logprobs(again) == [logprobs]  # forward applies nothing
    assert first.metrics["loss:sum"] == pytest.approx(-sum(logprobs), rel=1e-5)


def _scored(client, prompt: list[int], sequence) -> list[float]:
    """The training client's log-probs of a sampled sequence's tokens after `prompt`."""
    full = prompt + list(sequence.tokens)
    (logprobs,) = target_logprobs(client.forward([next_token_datum(full)], "cross_entropy").result(DEADLINE))
    return logprobs[len(prompt) - 1:]


def test_a_sampler_at_saved_weights_draws_with_the_trained_models_log_probs(service_client, trained):
    client, tokenizer, _ = trained
    path = client.save_weights_for_sampler("after-sft").result(DEADLINE).path
    assert path.startswith("tinker://")
    sampler = service_client.create_sampling_client(model_path=path).result(DEADLINE)
    prompt = tokenizer.encode("12+30=")
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=3)
    result = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=2, sampling_params=params).result(DEADLINE)
    assert len(result.sequences) == 2
    for sequence in result.sequences:
        assert 1 <= len(sequence.tokens) <= 6 and len(sequence.logprobs) == len(sequence.tokens)
        assert sequence.stop_reason in ("stop", "length")
        assert sequence.logprobs == pytest.approx(_scored(client, prompt, sequence), abs=1e-4)


def test_a_base_model_sampler_samples_the_untrained_weights(service_client, trained):
    trained_client, tokenizer, _ = trained
    # The engine holds the trained adapter merged after this sample; the base sampler must take it back out.
    trained_sampler = trained_client.save_weights_and_get_sampling_client().result(DEADLINE)
    trained_sampler.sample(types.ModelInput.from_ints(tokenizer.encode("1+1=")), 1,
                           types.SamplingParams(max_tokens=2)).result(DEADLINE)
    fresh = service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=1).result(DEADLINE)
    sampler = service_client.create_sampling_client(base_model=MODEL).result(DEADLINE)
    prompt = tokenizer.encode("7+8=")
    result = sampler.sample(types.ModelInput.from_ints(prompt), 1,
                            types.SamplingParams(max_tokens=5, temperature=1.0, seed=5)).result(DEADLINE)
    (sequence,) = result.sequences
    # A new adapter's B is zero: the fresh client's forward is the base model's.
    assert sequence.logprobs == pytest.approx(_scored(fresh, prompt, sequence), abs=1e-4)
    assert sequence.logprobs != pytest.approx(_scored(trained_client, prompt, sequence), abs=1e-3)


@pytest.mark.parametrize("loss_fn", ["importance_sampling", "ppo", "cispo"])
def test_the_rl_losses_raise_the_log_prob_of_advantaged_tokens(service_client, loss_fn):
    client = service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=2).result(DEADLINE)
    ids = client.get_tokenizer().encode("12+30=42")
    n = len(ids) - 1
    base = next_token_datum(ids)
    (sampler_logprobs,) = target_logprobs(client.forward([base], "cross_entropy").result(DEADLINE))
    datum = next_token_datum(ids, logprobs=sampler_logprobs, advantages=[1.0] * n)
    config = {"clip_low_threshold": 0.5, "clip_high_threshold": 1.5} if loss_fn != "importance_sampling" else None
    for _ in range(3):
        out = client.forward_backward([datum], loss_fn, loss_fn_config=config).result(DEADLINE)
        assert math.isfinite(out.metrics["loss:sum"])
        client.optim_step(types.AdamParams(learning_rate=5e-3)).result(DEADLINE)
    (after,) = target_logprobs(client.forward([base], "cross_entropy").result(DEADLINE))
    assert sum(after) > sum(sampler_logprobs) + 0.1


def test_a_loss_computed_in_the_client_trains_through_forward_and_forward_backward(service_client):
    """forward_backward_custom: the client scores the data with forward, differentiates its own loss and sends the
    gradient back as cross_entropy weights; here the loss is the mean negative log-prob of each datum."""
    import torch

    client = service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=5).result(DEADLINE)
    datum = next_token_datum(client.get_tokenizer().encode("12+30=42"))
    (before,) = target_logprobs(client.forward([datum], "cross_entropy").result(DEADLINE))

    def mean_nll(_data, logprobs_list):
        loss = torch.stack([-logprobs.mean() for logprobs in logprobs_list]).sum()
        return loss, {"mean_nll": loss.item()}

    for _ in range(3):
        out = client.forward_backward_custom([datum], mean_nll).result(DEADLINE)
        client.optim_step(types.AdamParams(learning_rate=5e-3)).result(DEADLINE)
    assert out.metrics["mean_nll"] > 0
    (after,) = target_logprobs(client.forward([datum], "cross_entropy").result(DEADLINE))
    assert sum(after) > sum(before) + 0.1
