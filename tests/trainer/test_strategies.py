"""Training strategies: FSDP2 on two gloo ranks equals one process on the union of the data; without colossalai
its strategy names the extra (the colossalai back end itself: test_strategy_colossalai.py)."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch
from strategy_helpers import make_tiny_model, strategy_config, summed_nll, token_batch, two_rank_run

from zerobubble.trainer.strategies import StrategyConfig, make_strategy

HAS_COLOSSALAI = importlib.util.find_spec("colossalai") is not None


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def one_process_on_both_ranks_data(model_dir, steps: int = 2):
    """What two ranks compute, done by one process on the union of their batches."""
    strategy = make_strategy(strategy_config(), model_dir)
    results = []
    for step in range(steps):
        batch = torch.cat([token_batch(seed=100 * step + rank) for rank in range(2)])
        nll, count = summed_nll(strategy.model, batch)
        strategy.backward(nll / strategy.all_reduce_sum(count))
        results.append(strategy.step())
    weights = dict(strategy.full_state_dict())
    strategy.close()
    return results, weights


def test_two_fsdp_ranks_equal_one_process_on_the_union(model_dir):
    ranks = two_rank_run()
    assert [r["world_size"] for r in ranks] == [2, 2]
    results, weights = one_process_on_both_ranks_data(model_dir)
    for rank in ranks:
        assert set(rank["full"]) == set(weights)
        for name, tensor in weights.items():
            torch.testing.assert_close(rank["full"][name], tensor, rtol=1e-5, atol=1e-6, msg=name)
        for ours, single in zip(rank["results"], results, strict=True):
            assert ours.step == single.step and ours.lr == single.lr and not ours.skipped
            assert ours.grad_norm == pytest.approx(single.grad_norm, rel=1e-5)


def test_fsdp_ranks_hold_identical_full_weights_with_hf_names(model_dir):
    ranks = two_rank_run()
    first, second = (rank["full"] for rank in ranks)
    assert list(first) == list(second)
    for name in first:
        assert torch.equal(first[name], second[name]), name
    # HF names, a tied weight once; shards of half the rows each.
    assert "model.embed_tokens.weight" in first and "lm_head.weight" not in first
    shard = ranks[0]["saved"]["model.embed_tokens.weight"]
    assert shard.shape[0] * 2 == first["model.embed_tokens.weight"].shape[0]
    assert [rank["rank_sum"].item() for rank in ranks] == [3.0, 3.0]


def test_one_process_step_learns_and_reports(model_dir):
    strategy = make_strategy(strategy_config(lr=1e-2, max_grad_norm=0.5), model_dir)
    batch = token_batch(seed=7, rows=4)
    losses = []
    for _ in range(5):
        nll, count = summed_nll(strategy.model, batch)
        losses.append((nll / count).item())
        strategy.backward(nll / count)
        result = strategy.step()
        assert result.grad_norm > 0 and result.lr == pytest.approx(1e-2) and not result.skipped
    assert result.step == strategy.steps == 5
    assert losses[-1] < losses[0]
    assert all(p.grad is None for p in strategy.model.parameters())
    strategy.close()


def test_non_finite_gradient_skips_the_update(model_dir):
    strategy = make_strategy(strategy_config(), model_dir)
    before = {name: t.clone() for name, t in strategy.full_state_dict()}
    nll, _ = summed_nll(strategy.model, token_batch(seed=1))
    strategy.backward(nll * math.inf)
    result = strategy.step()
    assert result.skipped and not math.isfinite(result.grad_norm) and strategy.steps == 0
    for name, tensor in strategy.full_state_dict():
        assert torch.equal(tensor, before[name]), name
    strategy.close()


def test_bf16_computes_in_bf16_over_fp32_weights(model_dir):
    config = strategy_config().model_copy(update={"dtype": "bf16"})
    strategy = make_strategy(config, model_dir)
    tokens = token_batch(seed=3)
    logits = strategy.model(input_ids=tokens, attention_mask=torch.ones_like(tokens)).logits
    assert logits.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in strategy.model.parameters())
    # Autocast ends with the forward: code after it runs in fp32 again.
    assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    strategy.close()


@pytest.mark.skipif(HAS_COLOSSALAI, reason="colossalai is installed: the missing-extra message cannot be seen")
def test_colossalai_absent_names_the_extra(model_dir):
    with pytest.raises(ImportError, match="colossalai extra"):
        make_strategy(StrategyConfig(name="colossalai", device="cpu"), model_dir)
