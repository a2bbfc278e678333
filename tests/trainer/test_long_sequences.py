"""The trainer at real vocabularies and lengths: log-probs from hidden states in chunks, packed sequences and
token-budget micro-batches give what the full logits of padded rows give (values, entropy, gradients, a whole
training step), without a [positions, vocabulary] tensor."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from algorithm_cases import tiny_qwen2
from strategy_helpers import make_tiny_model, strategy_config
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from zerobubble.common.codec import encode_array
from zerobubble.trainer.algorithms import algorithm_config
from zerobubble.trainer.algorithms.head_logprobs import chunked_token_logprobs
from zerobubble.trainer.collate import collate
from zerobubble.trainer.micro_batches import by_token_budget, plan_micro_batches
from zerobubble.trainer.sequences import Layout, choose_layout, forward_logprobs
from zerobubble.trainer.strategies import make_strategy
from zerobubble.trainer.update import PolicyUpdate, UpdateSettings
from zerobubble.v1 import common_pb2

F64 = torch.float64
FULL = Layout(chunk=None, packed=False)
PADDED = Layout(chunk=3, packed=False)
PACKED = Layout(chunk=3, packed=True)


def groups(count: int = 3, size: int = 3, vocab: int = 64, seed: int = 0, versions: tuple[int, ...] = (0,),
           long_every: int = 0) -> list[common_pb2.ExperienceGroup]:
    """Groups with prompts and responses of different lengths, per-sample temperatures and mixed rewards."""
    rng = np.random.default_rng(seed)
    out = []
    for g in range(count):
        group = common_pb2.ExperienceGroup(prompt_ids=encode_array(rng.integers(1, vocab, int(rng.integers(2, 6)),
                                                                                dtype=np.int32)))
        for i in range(size):
            length = 20 if long_every and (g * size + i) % long_every == 0 else int(rng.integers(1, 7))
            group.trajectories.add(
                response_ids=encode_array(rng.integers(1, vocab, length, dtype=np.int32)),
                behaviour_logprobs=encode_array((-np.log(vocab) + 0.3 * rng.standard_normal(length))
                                                .astype(np.float32)),
                finish_reason=common_pb2.FINISH_REASON_STOP, reward=float((i + g) % 2),
                temperature=[0.7, 1.0, 1.3][i % 3], policy_version=versions[g % len(versions)])
        out.append(group)
    return out


def run(model: nn.Module, layout: Layout, batch) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    result = forward_logprobs(model, batch, with_entropy=True, layout=layout)
    # A weighting that differs per token, so every position's gradient matters.
    weights = torch.linspace(0.5, 1.5, result.logprobs.numel(), dtype=result.logprobs.dtype)
    (result.logprobs.reshape(-1) * weights).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return result.logprobs.detach(), result.entropy, grads


def assert_same(left, right, tolerance: float) -> None:
    for a, b in zip(left[:2], right[:2], strict=True):
        torch.testing.assert_close(a, b, rtol=tolerance, atol=tolerance)
    assert left[2].keys() == right[2].keys() and left[2]
    for name in left[2]:
        torch.testing.assert_close(left[2][name], right[2][name], rtol=tolerance, atol=tolerance, msg=name)


def test_chunked_logprobs_entropy_and_gradients_equal_the_full_log_softmax():
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(11, 8, dtype=F64, generator=generator, requires_grad=True)
    weight = torch.randn(50, 8, dtype=F64, generator=generator, requires_grad=True)
    targets = torch.randint(0, 50, (11,), generator=generator)
    temperatures = torch.rand(11, dtype=F64, generator=generator) + 0.5
    upstream = torch.randn(11, dtype=F64, generator=generator)

    log_probs = torch.log_softmax((hidden @ weight.t()) / temperatures.unsqueeze(1), dim=-1)
    expected = log_probs[torch.arange(11), targets]
    expected_entropy = -(log_probs.exp() * log_probs).sum(-1)
    expected_grads = torch.autograd.grad((expected * upstream).sum(), (hidden, weight))
    for chunk in (1, 4, 11, 100):
        logprobs, entropy = chunked_token_logprobs(hidden, weight, targets, temperatures, chunk=chunk,
                                                   with_entropy=True)
        torch.testing.assert_close(logprobs, expected, rtol=0, atol=1e-12)
        torch.testing.assert_close(entropy, expected_entropy, rtol=0, atol=1e-12)
        assert not entropy.requires_grad
        grads = torch.autograd.grad((logprobs * upstream).sum(), (hidden, weight))
        for got, want in zip(grads, expected_grads, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_and_chunked_equal_the_full_logits_of_padded_rows_on_a_tied_qwen2(attention):
    model = tiny_qwen2()
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # tied
    batch = collate(groups(), pad_id=0)
    assert len(set(batch.temperatures.tolist())) == 3
    # The reference is sdpa's: eager attention over left-padded rows gives NaN here (a padding query attends to
    # nothing), which packed rows do not have.
    model.config._attn_implementation = "sdpa"
    full = run(model, FULL, batch)
    assert torch.isfinite(full[0]).all() and torch.all(full[0][batch.response_mask == 0] == 0)
    model.config._attn_implementation = attention
    # eager takes its softmax in float32 whatever the model's dtype.
    assert_same(run(model, PACKED, batch), full, 1e-10 if attention == "sdpa" else 1e-6)
    if attention == "sdpa":
        assert_same(run(model, PADDED, batch), full, 1e-10)


def test_a_packed_sample_attends_only_to_itself():
    model = tiny_qwen2()
    batch = collate(groups(), pad_id=0)
    together = forward_logprobs(model, batch, with_entropy=False, layout=PACKED).logprobs
    for i in range(batch.size):
        alone = forward_logprobs(model, batch.select(slice(i, i + 1)), with_entropy=False, layout=PACKED).logprobs
        torch.testing.assert_close(together[i : i + 1], alone, rtol=0, atol=1e-10)


def test_lora_adapters_get_the_same_gradients_through_the_chunked_head():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(tiny_qwen2(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                                init_lora_weights=False))
    batch = collate(groups(), pad_id=0)
    assert choose_layout(model, chunk=3, packing=True, what="policy") == PACKED
    full, packed = run(model, FULL, batch), run(model, PACKED, batch)
    assert any("lora_" in name for name in packed[2])
    assert_same(packed, full, 1e-10)


class LargestTensor(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(tensor, torch.Tensor):
                self.largest = max(self.largest, tensor.numel())
        return out


def test_no_tensor_of_positions_by_vocabulary_exists_in_forward_or_backward():
    vocab = 4096
    model = tiny_qwen2(vocab=vocab)
    batch = collate(groups(vocab=vocab, count=4, size=4), pad_id=0)
    positions = int(batch.sequence_lengths.sum())
    sizes = {}
    for name, layout in (("full", FULL), ("chunked", Layout(chunk=8, packed=True))):
        with LargestTensor() as seen:
            run(model, layout, batch)
        sizes[name] = seen.largest
    assert sizes["full"] >= positions * vocab
    # The largest is one chunk's logits (or the tied weight's gradient), far below the batch's.
    assert sizes["chunked"] <= max(8, model.config.hidden_size) * vocab < positions * vocab / 4


def test_token_budget_micro_batches_hold_every_sample_once_within_the_budget():
    tokens = torch.tensor([30, 5, 7, 12, 3, 40, 9, 9, 2, 1])
    for padded in (False, True):
        bins = by_token_budget(tokens, 32, padded=padded)
        assert sorted(i for b in bins for i in b) == list(range(10))
        for members in bins:
            lengths = [int(tokens[i]) for i in members]
            cost = len(lengths) * max(lengths) if padded else sum(lengths)
            assert cost <= 32 or len(members) == 1
    # Another rank needs 6: this one splits its own groups to make as many forwards.
    indices = torch.arange(10, 20)
    micros = plan_micro_batches(indices, torch.cat([torch.zeros(10, dtype=torch.long), tokens]), samples=4,
                                budget=32, padded=False, agree=lambda count: max(count, 6))
    assert len(micros) == 6 and sorted(torch.cat(micros).tolist()) == list(range(10, 20))
    assert [len(m) for m in plan_micro_batches(indices, tokens, samples=4, budget=None, padded=False,
                                               agree=lambda c: c)] == [4, 4, 2]


def test_an_attention_that_cannot_pack_or_a_biased_head_falls_back_and_says_so(caplog):
    model = tiny_qwen2()
    model.config._attn_implementation = "paged|sdpa"
    with caplog.at_level(logging.WARNING):
        assert choose_layout(model, chunk=8, packing=True, what="policy") == Layout(chunk=8, packed=False)
    assert "does not keep packed sequences apart" in caplog.text
    model.lm_head = nn.Linear(32, 64, bias=True, dtype=F64)
    assert choose_layout(model, chunk=8, packing=True, what="policy") == FULL
    assert "full logits" in caplog.text


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def one_step(model_dir, settings: UpdateSettings, batch, policy_version: int, preset: str, **overrides):
    with make_strategy(strategy_config(), model_dir) as strategy:
        reference = None
        if overrides.get("beta", 0) > 0:
            reference = make_strategy(strategy_config(), model_dir).model.eval()
        update = PolicyUpdate(strategy, algorithm_config(preset, **overrides), settings, reference)
        figures = update(batch, policy_version)
        return figures, {name: t.clone() for name, t in strategy.full_state_dict()}


@pytest.mark.parametrize(("preset", "overrides", "policy_version", "mini_batches"), [
    ("GRPO", {"beta": 0.04}, 1, 1),   # stale samples: the old log-probs are recomputed; the reference model's KL
    ("DAPO", {}, 0, 2),               # token-level normaliser over two mini-batches
])
def test_a_training_step_by_token_budget_packed_and_chunked_equals_todays_step(
        model_dir, preset, overrides, policy_version, mini_batches):
    batch = collate(groups(count=4, size=4, vocab=256, long_every=5), pad_id=0)
    today = UpdateSettings(mini_batches, 3, max_new_tokens=24, logprob_chunk_tokens=None, packing=False)
    new = UpdateSettings(mini_batches, 3, max_new_tokens=24, max_tokens_per_micro_batch=40,
                         logprob_chunk_tokens=5, packing=True)
    before, weights_before = one_step(model_dir, today, batch, policy_version, preset, **overrides)
    after, weights_after = one_step(model_dir, new, batch, policy_version, preset, **overrides)
    assert before.keys() == after.keys()
    for name, value in before.items():
        assert after[name] == pytest.approx(value, rel=1e-4, abs=1e-6), name
    moved = 0.0
    for name, weight in weights_before.items():
        torch.testing.assert_close(weights_after[name], weight, rtol=1e-4, atol=1e-6, msg=name)
    with make_strategy(strategy_config(), model_dir) as strategy:
        moved = max(float((w - weights_before[n]).abs().max()) for n, w in strategy.full_state_dict())
    assert moved > 1e-4  # the step changed the weights, so equal weights compare two updates


def rank_groups(rank: int) -> list[common_pb2.ExperienceGroup]:
    # Rank 0's responses are long and rank 1's short: by a token budget rank 0 needs more micro-batches.
    return groups(count=2, size=4, vocab=256, seed=rank, long_every=1 if rank == 0 else 0)


def _budget_rank(rank: int, model_dir, out_dir) -> None:
    with make_strategy(strategy_config(), model_dir) as strategy:
        calls: list[None] = []
        strategy.model.register_forward_pre_hook(lambda *_: calls.append(None))
        settings = UpdateSettings(1, 3, max_new_tokens=24, max_tokens_per_micro_batch=40, logprob_chunk_tokens=5)
        update = PolicyUpdate(strategy, algorithm_config("GRPO", beta=0.0), settings)
        figures = update(collate(rank_groups(rank), pad_id=0), policy_version=1)
        torch.save({"forwards": len(calls), "figures": figures, "weights": dict(strategy.full_state_dict())},
                   out_dir / f"rank{rank}.pt")


@pytest.mark.slow
def test_ranks_with_different_lengths_make_as_many_forwards_and_the_update_of_one_process(model_dir, tmp_path):
    from strategy_helpers import run_ranks

    run_ranks(_budget_rank, 2, model_dir, tmp_path)
    ranks = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=False) for rank in range(2)]
    # Rank 0's eight long samples need eight micro-batches of 40 tokens (and as many to recompute the stale
    # samples' old log-probs); rank 1, whose short ones fit in fewer, splits its own to match.
    assert ranks[0]["forwards"] == ranks[1]["forwards"] == 16
    today = UpdateSettings(1, 3, max_new_tokens=24, logprob_chunk_tokens=None, packing=False)
    union, weights = one_step(model_dir, today, collate(rank_groups(0) + rank_groups(1), pad_id=0), 1, "GRPO",
                              beta=0.0)
    for rank in ranks:
        assert rank["figures"]["grad_norm"] == pytest.approx(union["grad_norm"], rel=1e-4)
        for name, tensor in weights.items():
            torch.testing.assert_close(rank["weights"][name], tensor, rtol=1e-4, atol=1e-6, msg=name)
