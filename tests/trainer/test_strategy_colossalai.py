"""The colossalai back end in the one configuration that trains on CPU (HybridParallelPlugin, tp=1, pp=1,
zero_stage=0): it learns, round-trips a checkpoint, and two data-parallel ranks make the update of one process
on the union of their data. Runs where colossalai is importable (`make test-colossalai`); with
ZEROBUBBLE_REQUIRE_COLOSSALAI=1 a missing colossalai fails instead of skipping."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch
from strategy_helpers import make_tiny_model, run_ranks, strategy_config, summed_nll, token_batch

from zerobubble.trainer.strategies import make_strategy

REQUIRED = os.environ.get("ZEROBUBBLE_REQUIRE_COLOSSALAI") == "1"
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("colossalai") is None and not REQUIRED,
    reason="colossalai not importable (an optional extra with its own environment: `make test-colossalai`)")

STEPS = 2


def colossalai_config():
    return strategy_config().model_copy(update={"name": "colossalai"})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def test_colossalai_hybrid_plugin_trains_and_round_trips(model_dir, tmp_path):
    from zerobubble.trainer.checkpoints import Checkpoints, TrainerState

    strategy = make_strategy(colossalai_config(), model_dir)
    batch = token_batch(seed=7, rows=4)
    losses = []
    for _ in range(3):
        nll, count = summed_nll(strategy.model, batch)
        losses.append((nll / count).item())
        strategy.backward(nll / count)
        result = strategy.step()
        assert result.grad_norm > 0 and result.lr == pytest.approx(1e-2)
    assert losses[-1] < losses[0] and strategy.steps == 3
    saved = {name: t.clone() for name, t in strategy.full_state_dict()}
    checkpoints = Checkpoints(tmp_path / "checkpoints")
    checkpoints.save(strategy, TrainerState(step=3))
    nll, count = summed_nll(strategy.model, batch)
    strategy.backward(nll / count)
    strategy.step()
    assert checkpoints.load(strategy).step == 3 and strategy.steps == 3
    for name, tensor in strategy.full_state_dict():
        assert torch.equal(tensor, saved[name]), name
    strategy.close()


def _colossalai_rank(rank: int, model_dir: Path, out_dir: Path) -> None:
    """One data-parallel rank: STEPS updates on its own batches with the globally normalised loss."""
    strategy = make_strategy(colossalai_config(), model_dir)
    results = []
    for step in range(STEPS):
        nll, count = summed_nll(strategy.model, token_batch(seed=100 * step + rank))
        strategy.backward(nll / strategy.all_reduce_sum(count))
        results.append(strategy.step())
    torch.save({"world_size": strategy.world_size, "data_parallel_size": strategy.data_parallel_size,
                "results": results, "full": dict(strategy.full_state_dict())}, out_dir / f"rank{rank}.pt")
    strategy.close()


def test_two_colossalai_ranks_equal_one_process_on_the_union(model_dir, tmp_path):
    run_ranks(_colossalai_rank, 2, model_dir, tmp_path)
    ranks = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=False) for rank in range(2)]
    assert [(r["world_size"], r["data_parallel_size"]) for r in ranks] == [(2, 2), (2, 2)]

    strategy = make_strategy(colossalai_config(), model_dir)
    single = []
    for step in range(STEPS):
        batch = torch.cat([token_batch(seed=100 * step + rank) for rank in range(2)])
        nll, count = summed_nll(strategy.model, batch)
        strategy.backward(nll / count)
        single.append(strategy.step())
    weights = dict(strategy.full_state_dict())
    strategy.close()

    for rank in ranks:
        assert set(rank["full"]) == set(weights)
        for name, tensor in weights.items():
            torch.testing.assert_close(rank["full"][name], tensor, rtol=1e-5, atol=1e-6, msg=name)
        for ours, one in zip(rank["results"], single, strict=True):
            assert ours.step == one.step and ours.lr == one.lr
            assert ours.grad_norm == pytest.approx(one.grad_norm, rel=1e-5)
