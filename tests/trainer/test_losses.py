"""The policy loss: hand-computed values for each variant, exact gradient accumulation, padding invariance."""

from __future__ import annotations

import math

import pytest
import torch
from algorithm_cases import TinyPolicy, policy_logprobs, ragged_batch

from zerobubble.trainer.algorithms import algorithm_config, local_normaliser, mini_batch_normaliser, policy_loss

F64 = torch.float64
LN = math.log

# Two samples, old_logp = 0 so ratio = exp(logp); sample 0 has 2 tokens (A = +1), sample 1 has 1 token (A = -2).
RATIOS = [[1.5, 0.9, 1.0], [0.7, 1.0, 1.0]]
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
ADVANTAGES = torch.tensor([1.0, -2.0], dtype=F64)
# With eps 0.2/0.28 (DAPO):
#   r=1.5, A=1:  min(1.5, 1.28) = 1.28            -> loss -1.28 (clipped)
#   r=0.9, A=1:  min(0.9, 0.9)  = 0.9             -> loss -0.9
#   r=0.7, A=-2: min(-1.4, clamp(0.7)=0.8 * -2)   -> loss 1.6  (clipped)
TOKEN_SUM = -1.28 - 0.9 + 1.6


def _logp(ratios=RATIOS):
    return torch.log(torch.tensor(ratios, dtype=F64)).requires_grad_()


def _dapo(**overrides):
    return algorithm_config("DAPO", **overrides)


def _clip_only(**overrides):
    """DAPO with the ratio against old_logp and no behaviour weight: the clip's own arithmetic."""
    return _dapo(off_policy="none", **overrides)


def test_token_level_loss_divides_the_token_sum_by_effective_tokens():
    logp = _logp()
    loss, stats = policy_loss(logp, torch.zeros(2, 3, dtype=F64), ADVANTAGES, MASK, _clip_only(), normaliser=3)
    assert loss.item() == pytest.approx(TOKEN_SUM / 3, abs=1e-12)
    loss.backward()
    # d(-r*A)/dlogp = -r*A only where the unclipped term is the minimum (r=0.9 token): -0.9 / 3.
    expected = torch.tensor([[0.0, -0.3, 0.0], [0.0, 0.0, 0.0]], dtype=F64)
    torch.testing.assert_close(logp.grad, expected, rtol=0, atol=1e-12)
    assert stats.clip_fraction.item() == pytest.approx(2 / 3)
    assert stats.ratio_mean.item() == pytest.approx((1.5 + 0.9 + 0.7) / 3)
    assert stats.effective_tokens.item() == 3
    assert stats.clip_high_fraction.item() == pytest.approx(1 / 3)
    assert stats.clip_low_fraction.item() == pytest.approx(1 / 3)
    assert stats.kl_mean is None and stats.entropy_mean is None and stats.behaviour_weight_mean is None


def test_sample_level_loss_averages_each_samples_token_mean():
    # Sample 0: (-1.28 - 0.9) / 2 = -1.09; sample 1: 1.6; mean over 2 samples 0.255.
    config = _clip_only(aggregation="sample_level")
    loss, _ = policy_loss(_logp(), torch.zeros(2, 3, dtype=F64), ADVANTAGES, MASK, config, normaliser=2)
    assert loss.item() == pytest.approx(0.255, abs=1e-12)


def test_constant_normalisation_divides_by_samples_times_max_new_tokens():
    # Dr.GRPO with max_new_tokens 4: -0.58 / (2 * 4) = -0.0725.
    config = _clip_only(aggregation="constant")
    normaliser = local_normaliser(MASK, "constant", max_new_tokens=4)
    assert normaliser.item() == 8
    loss, _ = policy_loss(_logp(), torch.zeros(2, 3, dtype=F64), ADVANTAGES, MASK, config, normaliser=normaliser)
    assert loss.item() == pytest.approx(-0.0725, abs=1e-12)


def test_k3_kl_is_added_with_weight_beta_only_when_beta_is_positive():
    # Ratio 1 and A = 0, so only the KL remains: ref - logp = ln 2 -> k3 = 2 - ln 2 - 1; the other token 0.
    logp = torch.zeros(1, 2, dtype=F64, requires_grad=True)
    ref = torch.tensor([[LN(2.0), 0.0]], dtype=F64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    config = _clip_only(beta=0.5)
    loss, stats = policy_loss(logp, logp.detach(), torch.zeros(1), mask, config, normaliser=2, ref_logp=ref)
    assert loss.item() == pytest.approx(0.5 * (1 - LN(2.0)) / 2, abs=1e-12)
    assert stats.kl_mean.item() == pytest.approx((1 - LN(2.0)) / 2, abs=1e-12)
    loss.backward()
    # d/dlogp [exp(ref - logp) - (ref - logp) - 1] = 1 - exp(ref - logp) = -1 at the first token; * 0.5 / 2.
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.25, 0.0]], dtype=F64), rtol=0, atol=1e-12)
    unweighted, stats = policy_loss(logp, logp.detach(), torch.zeros(1), mask, _clip_only(), normaliser=2, ref_logp=ref)
    assert unweighted.item() == 0.0 and stats.kl_mean is not None
    with pytest.raises(ValueError, match="needs ref_logp"):
        policy_loss(logp, logp.detach(), torch.zeros(1), mask, config, normaliser=2)


