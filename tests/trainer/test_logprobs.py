"""Response-token log-probs and entropy: hand-computed values, ragged layouts, a real model's own logits."""

from __future__ import annotations

import math

import pytest
import torch
from algorithm_cases import TinyPolicy, ragged_batch

from zerobubble.trainer.algorithms import token_logprobs_and_entropy

F64 = torch.float64
LN = math.log


def test_logprob_and_entropy_of_a_two_token_vocabulary_by_hand():
    # One sample, prompt [0], response [1, 0]. logits[:, 0] predicts the first response token, logits[:, 1] the
    # second; logits[:, 2] predicts nothing in the response.
    logits = torch.tensor([[[0.0, LN(3.0)], [LN(9.0), 0.0], [50.0, -50.0]]], dtype=F64)
    input_ids = torch.tensor([[0, 1, 0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    at_one = token_logprobs_and_entropy(logits, input_ids, torch.tensor([1]), mask, torch.tensor([1.0]))
    # T = 1: p = [1/4, 3/4] then [9/10, 1/10]; the tokens are 1 then 0.
    torch.testing.assert_close(at_one.logprobs, torch.tensor([[LN(0.75), LN(0.9)]], dtype=F64), rtol=0, atol=1e-12)
    h1 = -(0.25 * LN(0.25) + 0.75 * LN(0.75))
    h2 = -(0.9 * LN(0.9) + 0.1 * LN(0.1))
    torch.testing.assert_close(at_one.entropy, torch.tensor([[h1, h2]], dtype=F64), rtol=0, atol=1e-12)
    # T = 0.5 doubles the logits: [0, ln 9] -> p = [1/10, 9/10]; [ln 81, 0] -> p = [81/82, 1/82].
    at_half = token_logprobs_and_entropy(logits, input_ids, torch.tensor([1]), mask, torch.tensor([0.5]))
    torch.testing.assert_close(at_half.logprobs, torch.tensor([[LN(0.9), LN(81 / 82)]], dtype=F64),
                               rtol=0, atol=1e-12)


def test_ragged_starts_match_a_per_sample_reference_and_padding_is_zero():
    model, batch = TinyPolicy(), ragged_batch(num_samples=6, max_response=4)
    logits = model(batch.input_ids)
    result = token_logprobs_and_entropy(logits, batch.input_ids, batch.response_start, batch.response_mask,
                                        batch.temperatures)
    for i in range(6):
        start, length = int(batch.response_start[i]), int(batch.response_mask[i].sum())
        rows = torch.log_softmax(logits[i, start - 1 : start - 1 + length] / batch.temperatures[i], dim=-1)
        tokens = batch.input_ids[i, start : start + length]
        torch.testing.assert_close(result.logprobs[i, :length], rows[torch.arange(length), tokens],
                                   rtol=0, atol=1e-12)
        torch.testing.assert_close(result.entropy[i, :length], -(rows.exp() * rows).sum(-1), rtol=0, atol=1e-12)
        assert torch.all(result.logprobs[i, length:] == 0) and torch.all(result.entropy[i, length:] == 0)


def test_logprobs_carry_gradients_and_entropy_is_a_detached_statistic():
    model, batch = TinyPolicy(), ragged_batch()
    result = token_logprobs_and_entropy(model(batch.input_ids), batch.input_ids, batch.response_start,
                                        batch.response_mask, batch.temperatures)
    assert result.logprobs.requires_grad and not result.entropy.requires_grad
    result.logprobs.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    skipped = token_logprobs_and_entropy(model(batch.input_ids), batch.input_ids, batch.response_start,
                                         batch.response_mask, batch.temperatures, with_entropy=False)
    assert skipped.entropy is None


def test_bfloat16_logits_are_scored_in_float32():
    logits = torch.randn(2, 5, 7).to(torch.bfloat16)
    ids = torch.randint(0, 7, (2, 5))
    result = token_logprobs_and_entropy(logits, ids, torch.tensor([2, 2]), torch.ones(2, 3, dtype=torch.bool),
                                        torch.tensor([1.0, 0.7]))
    assert result.logprobs.dtype == torch.float32
    expected = torch.log_softmax(logits[1, 1:4].float() / 0.7, dim=-1)[torch.arange(3), ids[1, 2:5]]
    torch.testing.assert_close(result.logprobs[1], expected, rtol=0, atol=1e-6)


def test_banned_tokens_with_minus_infinity_logits_leave_entropy_finite():
    logits = torch.tensor([[[0.0, 0.0, -math.inf], [0.0, 0.0, 0.0]]], dtype=F64)
    result = token_logprobs_and_entropy(logits, torch.tensor([[2, 1]]), torch.tensor([1]),
                                        torch.ones(1, 1, dtype=torch.bool), torch.tensor([1.0]))
    torch.testing.assert_close(result.entropy, torch.tensor([[LN(2.0)]], dtype=F64), rtol=0, atol=1e-12)


def test_a_response_without_a_prompt_token_is_refused():
    with pytest.raises(ValueError, match="response_start >= 1"):
        token_logprobs_and_entropy(torch.zeros(1, 3, 4), torch.zeros(1, 3, dtype=torch.long), torch.tensor([0]),
                                   torch.ones(1, 2, dtype=torch.bool), torch.tensor([1.0]))
