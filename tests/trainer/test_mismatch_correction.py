"""An engine gap injected on chosen tokens (behaviour log-probs lowered there, weights pi_old / pi_behaviour above
1): the gap figure reports it on the tokens of the trained version only, and each mismatch mask leaves out exactly
the tokens or samples its rule names, in the loss and its gradient."""

from __future__ import annotations

import math

import pytest
import torch
from behaviour_cases import behaviour_groups
from strategy_helpers import make_tiny_model, strategy_config

from zerobubble.trainer.algorithms import algorithm_config, policy_loss
from zerobubble.trainer.collate import collate
from zerobubble.trainer.strategies import make_strategy
from zerobubble.trainer.update import PolicyUpdate, UpdateSettings

F64 = torch.float64
# Log behaviour weights of four samples of four tokens, within [log 0.5, log 2] unless said: sample 0 has one
# token far out (e^1.5 = 4.5); sample 1 every token mildly up (e^0.3 = 1.35, product e^1.2 = 3.3); sample 2 none;
# sample 3 every token out (e^0.8 = 2.2, geometric mean 2.2).
SHIFTS = torch.tensor([[0.0, 1.5, 0.0, 0.0], [0.3] * 4, [0.0] * 4, [0.8] * 4], dtype=F64)
MASK = torch.ones(4, 4, dtype=torch.bool)
ADVANTAGES = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=F64)
KEPT = {
    "none": [[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]],
    "icepop": [[1, 0, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0]],
    "sequence": [[0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]],
    "geometric_mean": [[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0]],
}


def masked_step(mode: str, off_policy: str = "truncated_is", current=None):
    old = torch.full((4, 4), math.log(0.3), dtype=F64)
    logp = old.clone().requires_grad_()
    config = algorithm_config("GRPO", beta=0.0, aggregation="token_level", off_policy=off_policy,
                              behaviour_weight_cap=10.0, mismatch_mask=mode)
    loss, stats = policy_loss(logp, old, ADVANTAGES, MASK, config, normaliser=16.0, behaviour_logp=old - SHIFTS,
                              current_tokens=current)
    loss.backward()
    return loss, logp.grad, stats


@pytest.mark.parametrize("mode", list(KEPT))
def test_each_mask_leaves_out_the_tokens_its_rule_names(mode):
    loss, grad, stats = masked_step(mode)
    kept = torch.tensor(KEPT[mode], dtype=torch.bool)
    # r = 1: each kept token's gradient is -w A / 16 (truncated IS weight w = e^shift under the cap of 10).
    expected = torch.where(kept, -SHIFTS.exp() * ADVANTAGES[:, None] / 16, 0.0)
    torch.testing.assert_close(grad, expected)
    assert loss.item() == pytest.approx(expected.sum().item(), abs=1e-12)   # the loss is sum(-w A) / 16 too
    if mode != "none":
        assert stats.mismatch_masked_fraction.item() == pytest.approx(1 - kept.double().mean().item())


def test_the_masks_apply_with_the_decoupled_objective_too():
    _, grad, _ = masked_step("icepop", off_policy="decoupled")
    assert (grad[3] == 0).all() and grad[0, 1] == 0 and (grad[2] != 0).all()


def test_the_gap_figure_counts_the_tokens_of_the_trained_version_only():
    current = torch.tensor([[True] * 4, [True] * 4, [True] * 4, [False] * 4])   # sample 3 is stale
    _, _, stats = masked_step("none", current=current)
    shifts = SHIFTS[:3]
    assert stats.gap_tokens.item() == 12
    assert stats.gap_abs_mean.item() == pytest.approx(shifts.mean().item(), abs=1e-12)
    # k3 of samples from pi_behaviour: r - 1 - log r with r = e^shift.
    assert stats.gap_kl_mean.item() == pytest.approx((shifts.exp() - 1 - shifts).mean().item(), abs=1e-12)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def test_the_real_update_reports_the_injected_gap_apart_from_staleness_and_masks_it(model_dir):
    # Group 0 drawn by version 1 (current), group 1 by version 0 (stale); the engine gap 1.0 on every second token
    # of the current group, and 2.0 on every stale token (which the figure must not count).
    batch = collate(behaviour_groups(model_dir, lambda g, i, t: (t % 2) * 1.0 if g == 0 else 2.0, versions=(1, 0)),
                    pad_id=0)
    current = batch.response_mask.bool() & (batch.token_versions == 1)
    shifted = current & (torch.arange(batch.response_mask.size(1)) % 2 == 1)
    fraction = shifted.sum().item() / current.sum().item()
    figures = {}
    for mode in ("none", "icepop"):
        with make_strategy(strategy_config(), model_dir) as strategy:
            update = PolicyUpdate(strategy, algorithm_config("DAPO", mismatch_mask=mode),
                                  UpdateSettings(1, 8, max_new_tokens=8))
            figures[mode] = update(batch, 1)
    assert figures["none"]["rollout_gap_abs"] == pytest.approx(fraction * 1.0, abs=1e-4)
    assert figures["none"]["rollout_gap_kl"] == pytest.approx(fraction * (math.e - 2), abs=1e-4)
    assert "mismatch_masked_fraction" not in figures["none"]
    # IcePop's band [0.5, 2] drops the current group's shifted tokens (e^1 = 2.7) and every stale one (e^2).
    all_tokens = batch.response_mask.sum().item()
    dropped = shifted.sum().item() + (batch.response_mask.bool() & (batch.token_versions == 0)).sum().item()
    assert figures["icepop"]["mismatch_masked_fraction"] == pytest.approx(dropped / all_tokens, abs=1e-6)
