"""In-flight weight updates over the real weight sync: a trainer service broadcasts a new version while an
engine generates, the worker's receiver gets it, and the engine takes it at the next decode step. The vLLM case
runs where vLLM is installed (`make test-vllm`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sync_helpers import trainer_service
from transformers import AutoModelForCausalLM

from zerobubble.common.clients.trainer import TrainerClient
from zerobubble.common.config import ClientConfig, ConfigError
from zerobubble.rollout.engine import SamplingSettings
from zerobubble.rollout.engine_factory import ENGINE_KINDS, make_engine, vllm_available
from zerobubble.rollout.engine_transformers import TransformersEngine
from zerobubble.rollout.in_flight import WeightUpdatePolicy, check_engine
from zerobubble.rollout.weight_receiver import WeightReceiver
from zerobubble.tooling.tiny.model import make_tiny_model

PUBLISH_AT = 4   # the decode-step boundary at which the trainer publishes version 1


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), size="1m", seed=0)


def new_weights(model_dir) -> list[tuple[str, torch.Tensor]]:
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    torch.manual_seed(1)
    return [(name, tensor + 0.05 * torch.randn_like(tensor)) for name, tensor in model.state_dict().items()]


@pytest.fixture
def synced(model_dir):
    """(trainer, receiver): a trainer service on loopback and a joined receiver."""
    with trainer_service() as trainer, TrainerClient(ClientConfig(address=trainer.address)) as client:
        receiver = WeightReceiver(client, "w1", first_backoff_s=0.05).start()
        try:
            trainer.wait_members({"w1"})
            yield trainer, receiver
        finally:
            receiver.close()


@pytest.fixture(params=ENGINE_KINDS)
def any_engine(request, model_dir):
    if request.param == "vllm" and not vllm_available():
        pytest.skip("vllm is not installed in this environment; `make test-vllm` runs this case")
    engine = make_engine(request.param, model_dir, seed=0)
    yield engine
    engine.close()


def test_a_version_broadcast_mid_generation_is_taken_at_the_next_step(model_dir, synced, any_engine):
    trainer, receiver = synced
    engine = any_engine
    taken = []
    WeightUpdatePolicy("in_flight", engine, receiver, on_load=lambda: taken.append(engine.policy_version))
    take = engine.between_steps
    boundaries = iter(range(1, 10_000))

    def publish_then_take() -> None:
        if next(boundaries) == PUBLISH_AT:
            trainer.broadcaster.publish(new_weights(model_dir), version=1)
            assert receiver.wait_for(1, timeout=60), "version 1 never arrived"
        take()

    engine.between_steps = publish_then_take
    sampling = SamplingSettings(n=2, temperature=1.0, max_new_tokens=12, seed=0)
    samples = [s for group in engine.generate([[5, 6, 7]], sampling) for s in group if len(s.token_ids) == 12]
    assert samples, "every response stopped early: the test would check nothing"
    assert taken == [1]
    for sample in samples:
        np.testing.assert_array_equal(sample.versions, [0] * PUBLISH_AT + [1] * (12 - PUBLISH_AT))


def test_an_evaluation_sees_one_version_even_in_flight(model_dir, synced):
    trainer, receiver = synced
    engine = TransformersEngine(model_dir, seed=0)
    policy = WeightUpdatePolicy("in_flight", engine, receiver, on_load=lambda: None)
    trainer.broadcaster.publish(new_weights(model_dir), version=1)
    assert receiver.wait_for(1, timeout=60)
    with policy.one_version():
        samples = engine.generate([[5, 6, 7]], SamplingSettings(n=2, temperature=1.0, max_new_tokens=6, seed=0))
    assert engine.policy_version == 0 and all((s.versions == 0).all() for s in samples[0])
    engine.generate([[5, 6, 7]], SamplingSettings(n=1, temperature=1.0, max_new_tokens=2, seed=0))
    assert engine.policy_version == 1, "in flight again after the evaluation"


def test_between_batches_leaves_the_decode_loop_alone_and_between_turns_takes_weights_at_turns(model_dir, synced):
    trainer, receiver = synced
    engine = TransformersEngine(model_dir, seed=0)
    batches = WeightUpdatePolicy("between_batches", engine, receiver, on_load=lambda: None)
    assert engine.between_steps is None
    trainer.broadcaster.publish(new_weights(model_dir), version=1)
    assert receiver.wait_for(1, timeout=60)
    batches.at_turn()
    assert engine.policy_version == 0, "between_batches takes no weights at a turn"
    WeightUpdatePolicy("between_turns", engine, receiver, on_load=lambda: None).at_turn()
    assert engine.between_steps is None and engine.policy_version == 1


def test_in_flight_is_refused_only_for_an_engine_that_cannot_take_weights_between_steps():
    for kind in ENGINE_KINDS:
        check_engine("in_flight", kind)
    check_engine("between_turns", "other")
    with pytest.raises(ConfigError, match="run.weight_updates"):
        check_engine("in_flight", "other")
