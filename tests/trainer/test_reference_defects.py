"""Each mathematical defect of Colossal-RL (DESIGN.md section 5) and the test that we do not repeat it."""

from __future__ import annotations

import math

import torch
from algorithm_cases import TinyPolicy, policy_logprobs, ragged_batch, tiny_qwen2

from zerobubble.trainer.algorithms import (
    algorithm_config,
    mini_batch_normaliser,
    policy_loss,
    reinforce_pp_advantages,
    token_logprobs_and_entropy,
)

F64 = torch.float64


def _sample(model, prompts, temperature, new_tokens, seed):
    """Sample at `temperature`; return the sequences and the sampler's own log-probs of the drawn tokens."""
    torch.manual_seed(seed)
    out = model.generate(prompts, do_sample=True, temperature=temperature, top_k=None, top_p=None,
                         max_new_tokens=new_tokens, output_logits=True, return_dict_in_generate=True)
    drawn = out.sequences[:, prompts.size(1):]
    steps = torch.stack(out.logits, dim=1).double() / temperature
    behaviour = torch.log_softmax(steps, dim=-1).gather(-1, drawn.unsqueeze(-1)).squeeze(-1)
    return out.sequences, behaviour


def test_logprobs_use_each_samples_own_sampling_temperature_not_the_initial_one():
    # Colossal-RL anneals the sampling temperature from T0 towards 0.9 but recomputes log-probs at T0.
    model = tiny_qwen2()
    prompts = torch.randint(1, 64, (2, 4), generator=torch.Generator().manual_seed(3))
    early, early_logp = _sample(model, prompts, 1.0, 6, seed=0)
    annealed, annealed_logp = _sample(model, prompts, 0.9, 6, seed=1)
    sequences = torch.cat([early, annealed])
    behaviour = torch.cat([early_logp, annealed_logp])
    mask = torch.ones(4, 6, dtype=torch.bool)
    start = torch.full((4,), 4)
    with torch.no_grad():
        logits = model(sequences).logits

    drawn_at = torch.tensor([1.0, 1.0, 0.9, 0.9])
    ours = token_logprobs_and_entropy(logits, sequences, start, mask, drawn_at).logprobs
    torch.testing.assert_close(ours, behaviour, rtol=0, atol=1e-5)

    at_initial = token_logprobs_and_entropy(logits, sequences, start, mask, torch.ones(4)).logprobs
    torch.testing.assert_close(at_initial[:2], behaviour[:2], rtol=0, atol=1e-5)
    assert (at_initial[2:] - behaviour[2:]).abs().max() > 1e-2


def _grads(model, batch, config, normaliser):
    model.zero_grad()
    loss, _ = policy_loss(policy_logprobs(model, batch), batch.old_logp, batch.advantages, batch.response_mask,
                          config, normaliser=normaliser, behaviour_logp=batch.behaviour_logp)
    loss.backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def test_micro_batch_losses_are_normalised_by_the_whole_mini_batch_not_summed_per_micro_batch():
    # Colossal-RL took each micro-batch's own mean and summed the micro-batch losses, so the gradient grew with
    # the number of micro-batches. Here every micro-batch divides by the mini-batch normaliser.
    config = algorithm_config("GRPO", beta=0.0)
    model, batch = TinyPolicy(), ragged_batch(num_samples=6)
    one_batch = _grads(model, batch, config, mini_batch_normaliser([batch.response_mask], "sample_level"))
    micro = [batch.rows(slice(i, i + 2)) for i in (0, 2, 4)]

    global_normaliser = mini_batch_normaliser([m.response_mask for m in micro], "sample_level")
    ours = sum(_grads(model, m, config, global_normaliser) for m in micro)
    torch.testing.assert_close(ours, one_batch, rtol=1e-10, atol=1e-14)

    summed_means = sum(_grads(model, m, config, mini_batch_normaliser([m.response_mask], "sample_level"))
                       for m in micro)
    torch.testing.assert_close(summed_means, 3 * one_batch, rtol=1e-10, atol=1e-14)


def test_entropy_is_taken_at_the_action_positions_not_shifted_by_one():
    # Prompt [0], response [0, 1]. Position 0's logits (which choose the first action) are sharply peaked;
    # position 1's (which choose the second) are uniform. Colossal-RL paired each action with the next row.
    peaked = [8.0, 0.0, 0.0, 0.0]
    logits = torch.tensor([[peaked, [0.0] * 4, [3.0, 1.0, 0.0, 0.0]]], dtype=F64)
    result = token_logprobs_and_entropy(logits, torch.tensor([[0, 0, 1]]), torch.tensor([1]),
                                        torch.ones(1, 2, dtype=torch.bool), torch.tensor([1.0]))
    z = math.exp(8.0) + 3
    peaked_entropy = -(math.exp(8.0) / z * math.log(math.exp(8.0) / z) + 3 / z * math.log(1 / z))
    torch.testing.assert_close(result.logprobs, torch.tensor([[8.0 - math.log(z), math.log(0.25)]], dtype=F64),
                               rtol=0, atol=1e-12)
    torch.testing.assert_close(result.entropy, torch.tensor([[peaked_entropy, math.log(4.0)]], dtype=F64),
                               rtol=0, atol=1e-12)
    assert peaked_entropy < 0.05 < math.log(4.0)


def test_reinforce_pp_whitening_divides_by_the_std_not_multiplies():
    # Colossal-RL's rewards are 10 or 0; its whitening multiplied by the std, scaling advantages by var(a).
    rewards = torch.tensor([[10.0, 0.0, 0.0, 10.0], [10.0, 0.0, 0.0, 0.0]], dtype=F64)
    mask = torch.zeros(8, 4, dtype=torch.bool)
    for row, length in enumerate([4, 2, 3, 1, 4, 4, 2, 1]):
        mask[row, :length] = True
    advantages = reinforce_pp_advantages(rewards, mask)
    tokens = advantages[mask]
    assert abs(tokens.mean().item()) < 1e-12
    assert abs(tokens.std().item() - 1.0) < 1e-8
    # Whitening makes the advantages independent of the reward scale (10/0 or 1/0).
    torch.testing.assert_close(reinforce_pp_advantages(rewards / 10, mask), advantages, rtol=0, atol=1e-6)

    centred = (rewards - rewards.mean(dim=1, keepdim=True)).reshape(-1, 1).expand(-1, 4)[mask]
    multiplied = (centred - centred.mean()) * centred.std()
    assert multiplied.std().item() > 10 * tokens.std().item()
