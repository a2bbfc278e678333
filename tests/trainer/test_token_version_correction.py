"""A response whose tokens two policy versions drew, from the rollout worker's message to the trainer's decoupled
correction: each token weighted by pi_old / pi_behaviour with its own behaviour log-prob, and staleness counted
per token."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from zerobubble.common.codec import decode_array
from zerobubble.rollout.engine import Sample
from zerobubble.rollout.experience import experience_group, single_turn
from zerobubble.trainer.algorithms import algorithm_config, policy_loss
from zerobubble.trainer.algorithms.losses import behaviour_weight
from zerobubble.trainer.collate import collate
from zerobubble.trainer.loop import experience_figures
from zerobubble.v1 import common_pb2, reward_pb2

LN = math.log
F64 = torch.float64
# Sample 0: tokens 0-1 drawn by version 0, tokens 2-3 by version 1. Sample 1: two tokens, all version 1.
BEHAVIOUR = [[LN(0.5), LN(0.25), LN(0.8), LN(0.4)], [LN(0.5), LN(0.5)]]
VERSIONS = [[0, 0, 1, 1], [1, 1]]
# The trainer's weights before the update (version 2), on the same tokens.
OLD = [[LN(0.5), LN(0.5), LN(0.4), LN(0.4)], [LN(0.25), LN(0.5), 0.0, 0.0]]
# pi_old / pi_behaviour by hand: 0.5/0.5, 0.5/0.25, 0.4/0.8, 0.4/0.4; 0.25/0.5, 0.5/0.5.
RAW = [[1.0, 2.0, 0.5, 1.0], [0.5, 1.0, 0.0, 0.0]]
CAP = 1.5   # the decoupled objective drops tokens above it: token 1 of sample 0


def scored_group() -> common_pb2.ExperienceGroup:
    samples = [Sample(token_ids=np.arange(len(v)) + 10, logprobs=np.asarray(b), finish_reason="stop",
                      versions=np.asarray(v)) for b, v in zip(BEHAVIOUR, VERSIONS, strict=True)]
    scores = [reward_pb2.ScoreResult(reward=1.0, answer_ok=True), reward_pb2.ScoreResult(reward=0.0)]
    played = [single_turn([1, 2, 3], sample, policy_version=7, temperature=1.0) for sample in samples]
    return experience_group(common_pb2.Prompt(prompt_id="p"), [1, 2, 3], played, scores, producer_id="w",
                            producer_incarnation="i", sequence=1, lease_id="")


def test_the_message_carries_both_versions_and_each_tokens_behaviour_logprob():
    spanning, single = scored_group().trajectories
    assert spanning.policy_version == 0 and [(s.start, s.version) for s in spanning.version_spans] == [(0, 0), (2, 1)]
    assert single.policy_version == 1 and not single.version_spans
    np.testing.assert_allclose(decode_array(spanning.behaviour_logprobs, "b"), BEHAVIOUR[0], rtol=1e-6)


def test_correction_weights_per_token_follow_the_hand_computed_example():
    batch = collate([scored_group()], pad_id=0)
    torch.testing.assert_close(batch.token_versions[:, :2], torch.tensor([[0, 0], [1, 1]]))
    torch.testing.assert_close(batch.token_versions[0], torch.tensor([0, 0, 1, 1]))
    mask = batch.response_mask.bool()
    config = algorithm_config("DAPO", off_policy="decoupled", behaviour_weight_cap=CAP)
    old = torch.tensor(OLD, dtype=F64)
    weight = behaviour_weight(old, batch.behaviour_logprobs.to(F64), mask, config)
    torch.testing.assert_close(torch.where(mask, weight.raw, 0.0), torch.tensor(RAW, dtype=F64), atol=1e-6, rtol=0)
    torch.testing.assert_close(torch.where(mask, weight.applied, 0.0),
                               torch.tensor([[1.0, 0.0, 0.5, 1.0], [0.5, 1.0, 0.0, 0.0]], dtype=F64),
                               atol=1e-6, rtol=0)
    # At ratio 1 (logp = old) and advantage +1 / -1, each token's loss is -A w: (-(1 + 0 + 0.5 + 1) + (0.5 + 1)) / 6.
    loss, _ = policy_loss(old.clone().requires_grad_(), old, torch.tensor([1.0, -1.0], dtype=F64), mask, config,
                          normaliser=6.0, behaviour_logp=batch.behaviour_logprobs.to(F64))
    assert loss.item() == pytest.approx((-2.5 + 1.5) / 6, abs=1e-6)


def test_staleness_counts_each_token_from_the_version_that_drew_it():
    figures = experience_figures(collate([scored_group()], pad_id=0), policy_version=2)
    assert figures["staleness_mean"] == 1.5          # per sample, from its oldest token: (2 + 1) / 2
    assert figures["staleness_max"] == 2
    assert figures["staleness_token_mean"] == pytest.approx((2 + 2 + 1 + 1 + 1 + 1) / 6)
