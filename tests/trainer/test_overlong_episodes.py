"""DAPO's soft overlong punishment weighs the model's own tokens against max_new_tokens: an episode's observation
tokens (tool output, the environment's turns), which share the response with them, are never counted. Hand-computed,
through the trainer's real update."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from strategy_helpers import VOCAB, make_tiny_model, strategy_config

from zerobubble.common.codec import encode_array
from zerobubble.trainer.algorithms import algorithm_config
from zerobubble.trainer.collate import collate
from zerobubble.trainer.strategies import make_strategy
from zerobubble.trainer.update import PolicyUpdate, UpdateSettings
from zerobubble.v1 import common_pb2

MAX_NEW_TOKENS = 16
# The penalty zone: 12 < model tokens <= 16, penalty (12 - L) / 4 (overlong_cache_length 4, scale 1).
DAPO = {"soft_overlong_punishment": True, "overlong_cache_length": 4, "overlong_penalty_scale": 1.0}
# The episode fills the whole budget, 16 tokens, but the model wrote 8 of them: 4, an observation of 8, 4.
EPISODE_MASK = [1] * 4 + [0] * 8 + [1] * 4
SINGLE_TURN = 14  # tokens, all the model's: penalty (12 - 14) / 4 = -0.5


def group() -> common_pb2.ExperienceGroup:
    rng = np.random.default_rng(0)
    made = common_pb2.ExperienceGroup(prompt_ids=encode_array(rng.integers(3, VOCAB, 4, dtype=np.int32)))
    for length, mask in ((len(EPISODE_MASK), EPISODE_MASK), (SINGLE_TURN, None)):
        trajectory = made.trajectories.add(
            response_ids=encode_array(rng.integers(3, VOCAB, length, dtype=np.int32)),
            behaviour_logprobs=encode_array(np.full(length, -4.0, dtype=np.float32)),
            finish_reason=common_pb2.FINISH_REASON_STOP, reward=1.0, temperature=1.0, policy_version=0)
        if mask is not None:
            trajectory.loss_mask.CopyFrom(encode_array(np.asarray(mask, dtype=np.uint8)))
            trajectory.episode.CopyFrom(common_pb2.EpisodeInfo(turns=2, tool_calls=1))
    return made


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def test_an_episodes_observation_tokens_are_not_penalised_as_length(model_dir):
    batch = collate([group()], pad_id=0)
    with make_strategy(strategy_config(), model_dir) as strategy:
        update = PolicyUpdate(strategy, algorithm_config("DAPO", beta=0.0, **DAPO),
                              UpdateSettings(1, 4, max_new_tokens=MAX_NEW_TOKENS))
        advantages = update.sample_advantages(batch)
        figures = update(batch, 0)
    # Shaped rewards: the episode keeps 1.0 (8 model tokens, outside the zone; its 16 tokens would have cost it
    # -1.0), the single-turn response 1 - 0.5 = 0.5.
    assert figures["reward_mean"] == pytest.approx(0.75, abs=1e-6)
    assert figures["reward_std"] == pytest.approx(0.5 / 2 ** 0.5, abs=1e-6)  # the unbiased std of [1.0, 0.5]
    # GRPO's estimator (DAPO's): (r - 0.75) / (std + 1e-4), so the episode is the better of the two.
    expected = 0.25 / (0.5 / 2 ** 0.5 + 1e-4)
    assert advantages == pytest.approx([expected, -expected], abs=1e-5)
    assert torch.equal(batch.response_lengths, torch.tensor([8.0, 14.0]))