def test_gspo_clips_the_length_normalised_sequence_ratio():
    # Sample 0: token ratios 1.44 and 1 -> s = exp((ln 1.44 + 0) / 2) = 1.2 < 1.28, A = 1: loss -1.2 per token.
    # Sample 1: s = 0.5, A = -1 -> min(-0.5, 0.8 * -1) = -0.8 -> loss 0.8 (clipped).
    # Sample level: (-1.2 + 0.8) / 2 = -0.2.
    logp = _logp([[1.44, 1.0, 1.0], [0.5, 1.0, 1.0]])
    config = _clip_only(aggregation="sample_level", ratio_level="sequence")
    loss, stats = policy_loss(logp, torch.zeros(2, 3, dtype=F64), torch.tensor([1.0, -1.0]), MASK, config,
                              normaliser=2)
    assert loss.item() == pytest.approx(-0.2, abs=1e-12)
    loss.backward()
    # d(-s*A)/dlogp_t = -A * s / len = -1.2 / 2 per token of sample 0, then / 2 samples; sample 1 is clipped.
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.3, -0.3, 0.0], [0.0, 0.0, 0.0]], dtype=F64),
                               rtol=0, atol=1e-12)
    assert stats.clip_fraction.item() == pytest.approx(1 / 3)
    assert stats.ratio_mean.item() == pytest.approx((1.2 + 1.2 + 0.5) / 3)


# One sample of three tokens under DAPO's clip 0.2/0.28, normalised by 3 tokens, A = [1, 1, -1].
# The update's ratio to the policy before the step r = pi / pi_old = [1.5, 0.9, 1.0]; the behaviour weight
# w = pi_old / pi_behaviour = [2, 0.5, 8], so the ratio to the sampler pi / pi_behaviour = [3, 0.45, 8].
OFF_MASK = torch.ones(1, 3, dtype=torch.bool)
OFF_ADVANTAGES = torch.tensor([[1.0, 1.0, -1.0]], dtype=F64)
OFF_BEHAVIOUR = torch.tensor([[-LN(2.0), LN(2.0), -LN(8.0)]], dtype=F64)


def _off_policy_loss(**overrides):
    logp = torch.log(torch.tensor([[1.5, 0.9, 1.0]], dtype=F64)).requires_grad_()
    loss, stats = policy_loss(logp, torch.zeros(1, 3, dtype=F64), OFF_ADVANTAGES, OFF_MASK, _dapo(**overrides),
                              normaliser=3, behaviour_logp=OFF_BEHAVIOUR)
    loss.backward()
    return loss.item(), logp.grad, stats


def test_decoupled_objective_clips_against_the_old_policy_and_drops_tokens_whose_weight_exceeds_the_cap():
    # Per token -min(r A, clip(r) A) * w, w over the cap 5 dropped:
    #   -1.28 * 2 (clipped above) = -2.56;  -0.9 * 0.5 = -0.45;  w = 8 > 5: 0.   (-2.56 - 0.45) / 3.
    loss, grad, stats = _off_policy_loss()
    assert loss == pytest.approx(-3.01 / 3, abs=1e-12)
    # Only the unclipped, kept token moves: d(-r A w)/dlogp = -0.9 * 0.5, over 3 tokens.
    torch.testing.assert_close(grad, torch.tensor([[0.0, -0.15, 0.0]], dtype=F64), rtol=0, atol=1e-12)
    assert stats.behaviour_weight_mean.item() == pytest.approx((2 + 0.5 + 8) / 3, abs=1e-12)
    assert stats.behaviour_weight_max.item() == pytest.approx(8.0, abs=1e-12)
    assert stats.capped_fraction.item() == pytest.approx(1 / 3)
    assert stats.clip_fraction.item() == pytest.approx(1 / 3)
    assert stats.clip_high_fraction.item() == pytest.approx(1 / 3) and stats.clip_low_fraction.item() == 0
    assert stats.ratio_mean.item() == pytest.approx((1.5 + 0.9 + 1.0) / 3, abs=1e-12)


