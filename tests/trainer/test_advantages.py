"""Advantage estimators and DAPO's overlong reward shaping against hand-computed examples."""

from __future__ import annotations

import math

import pytest
import torch

from zerobubble.trainer.algorithms import (
    algorithm_config,
    compute_advantages,
    default_cache_length,
    dr_grpo_advantages,
    grpo_advantages,
    overlong_sample_mask,
    reinforce_pp_advantages,
    rloo_advantages,
    shape_rewards,
    soft_overlong_penalty,
)

F64 = torch.float64
REWARDS = torch.tensor([[1.0, 0.0, 0.0, 1.0], [10.0, 0.0, 0.0, 0.0], [3.0, 3.0, 3.0, 3.0]], dtype=F64)


def test_grpo_standardises_each_group_with_the_unbiased_std():
    # Group 1: mean 0.5, squared deviations 4 * 0.25 = 1, unbiased var 1/3 -> std sqrt(1/3).
    # Group 2: mean 2.5, deviations 7.5 and -2.5 (x3), squares 56.25 + 3 * 6.25 = 75, var 75/3 = 25 -> std 5.
    # Group 3: all equal -> std 0, advantages 0 (the 1e-4 keeps it finite).
    s1 = math.sqrt(1 / 3) + 1e-4
    expected = torch.tensor([
        [0.5 / s1, -0.5 / s1, -0.5 / s1, 0.5 / s1],
        [7.5 / 5.0001, -2.5 / 5.0001, -2.5 / 5.0001, -2.5 / 5.0001],
        [0.0, 0.0, 0.0, 0.0],
    ], dtype=F64)
    torch.testing.assert_close(grpo_advantages(REWARDS), expected, rtol=0, atol=1e-12)


def test_dr_grpo_only_subtracts_the_group_mean():
    expected = torch.tensor([[0.5, -0.5, -0.5, 0.5], [7.5, -2.5, -2.5, -2.5], [0.0] * 4], dtype=F64)
    torch.testing.assert_close(dr_grpo_advantages(REWARDS), expected, rtol=0, atol=1e-12)


def test_rloo_is_the_leave_one_out_baseline():
    # (r - mean) * 4/3; e.g. the 10 is compared with the others' mean 0 -> 10, a 0 with (10+0+0)/3 -> -10/3.
    expected = torch.tensor([[2 / 3, -2 / 3, -2 / 3, 2 / 3], [10.0, -10 / 3, -10 / 3, -10 / 3], [0.0] * 4], dtype=F64)
    torch.testing.assert_close(rloo_advantages(REWARDS), expected, rtol=0, atol=1e-12)


def test_reinforce_pp_whitens_group_centred_rewards_over_all_response_tokens():
    rewards = torch.tensor([[1.0, 0.0], [4.0, 0.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 0, 0], [1, 1, 0]], dtype=torch.bool)
    # Centred per group: 0.5, -0.5, 2, -2; on tokens: 0.5 0.5 | -0.5 | 2 | -2 -2 (6 tokens).
    # Token mean = (1 - 0.5 + 2 - 4) / 6 = -0.25; deviations 0.75 0.75 | -0.25 | 2.25 | -1.75 -1.75;
    # squares sum 1.125 + 0.0625 + 5.0625 + 6.125 = 12.375; unbiased var 12.375 / 5 = 2.475.
    std = math.sqrt(2.475 + 1e-8)
    expected = torch.tensor([
        [0.75 / std, 0.75 / std, 0.0],
        [-0.25 / std, 0.0, 0.0],
        [2.25 / std, 0.0, 0.0],
        [-1.75 / std, -1.75 / std, 0.0],
    ], dtype=F64)
    torch.testing.assert_close(reinforce_pp_advantages(rewards, mask), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name, estimator", [
    ("grpo", grpo_advantages), ("dr_grpo", dr_grpo_advantages), ("rloo", rloo_advantages),
])
def test_compute_advantages_broadcasts_per_sample_estimators_to_tokens(name, estimator):
    mask = torch.zeros(12, 3, dtype=torch.bool)
    lengths = [3, 1, 2, 3, 1, 1, 2, 2, 3, 1, 1, 3]
    for row, length in enumerate(lengths):
        mask[row, :length] = True
    per_token = compute_advantages(name, REWARDS, mask)
    per_sample = estimator(REWARDS).reshape(-1)
    for row, length in enumerate(lengths):
        assert torch.equal(per_token[row, :length], per_sample[row].expand(length))
        assert torch.all(per_token[row, length:] == 0)


def test_compute_advantages_dispatches_reinforce_pp_and_refuses_unknown_names():
    rewards = torch.tensor([[1.0, 0.0], [4.0, 0.0]], dtype=F64)
    mask = torch.tensor([[1, 1], [1, 0], [1, 0], [1, 1]], dtype=torch.bool)
    assert torch.equal(compute_advantages("reinforce_pp", rewards, mask), reinforce_pp_advantages(rewards, mask))
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'"):
        compute_advantages("ppo", rewards, mask)
    with pytest.raises(ValueError, match=r"response_mask must be \[groups\*G, T\]"):
        compute_advantages("grpo", rewards, mask[:3])
    with pytest.raises(ValueError, match="at least 2 generations"):
        grpo_advantages(torch.ones(3, 1))


def test_cache_length_defaults_to_a_quarter_of_max_new_tokens_up_to_1024():
    assert default_cache_length(16) == 4
    assert default_cache_length(100) == 25
    assert default_cache_length(8192) == 1024


def test_soft_overlong_penalty_grows_linearly_inside_the_cache_zone():
    # max_new 16, cache 4: the zone is 12 < L <= 16, penalty (12 - L) / 4.
    lengths = torch.tensor([10, 12, 13, 15, 16])
    expected = torch.tensor([0.0, 0.0, -0.25, -0.75, -1.0])
    torch.testing.assert_close(soft_overlong_penalty(lengths, 16, 4), expected, rtol=0, atol=0)


def test_shape_rewards_takes_the_answer_reward_from_truncated_responses_then_penalises_length():
    lengths = torch.tensor([10, 12, 13, 15, 16])
    truncated = torch.tensor([False, False, False, False, True])
    rewards = torch.full((5,), 10.0, dtype=F64)
    dapo = algorithm_config("DAPO", overlong_penalty_scale=10.0)
    # Penalties x10: 0, 0, -2.5, -7.5, -10; the truncated one first loses its reward (-> 0).
    shaped = shape_rewards(rewards, lengths, truncated, dapo, max_new_tokens=16)
    torch.testing.assert_close(shaped, torch.tensor([10.0, 10.0, 7.5, 2.5, -10.0], dtype=F64), rtol=0, atol=1e-12)
    grouped = shape_rewards(rewards[:4].reshape(2, 2), lengths[:4], truncated[:4], dapo, max_new_tokens=16)
    assert grouped.shape == (2, 2)
    grpo = algorithm_config("GRPO")
    assert torch.equal(shape_rewards(rewards, lengths, truncated, grpo, max_new_tokens=16), rewards)


def test_overlong_filtering_masks_truncated_samples_only_when_enabled():
    truncated = torch.tensor([False, True, False])
    assert overlong_sample_mask(truncated, algorithm_config("DAPO")).tolist() == [True, False, True]
    assert overlong_sample_mask(truncated, algorithm_config("GRPO")).tolist() == [True, True, True]
