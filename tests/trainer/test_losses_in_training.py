"""The loss as the trainer's own update step runs it (PolicyUpdate on a real strategy and the tiny Qwen2): the
recompute forward is skipped exactly when it cannot change anything, and data-parallel ranks, which sum their
gradients over a rank-summed normaliser, make the update of one process on the union of their data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from strategy_helpers import VOCAB, make_tiny_model, run_ranks, strategy_config

from zerobubble.common.codec import encode_array
from zerobubble.trainer.algorithms import algorithm_config
from zerobubble.trainer.collate import ExperienceBatch, collate
from zerobubble.trainer.strategies import make_strategy
from zerobubble.trainer.update import PolicyUpdate, UpdateSettings
from zerobubble.v1 import common_pb2

GENERATIONS = 4
MICRO = 3
CONFIGS = {"grpo": ("GRPO", {"beta": 0.0}), "dapo": ("DAPO", {})}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def experience(groups: int, versions: list[int], seed: int = 0) -> list[common_pb2.ExperienceGroup]:
    """Groups of ragged responses with mixed rewards; group g's samples were drawn by weights versions[g]."""
    rng = np.random.default_rng(seed)
    out = []
    for g in range(groups):
        group = common_pb2.ExperienceGroup(prompt_ids=encode_array(rng.integers(3, VOCAB, 5, dtype=np.int32)))
        for i in range(GENERATIONS):
            length = int(rng.integers(2, 7))
            group.trajectories.add(
                response_ids=encode_array(rng.integers(3, VOCAB, length, dtype=np.int32)),
                # Near the tiny model's own log-probs (about -ln 260), so that weights spread around 1.
                behaviour_logprobs=encode_array((-5.6 + 0.5 * rng.standard_normal(length)).astype(np.float32)),
                finish_reason=common_pb2.FINISH_REASON_STOP, reward=float((i + g) % 2), temperature=0.9,
                policy_version=versions[g])
        out.append(group)
    return out


def counting_update(strategy, preset: str = "GRPO", mini_batches: int = 1, **overrides):
    """A PolicyUpdate and the list its model's forward calls are appended to."""
    calls: list[None] = []
    strategy.model.register_forward_pre_hook(lambda *_: calls.append(None))
    algorithm = algorithm_config(preset, **({"beta": 0.0} | overrides))
    return PolicyUpdate(strategy, algorithm, UpdateSettings(mini_batches, MICRO, max_new_tokens=8)), calls


def one_step(model_dir: Path, batch: ExperienceBatch, policy_version: int, **kwargs):
    with make_strategy(strategy_config(), model_dir) as strategy:
        update, calls = counting_update(strategy, **kwargs)
        figures = update(batch, policy_version)
        return len(calls), figures, {name: t.clone() for name, t in strategy.full_state_dict()}


def test_the_old_logprob_forward_is_skipped_exactly_when_no_sample_is_stale_and_one_update_is_made(model_dir):
    batch = collate(experience(2, versions=[3, 3]), pad_id=0)
    micro_batches = -(-batch.size // MICRO)
    current = one_step(model_dir, batch, policy_version=3)
    stale = one_step(model_dir, batch, policy_version=4)
    assert current[0] == micro_batches
    assert stale[0] == 2 * micro_batches
    # One stale group is enough to need the recompute.
    assert one_step(model_dir, collate(experience(2, versions=[3, 2]), pad_id=0), policy_version=3)[0] == \
        2 * micro_batches
    # Two updates: the second mini-batch's old policy is the step's first weights, not the current ones.
    per_mini = -(-(batch.size // 2) // MICRO)
    assert one_step(model_dir, batch, policy_version=3, mini_batches=2)[0] == micro_batches + 2 * per_mini
    # The seed's ratio against the sampler never reads the old policy.
    assert one_step(model_dir, batch, policy_version=4, off_policy="behaviour_ratio")[0] == micro_batches

    # Skipped or recomputed, the old log-probs are the same numbers: same loss, gradient and update.
    _, skipped_figures, skipped_weights = current
    _, recomputed_figures, recomputed_weights = stale
    assert skipped_figures["grad_norm"] > 0
    for name in ("loss", "grad_norm", "ratio_mean", "behaviour_weight_mean", "behaviour_weight_max"):
        assert skipped_figures[name] == pytest.approx(recomputed_figures[name], rel=1e-6, abs=1e-9), name
    # Old = current before the step: every ratio is 1, so nothing clips.
    assert skipped_figures["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert skipped_figures["clip_fraction"] == 0
    for name, tensor in skipped_weights.items():
        torch.testing.assert_close(tensor, recomputed_weights[name], rtol=1e-6, atol=1e-7, msg=name)


def test_step_figures_report_the_off_policy_correction(model_dir):
    batch = collate(experience(2, versions=[0, 0], seed=1), pad_id=0)
    _, figures, _ = one_step(model_dir, batch, policy_version=0, behaviour_weight_cap=1.5)
    assert 0 < figures["behaviour_weight_capped_fraction"] < 1
    assert figures["behaviour_weight_max"] > 1.5 > figures["behaviour_weight_mean"] > 0
    assert figures["clip_fraction"] == figures["clip_low_fraction"] + figures["clip_high_fraction"]
    _, seed_form, _ = one_step(model_dir, batch, policy_version=0, off_policy="behaviour_ratio")
    assert "behaviour_weight_mean" not in seed_form
    # Ratios against the sampler are far from 1 here, so the clip acts.
    assert seed_form["clip_fraction"] > 0


def _data_parallel_rank(rank: int, model_dir: Path, out_dir: Path) -> None:
    with make_strategy(strategy_config(), model_dir) as strategy:
        results = _steps(strategy, rank_groups=slice(2 * rank, 2 * rank + 2))
        torch.save(results, out_dir / f"rank{rank}.pt")


def _steps(strategy, rank_groups: slice) -> dict:
    """Two steps on this process's share of four groups: GRPO (sample_level), then DAPO (token_level) on a batch
    whose first two groups are current and the last two a version old."""
    figures, forwards = [], []
    for (preset, overrides), versions, policy_version in zip(CONFIGS.values(), ([0] * 4, [1, 1, 0, 0]), (0, 1),
                                                             strict=True):
        update, calls = counting_update(strategy, preset, **overrides)
        batch = collate(experience(4, versions=versions)[rank_groups], pad_id=0)
        figures.append(update(batch, policy_version))
        forwards.append(len(calls))
    return {"figures": figures, "forwards": forwards, "weights": dict(strategy.full_state_dict())}


def test_two_ranks_summing_gradients_over_the_rank_summed_normaliser_equal_one_process_on_the_union(
        model_dir, tmp_path):
    run_ranks(_data_parallel_rank, 2, model_dir, tmp_path)
    ranks = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=False) for rank in range(2)]
    with make_strategy(strategy_config(), model_dir) as strategy:
        union = _steps(strategy, rank_groups=slice(0, 4))
    for rank in ranks:
        for ours, single in zip(rank["figures"], union["figures"], strict=True):
            # Dividing the normaliser by the world size (DDP's averaging convention) would double it.
            assert ours["grad_norm"] == pytest.approx(single["grad_norm"], rel=1e-4)
        for name, tensor in union["weights"].items():
            torch.testing.assert_close(rank["weights"][name], tensor, rtol=1e-4, atol=1e-6, msg=name)
    # Eight samples per rank in micro-batches of 3: three forwards, and three more to recompute the old policy
    # in the second step on BOTH ranks, although rank 0's samples are all current (the forward is collective).
    assert [rank["forwards"] for rank in ranks] == [[3, 6], [3, 6]]