def test_truncated_is_keeps_the_token_over_the_cap_at_the_cap():
    # As decoupled, but the third token weighs min(8, 5) = 5: -(1.0 * -1) * 5 = +5.   (-2.56 - 0.45 + 5) / 3.
    loss, grad, stats = _off_policy_loss(off_policy="truncated_is")
    assert loss == pytest.approx(1.99 / 3, abs=1e-12)
    torch.testing.assert_close(grad, torch.tensor([[0.0, -0.15, 5 / 3]], dtype=F64), rtol=0, atol=1e-12)
    assert stats.capped_fraction.item() == pytest.approx(1 / 3)
    assert stats.behaviour_weight_max.item() == pytest.approx(8.0, abs=1e-12)


def test_behaviour_ratio_clips_the_ratio_to_the_sampler_without_a_weight():
    # Colossal-RL: ratio pi / pi_behaviour = [3, 0.45, 8]:
    #   min(3, 1.28) = 1.28 -> -1.28 (clipped);  min(0.45, 0.8) -> -0.45;  A = -1: min(-8, -1.28) -> +8.
    loss, grad, stats = _off_policy_loss(off_policy="behaviour_ratio")
    assert loss == pytest.approx((-1.28 - 0.45 + 8) / 3, abs=1e-12)
    torch.testing.assert_close(grad, torch.tensor([[0.0, -0.15, 8 / 3]], dtype=F64), rtol=0, atol=1e-12)
    assert stats.ratio_mean.item() == pytest.approx((3 + 0.45 + 8) / 3, abs=1e-12)
    assert stats.behaviour_weight_mean is None and stats.capped_fraction is None
    # The policy before the update is not read at all.
    logp = torch.zeros(1, 3, dtype=F64, requires_grad=True)
    without_old, _ = policy_loss(logp, None, OFF_ADVANTAGES, OFF_MASK, _dapo(off_policy="behaviour_ratio"),
                                 normaliser=3, behaviour_logp=OFF_BEHAVIOUR)
    assert torch.isfinite(without_old)


def test_no_correction_ignores_the_sampler():
    loss, grad, stats = _off_policy_loss(off_policy="none")
    assert loss == pytest.approx((-1.28 - 0.9 + 1.0) / 3, abs=1e-12)
    torch.testing.assert_close(grad, torch.tensor([[0.0, -0.3, 1 / 3]], dtype=F64), rtol=0, atol=1e-12)
    assert stats.behaviour_weight_mean is None


def test_gspo_behaviour_weight_is_the_length_normalised_sequence_weight():
    # old - behaviour = ln 4 and 0 -> w = exp(ln 4 / 2) = 2 for the whole sample; ratio 1, A = 1: -2 per token.
    logp = torch.zeros(1, 2, dtype=F64, requires_grad=True)
    config = _dapo(aggregation="sample_level", ratio_level="sequence")
    loss, stats = policy_loss(logp, torch.zeros(1, 2, dtype=F64), torch.ones(1), torch.ones(1, 2, dtype=torch.bool),
                              config, normaliser=1, behaviour_logp=torch.tensor([[-LN(4.0), 0.0]], dtype=F64))
    assert loss.item() == pytest.approx(-2.0, abs=1e-12)
    assert stats.behaviour_weight_max.item() == pytest.approx(2.0, abs=1e-12)


def test_missing_log_probs_are_named():
    logp = torch.zeros(1, 3, dtype=F64, requires_grad=True)
    with pytest.raises(ValueError, match="needs behaviour_logp"):
        policy_loss(logp, logp.detach(), OFF_ADVANTAGES, OFF_MASK, _dapo(), normaliser=3)
    with pytest.raises(ValueError, match="needs old_logp"):
        policy_loss(logp, None, OFF_ADVANTAGES, OFF_MASK, _dapo(), normaliser=3, behaviour_logp=OFF_BEHAVIOUR)


def test_entropy_mean_is_reported_over_effective_tokens():
    entropy = torch.tensor([[1.0, 2.0, 100.0], [4.0, 100.0, 100.0]], dtype=F64)
    _, stats = policy_loss(_logp(), torch.zeros(2, 3, dtype=F64), ADVANTAGES, MASK, _clip_only(), normaliser=3,
                           entropy=entropy)
    assert stats.entropy_mean.item() == pytest.approx(7 / 3)


VARIANTS = {
    "token_level": dict(aggregation="token_level"),
    "sample_level": dict(aggregation="sample_level"),
    "constant": dict(aggregation="constant"),
    "gspo": dict(aggregation="sample_level", ratio_level="sequence", clip_low=0.05, clip_high=0.05),
    "kl_and_truncated_is": dict(aggregation="token_level", beta=0.1, off_policy="truncated_is",
                                behaviour_weight_cap=1.2),
    "decoupled_dropping": dict(aggregation="token_level", off_policy="decoupled", behaviour_weight_cap=1.2),
    "behaviour_ratio": dict(aggregation="sample_level", off_policy="behaviour_ratio"),
}
MAX_NEW = 5


