"""A two-turn episode through the loss: only the tokens the model sampled count, in the loss, its normaliser, its
statistics and the trainer's real update; the observation tokens between turns are context, never targets."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from strategy_helpers import VOCAB, make_tiny_model, strategy_config

from zerobubble.common.codec import encode_array
from zerobubble.trainer.algorithms import algorithm_config, mini_batch_normaliser, policy_loss
from zerobubble.trainer.collate import collate
from zerobubble.trainer.loop import experience_figures
from zerobubble.trainer.strategies import make_strategy
from zerobubble.trainer.update import PolicyUpdate, UpdateSettings
from zerobubble.v1 import common_pb2

F64 = torch.float64
# Sample 0: turn one (2 tokens), an observation (2 tokens), turn two (1 token); sample 1: 1, 1, 1.
MASKS = [[1, 1, 0, 0, 1], [1, 0, 1]]


def episode_group(rng, masks=MASKS, *, observation_logprob=0.0, rewards=(1.0, 0.0)):
    group = common_pb2.ExperienceGroup(prompt_ids=encode_array(rng.integers(3, VOCAB, 4, dtype=np.int32)))
    for mask, reward in zip(masks, rewards, strict=True):
        mask = np.asarray(mask, dtype=np.uint8)
        logprobs = (-5.6 + 0.3 * rng.standard_normal(len(mask))).astype(np.float32)
        logprobs[mask == 0] = observation_logprob
        group.trajectories.add(
            response_ids=encode_array(rng.integers(3, VOCAB, len(mask), dtype=np.int32)),
            behaviour_logprobs=encode_array(logprobs), loss_mask=encode_array(mask),
            finish_reason=common_pb2.FINISH_REASON_STOP, reward=reward, temperature=1.0, policy_version=0)
    return group


def test_the_hand_computed_loss_of_a_two_turn_episode_counts_the_models_tokens_only():
    group = episode_group(np.random.default_rng(0))
    group.trajectories[0].episode.CopyFrom(common_pb2.EpisodeInfo(turns=2, tool_calls=1))
    group.trajectories[1].episode.CopyFrom(common_pb2.EpisodeInfo(turns=2, tool_calls=0))
    batch = collate([group], pad_id=0)
    mask = batch.response_mask.bool()
    assert mask.tolist() == [[True, True, False, False, True], [True, False, True, False, False]]
    assert batch.response_lengths.tolist() == [3.0, 2.0]
    figures = experience_figures(batch, policy_version=0)
    assert (figures["response_length_mean"], figures["response_length_max"]) == (2.5, 3.0)
    assert figures["tokens"] == 4 + 4 + 5 + 3    # prompts and responses, observations included: what was computed
    assert (figures["turns_mean"], figures["tool_calls_mean"]) == (2.0, 0.5)
    # Ratios against old log-probs of 0; the observation positions get ratio 5, which would move every figure.
    ratios = torch.tensor([[1.1, 0.9, 5.0, 5.0, 1.0], [0.7, 5.0, 1.0, 5.0, 5.0]], dtype=F64)
    logp = ratios.log().requires_grad_()
    advantages = torch.tensor([1.0, -2.0], dtype=F64)
    algorithm = algorithm_config("DAPO", off_policy="none")
    normaliser = mini_batch_normaliser([mask], algorithm.aggregation, max_new_tokens=8)
    assert normaliser.item() == 5    # model tokens, not the 8 response tokens
    loss, stats = policy_loss(logp, torch.zeros_like(logp), advantages, mask, algorithm, normaliser=normaliser)
    # Per model token, -min(r*A, clip(r, 0.8, 1.28)*A): -1.1, -0.9, -1.0 (A=1); 1.6 (clipped), 2.0 (A=-2).
    assert loss.item() == pytest.approx((-1.1 - 0.9 - 1.0 + 1.6 + 2.0) / 5, abs=1e-12)
    loss.backward()
    expected = torch.tensor([[-1.1, -0.9, 0, 0, -1.0], [0, 0, 2.0, 0, 0]], dtype=F64) / 5
    torch.testing.assert_close(logp.grad, expected, rtol=0, atol=1e-12)
    assert stats.effective_tokens.item() == 5
    assert stats.clip_fraction.item() == pytest.approx(1 / 5)
    assert stats.ratio_mean.item() == pytest.approx((1.1 + 0.9 + 1.0 + 0.7 + 1.0) / 5)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def updated_weights(model_dir, groups):
    with make_strategy(strategy_config(), model_dir) as strategy:
        update = PolicyUpdate(strategy, algorithm_config("GRPO", beta=0.0, off_policy="behaviour_ratio"),
                              UpdateSettings(1, 4, max_new_tokens=8))
        return update(collate(groups, pad_id=0), 0), {name: t.clone() for name, t in strategy.full_state_dict()}


def test_the_real_update_never_reads_the_observation_positions(model_dir):
    _, weights = updated_weights(model_dir, [episode_group(np.random.default_rng(1))])
    # Log-probs at the observation positions that would dominate a behaviour-weighted loss, if it read them.
    _, same = updated_weights(model_dir, [episode_group(np.random.default_rng(1), observation_logprob=-40.0)])
    for name, tensor in weights.items():
        torch.testing.assert_close(same[name], tensor, rtol=0, atol=0, msg=name)
    # Without the masks the same tokens train differently: the comparison above can tell.
    unmasked = episode_group(np.random.default_rng(1), observation_logprob=-40.0)
    for trajectory in unmasked.trajectories:
        trajectory.ClearField("loss_mask")
    _, differs = updated_weights(model_dir, [unmasked])
    assert any(not torch.equal(differs[name], tensor) for name, tensor in weights.items())
