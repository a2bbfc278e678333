"""What the engine tests share: tiny models made here, prompts, and an independent log-prob recomputation."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from zerobubble.rollout.engine import Sample, SamplingSettings
from zerobubble.tooling.tiny.model import make_tiny_model

# Freshly initialised, the tiny model mostly repeats its last input token (its residual stream is the tied
# embedding). Amplifying the attention and MLP branches makes the next token depend on the context, so
# greedy decoding walks through many tokens and a comparison between engines means something.
BRANCH_GAIN = 8.0
FINAL_NORM_GAIN = 4.0
AMPLIFIED = ("o_proj.weight", "down_proj.weight", "up_proj.weight")
# Generations a concurrent-load check may run before it has seen enough loads land mid-generation.
CONCURRENT_ROUNDS = 10


def make_varied_model(out_dir: Path, seed: int) -> Path:
    make_tiny_model(out_dir, size="1m", seed=seed)
    model = AutoModelForCausalLM.from_pretrained(out_dir)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(AMPLIFIED):
                parameter.mul_(BRANCH_GAIN)
        model.model.norm.weight.mul_(FINAL_NORM_GAIN)
    model.save_pretrained(out_dir)
    return out_dir


def checkpoint_weights(model_dir: Path) -> list[tuple[str, torch.Tensor]]:
    """The (name, tensor) pairs a trainer would broadcast for this model: its state dict, tied names included."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    return [(name, tensor.detach().clone()) for name, tensor in model.state_dict().items()]


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny models gain nothing from a second thread, and on a shared two-core machine OpenMP threads that
    wait for each other make generation many times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), size="1m", seed=0)


@pytest.fixture(scope="session")
def varied_model(tmp_path_factory) -> Path:
    return make_varied_model(tmp_path_factory.mktemp("varied0"), seed=0)


@pytest.fixture(scope="session")
def other_varied_model(tmp_path_factory) -> Path:
    return make_varied_model(tmp_path_factory.mktemp("varied1"), seed=1)


def chat_prompts(model_dir: Path, count: int) -> list[list[int]]:
    """ChatML prompts of different lengths (so batches need padding)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    questions = [f"What is {i} + {3 * i}?" + " Think." * (i % 3) for i in range(count)]
    return [list(tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                               return_dict=True)["input_ids"]) for q in questions]


def recompute_logprobs(model, prompt: list[int], sample: Sample, temperature: float, top_k: int = 0,
                       top_p: float = 1.0) -> np.ndarray:
    """Log-probs of the sample's tokens by one plain forward pass over prompt + response, without padding or cache,
    under softmax(logits / temperature) restricted to the top_k logits when top_k > 0, then to the nucleus: the
    tokens whose more likely tokens hold less than top_p of the probability."""
    ids = torch.tensor([prompt + sample.token_ids.tolist()])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float()
    if temperature > 0:
        logits = logits / temperature
    if top_k > 0:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = torch.where(logits >= kth, logits, torch.tensor(float("-inf")))
    if top_p < 1.0:
        descending, order = logits.sort(dim=-1, descending=True)
        before = descending.softmax(dim=-1).cumsum(dim=-1) - descending.softmax(dim=-1)
        outside = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, order, before >= top_p)
        logits = logits.masked_fill(outside, float("-inf"))
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, torch.as_tensor(sample.token_ids, dtype=torch.long)[:, None]).squeeze(-1).numpy()


def ascii_pair_stop(sample: Sample) -> tuple[str, int]:
    """A two-character stop string taken from a response of one-byte (ASCII) tokens, and how many tokens the
    response has when it ends at that string's first occurrence."""
    ids = sample.token_ids.tolist()
    printable = [32 <= t < 127 for t in ids]
    for end in range(1, len(ids)):
        if printable[end - 1] and printable[end]:
            stop = chr(ids[end - 1]) + chr(ids[end])
            first = next(i for i in range(1, len(ids)) if ids[i - 1] == ids[end - 1] and ids[i] == ids[end])
            return stop, first + 1
    raise AssertionError(f"no two adjacent ASCII tokens in {ids}")


def swap_once(engine, weights, at_step: int):
    """A between_steps hook that loads `weights` as version 1 at the boundary before step `at_step`."""
    boundaries = iter(range(1, 10_000))

    def between_steps() -> None:
        if next(boundaries) == at_step:
            engine.load_weights(weights, version=1)
    return between_steps


def long_samples(groups, at_least: int):
    samples = [s for group in groups for s in group if len(s.token_ids) > at_least]
    assert samples, "no sample ran past the swap: the test would check nothing"
    return samples


def check_concurrent_loads(engine, plain, weights, prompts, tolerance: float, pause_s: float = 0.0) -> None:
    """A thread loads the two versions alternately (every `pause_s`) while `engine` generates: every token's
    log-prob must be the forward of the version its version names (version parity picks `plain[0]` or `plain[1]`),
    and some sample must span a load. How many loads land during one generate is the scheduler's choice (a busy
    machine gave fewer than four), so generation is repeated, up to CONCURRENT_ROUNDS times, until enough did."""
    done = threading.Event()
    loads = []

    def loader() -> None:
        version = 0
        while not done.is_set():
            version += 1
            engine.load_weights(weights[version % 2], version=version)
            loads.append(version)
            if pause_s:
                done.wait(pause_s)

    thread = threading.Thread(target=loader)
    thread.start()
    spanning = rounds = 0
    try:
        while rounds < CONCURRENT_ROUNDS and (len(loads) <= 3 or not spanning):
            rounds += 1
            groups = engine.generate(prompts, SamplingSettings(n=2, temperature=1.0, max_new_tokens=24, seed=5))
            for prompt, group in zip(prompts, groups, strict=True):
                for sample in group:
                    expected = [recompute_logprobs(model, prompt, sample, 1.0) for model in plain]
                    np.testing.assert_allclose(sample.logprobs, np.where(sample.versions % 2 == 0, *expected),
                                               atol=tolerance)
                    spanning += len(set(sample.versions.tolist())) > 1
    finally:
        done.set()
        thread.join()
    assert len(loads) > 3
    assert spanning, "no sample saw a load mid-sequence: the test would check nothing"
