"""Sampling-mask replay: with top-p and top-k the engine draws from a truncated distribution and says how many tokens
it kept; the trainer takes its log-probs over the same support, so that at a step where nothing is stale the
behaviour weight pi_old / pi_behaviour is 1 (over the whole vocabulary it is the kept mass, well below 1)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from strategy_helpers import strategy_config
from transformers import AutoModelForCausalLM

from zerobubble.common.codec import encode_array
from zerobubble.rollout.engine import SamplingSettings
from zerobubble.rollout.engine_transformers import TransformersEngine
from zerobubble.rollout.experience import experience_group, single_turn
from zerobubble.tooling.tiny.model import make_tiny_model
from zerobubble.trainer.algorithms import algorithm_config
from zerobubble.trainer.algorithms.head_logprobs import chunked_token_logprobs
from zerobubble.trainer.algorithms.logprobs import support_mask
from zerobubble.trainer.collate import collate, unusable
from zerobubble.trainer.strategies import make_strategy
from zerobubble.trainer.update import PolicyUpdate, UpdateSettings
from zerobubble.v1 import common_pb2, reward_pb2

TRUNCATED = SamplingSettings(n=4, temperature=1.0, max_new_tokens=16, top_p=0.8, top_k=20, seed=1)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    # A tiny model gains nothing from more threads, and on a shared machine threads waiting for each other make the
    # steps many times slower.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # Freshly initialised, the tiny model is near uniform; a stronger final norm makes its distributions peaked
    # like a trained model's, so top-p keeps a few tokens and top-k binds.
    directory = make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", size="1m", seed=0)
    model = AutoModelForCausalLM.from_pretrained(directory)
    with torch.no_grad():
        model.model.norm.weight.mul_(4.0)
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def groups(model_dir):
    """Experience as a rollout worker sends it: the engine's samples, through the wire format."""
    engine = TransformersEngine(model_dir, seed=0)
    try:
        prompts = [engine.tokenizer.encode(f"What is {i} + {2 * i}?") for i in range(4)]
        out = []
        for prompt, samples in zip(prompts, engine.generate(prompts, TRUNCATED), strict=True):
            scores = [reward_pb2.ScoreResult(reward=float(i % 2)) for i in range(len(samples))]
            played = [single_turn(prompt, sample, policy_version=0, temperature=TRUNCATED.temperature)
                      for sample in samples]
            group = experience_group(common_pb2.Prompt(), prompt, played, scores, producer_id="w",
                                     producer_incarnation="i", sequence=0, lease_id="")
            out.append(common_pb2.ExperienceGroup.FromString(group.SerializeToString()))
        return out, engine.tokenizer.pad_token_id
    finally:
        engine.close()


def step_weight(model_dir, batch, chunk: int | None) -> float:
    with make_strategy(strategy_config(), model_dir) as strategy:
        update = PolicyUpdate(strategy, algorithm_config("GRPO", beta=0.0),
                              UpdateSettings(1, 8, max_new_tokens=TRUNCATED.max_new_tokens, logprob_chunk_tokens=chunk))
        return update(batch, 0)["behaviour_weight_mean"]


@pytest.mark.parametrize("chunk", [512, None], ids=["chunked", "full_logits"])
def test_behaviour_weight_is_one_at_a_step_with_nothing_stale(model_dir, groups, chunk):
    batch = collate(*groups)
    assert batch.support is not None and int(batch.support.max()) <= 20, "top_k 20 bounds the kept tokens"
    assert step_weight(model_dir, batch, chunk) == pytest.approx(1.0, abs=0.02)
    # Over the whole vocabulary the weight is the kept mass: the bias the replay removes.
    assert step_weight(model_dir, dataclasses.replace(batch, support=None), chunk) < 0.9


def test_chunked_replay_gives_the_log_probs_entropy_and_gradients_of_the_masked_softmax():
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, 8, generator=generator, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(30, 8, generator=generator, dtype=torch.float64, requires_grad=True)
    temperatures = torch.tensor([1.0, 0.7, 1.3, 1.0, 0.9, 1.0, 1.1], dtype=torch.float64)
    kept = torch.tensor([3, 0, 30, 1, 5, 12, 2])
    scaled = (hidden @ weight.t()) / temperatures[:, None]
    targets = scaled.detach().argsort(dim=-1, descending=True)[:, 1]   # the second most likely: inside for k >= 2
    targets[3] = 7   # outside its support of one: kept anyway, the engine drew it
    logprobs, entropy = chunked_token_logprobs(hidden, weight, targets, temperatures, chunk=3, with_entropy=True,
                                               support=kept)
    (logprobs * torch.arange(1.0, 8.0, dtype=torch.float64)).sum().backward()
    chunked_grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad, weight.grad = None, None

    keep = support_mask(scaled.detach(), targets, kept)
    assert keep.sum(dim=1).tolist() == [3, 30, 30, 2, 5, 12, 2]
    masked = scaled.masked_fill(~keep, float("-inf"))
    expected = torch.log_softmax(masked, dim=-1)
    probs = expected.exp()
    reference = expected.gather(1, targets[:, None]).squeeze(1)
    torch.testing.assert_close(logprobs, reference)
    torch.testing.assert_close(entropy, -(probs * expected.masked_fill(~keep, 0.0)).sum(dim=1).detach())
    (reference * torch.arange(1.0, 8.0, dtype=torch.float64)).sum().backward()
    torch.testing.assert_close(chunked_grads[0], hidden.grad)
    torch.testing.assert_close(chunked_grads[1], weight.grad)


def test_the_trainer_refuses_a_support_that_does_not_fit_its_tokens(groups):
    group = common_pb2.ExperienceGroup()
    group.CopyFrom(groups[0][0])
    trajectory = group.trajectories[1]
    trajectory.sampling_support.CopyFrom(encode_array(np.array([3], dtype=np.int32)))
    assert "trajectories[1].sampling_support" in unusable(group, vocab_size=10_000)
    trajectory.sampling_support.CopyFrom(encode_array(np.full(len(trajectory.response_ids.data) // 4, 99_999,
                                                              dtype=np.int32)))
    assert "trajectories[1].sampling_support" in unusable(group, vocab_size=10_000)