def _loss_and_grads(model, batch, config, normaliser):
    model.zero_grad()
    logp = policy_logprobs(model, batch)
    loss, _ = policy_loss(logp, batch.old_logp, batch.advantages, batch.response_mask, config,
                          normaliser=normaliser, ref_logp=batch.ref_logp, behaviour_logp=batch.behaviour_logp)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("variant", VARIANTS)
def test_gradient_accumulation_over_uneven_micro_batches_equals_one_big_batch(variant):
    config = _dapo(**VARIANTS[variant])
    model, batch = TinyPolicy(), ragged_batch(num_samples=7, max_response=MAX_NEW)
    whole = mini_batch_normaliser([batch.response_mask], config.aggregation, max_new_tokens=MAX_NEW)
    big_loss, big_grads = _loss_and_grads(model, batch, config, whole)
    assert any(g.abs().max() > 1e-3 for g in big_grads)

    micro = [batch.rows(slice(0, 2)), batch.rows(slice(2, 3)), batch.rows(slice(3, 7))]
    normaliser = mini_batch_normaliser([m.response_mask for m in micro], config.aggregation, max_new_tokens=MAX_NEW)
    assert normaliser.item() == whole.item()
    total_loss, summed = 0.0, [torch.zeros_like(g) for g in big_grads]
    for part in micro:
        loss, grads = _loss_and_grads(model, part, config, normaliser)
        total_loss += loss
        summed = [s + g for s, g in zip(summed, grads, strict=True)]
    torch.testing.assert_close(total_loss, big_loss, rtol=1e-12, atol=1e-14)
    for accumulated, single in zip(summed, big_grads, strict=True):
        torch.testing.assert_close(accumulated, single, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("variant", VARIANTS)
def test_garbage_in_padding_changes_neither_loss_nor_gradients(variant):
    config = _dapo(**VARIANTS[variant])
    logp = torch.log(torch.tensor([[0.3, 0.5, 0.2], [0.6, 0.1, 0.9]], dtype=F64)).requires_grad_()
    old, ref, behaviour = logp.detach() + 0.1, logp.detach() - 0.2, logp.detach() + 0.05
    advantages = torch.tensor([[0.7, 0.7, 0.7], [-1.3, -1.3, -1.3]], dtype=F64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)

    def run(tensors, mask):
        logp_leaf = tensors[0].detach().requires_grad_()
        loss, _ = policy_loss(logp_leaf, *tensors[1:3], mask, config, normaliser=5.0, ref_logp=tensors[3],
                              behaviour_logp=tensors[4])
        loss.backward()
        return loss.detach(), logp_leaf.grad

    clean_loss, clean_grad = run([logp, old, advantages, ref, behaviour], mask)
    garbage = torch.tensor([[float("nan"), 1e4, -1e4], [float("inf"), -float("inf"), 3e3]], dtype=F64)
    padded = [torch.cat([t, garbage], dim=1) for t in (logp, old, advantages, ref, behaviour)]
    padded[1][1, 2] = 777.0  # a masked position inside the original width as well
    padded_mask = torch.cat([mask, torch.zeros(2, 3, dtype=torch.bool)], dim=1)
    padded_rows = [torch.cat([t, torch.full((1, 6), 5e3, dtype=F64)]) for t in padded]
    rows_mask = torch.cat([padded_mask, torch.zeros(1, 6, dtype=torch.bool)])
    padded_loss, padded_grad = run(padded_rows, rows_mask)
    assert torch.isfinite(padded_grad).all()
    # Equal up to summation order over a wider tensor.
    torch.testing.assert_close(padded_loss, clean_loss, rtol=1e-14, atol=0)
    torch.testing.assert_close(padded_grad[:2, :3], clean_grad, rtol=1e-14, atol=0)
    assert torch.all(padded_grad[~rows_mask] == 0)


def test_normalisers_count_tokens_effective_samples_or_the_constant_budget():
    masks = [torch.tensor([[1, 1, 0], [0, 0, 0]], dtype=torch.bool), torch.tensor([[1, 1, 1]], dtype=torch.bool)]
    assert mini_batch_normaliser(masks, "token_level").item() == 5
    # A sample with no effective token (filtered) does not count for sample_level.
    assert mini_batch_normaliser(masks, "sample_level").item() == 2
    assert mini_batch_normaliser(masks, "constant", max_new_tokens=8).item() == 3 * 8
    # Summed over ranks, never averaged: the strategies sum gradients over ranks.
    assert mini_batch_normaliser(masks, "token_level", sum_over_ranks=lambda local: local * 3).item() == 15
    # Nothing to learn from: the normaliser stays 1 so the loss is 0, not NaN.
    assert mini_batch_normaliser([torch.zeros(2, 3, dtype=torch.bool)], "token_level").item() == 1
    with pytest.raises(ValueError, match="max_new_tokens"):
        local_normaliser(masks[0], "constant")
