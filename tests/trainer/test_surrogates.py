"""CISPO, SAPO and DPPO worked by hand: the per-token losses and their gradients on tokens chosen so that each
formula's distinctive case shows (a ratio past the clip that CISPO still learns from, SAPO's gate away from 1, DPPO's
mask acting only in the advantage's direction), and each preset's loss through the trainer's real update."""

from __future__ import annotations

import math

import pytest
import torch
from behaviour_cases import GENERATIONS, GROUPS, behaviour_groups, own_logprobs
from strategy_helpers import make_tiny_model, strategy_config

from zerobubble.trainer.algorithms import algorithm_config, policy_loss
from zerobubble.trainer.collate import collate
from zerobubble.trainer.strategies import make_strategy
from zerobubble.trainer.update import PolicyUpdate, UpdateSettings

F64 = torch.float64
# One sample of four tokens: old probabilities 0.5; the current ones 0.5, 0.8, 0.25, 0.2 (ratios 1, 1.6, 0.5, 0.4).
OLD = torch.log(torch.tensor([[0.5, 0.5, 0.5, 0.5]], dtype=F64))
NEW = [0.5, 0.8, 0.25, 0.2]
ADVANTAGES = torch.tensor([[1.0, 1.0, -1.0, 1.0]], dtype=F64)
MASK = torch.ones(1, 4, dtype=torch.bool)


def loss_and_grad(preset: str, **overrides):
    logp = torch.log(torch.tensor([NEW], dtype=F64)).requires_grad_()
    config = algorithm_config(preset, off_policy="none", **overrides)
    loss, stats = policy_loss(logp, OLD, ADVANTAGES, MASK, config, normaliser=4.0)
    loss.backward()
    return loss.item(), logp.grad[0].tolist(), stats


def test_cispo_keeps_the_gradient_of_tokens_past_the_clip_with_a_capped_detached_weight():
    loss, grad, stats = loss_and_grad("CISPO")
    # weights sg(min(r, 1.28)): 1, 1.28, 0.5, 0.4; loss -sum(w A log pi) / 4; d/dlog pi = -w A / 4.
    weights, advantages = [1.0, 1.28, 0.5, 0.4], [1.0, 1.0, -1.0, 1.0]
    expected = -sum(w * a * math.log(p) for w, a, p in zip(weights, advantages, NEW, strict=True)) / 4
    assert loss == pytest.approx(expected, abs=1e-12)
    assert grad == pytest.approx([-w * a / 4 for w, a in zip(weights, advantages, strict=True)], abs=1e-12)
    assert grad[1] != 0, "PPO's clip would zero this token (r = 1.6 > 1.28 with A > 0); CISPO does not"
    assert stats.clip_fraction.item() == pytest.approx(0.25)


def test_sapo_gates_the_ratio_softly_with_its_two_temperatures():
    loss, grad, _ = loss_and_grad("SAPO", aggregation="token_level")
    expected_loss, expected_grad = 0.0, []
    for p, a in zip(NEW, [1.0, 1.0, -1.0, 1.0], strict=True):
        r, tau = p / 0.5, 1.0 if a > 0 else 1.05
        s = 1 / (1 + math.exp(-tau * (r - 1)))
        expected_loss += -(4 / tau) * s * a / 4
        expected_grad.append(-4 * s * (1 - s) * r * a / 4)   # d/dlog pi of (4/tau) sigmoid(tau (r - 1)) = 4 s (1-s) r
    assert loss == pytest.approx(expected_loss, abs=1e-12)
    assert grad == pytest.approx(expected_grad, abs=1e-12)
    assert grad[0] == pytest.approx(-1 / 4, abs=1e-12), "at r = 1 the gate's gradient is the plain one"


def test_dppo_masks_a_token_only_when_it_moved_past_delta_the_way_its_advantage_pushes():
    loss, grad, stats = loss_and_grad("DPPO")
    # moved = p - p_old: 0, +0.3 (A > 0: masked), -0.25 (A < 0: masked), -0.3 (A > 0, against the push: kept).
    assert loss == pytest.approx(-(1.0 * 1 + 0.4 * 1) / 4, abs=1e-12)
    assert grad == pytest.approx([-1.0 / 4, 0.0, 0.0, -0.4 / 4], abs=1e-12)
    assert stats.clip_fraction.item() == pytest.approx(0.5)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.mark.parametrize("preset", ["CISPO", "SAPO", "DPPO"])
def test_each_preset_trains_with_its_hand_computed_loss_in_the_real_update(model_dir, preset):
    shift = 0.1   # behaviour weight e^0.1 on every token, below the cap
    batch = collate(behaviour_groups(model_dir, shift), pad_id=0)
    with make_strategy(strategy_config(), model_dir) as strategy:
        update = PolicyUpdate(strategy, algorithm_config(preset), UpdateSettings(1, 8, max_new_tokens=8))
        loss = update(batch, 0)["loss"]
    rewards = batch.rewards.reshape(GROUPS, GENERATIONS)
    advantages = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)).reshape(-1, 1)
    mask = batch.response_mask.bool()
    weight = math.exp(shift)
    # One update from the weights that drew the samples: r = 1 on every token, so each surrogate shows its value
    # at 1 (CISPO's carries log pi itself; SAPO's gate is 4 / tau * 1/2; DPPO's mask keeps everything).
    if preset == "CISPO":
        per_token = -weight * advantages * own_logprobs(model_dir, batch)
    elif preset == "SAPO":
        tau = torch.where(advantages > 0, 1.0, 1.05)
        per_token = (-weight * (4 / tau) * 0.5 * advantages).expand_as(mask)
    else:
        per_token = (-weight * advantages).expand_as(mask)
    per_token = torch.where(mask, per_token, 0.0)
    if preset == "SAPO":   # each sample's token mean, then the mean over samples
        expected = (per_token.sum(1) / mask.sum(1)).mean()
    else:
        expected = per_token.sum() / mask.sum()
    assert loss == pytest.approx(float(expected), abs=1e-5)
