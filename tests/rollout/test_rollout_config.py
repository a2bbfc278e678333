"""The rollout config's checks that hold before any model loads."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from stack import start_buffer, tiny_assets

from zerobubble.common.config import ConfigError, load_config
from zerobubble.rollout.app import build
from zerobubble.rollout.config import RolloutServiceConfig


@pytest.mark.parametrize("generation, field", [({"top_k": 20}, "generation.top_k"),
                                               ({"top_p": 0.8}, "generation.top_p")])
def test_truncated_sampling_on_vllm_is_refused_at_config_naming_the_field(generation, field):
    # vLLM records no sampling support, so the trainer could not replay it (docs/concepts/objective.md).
    with pytest.raises(ValidationError) as refused:
        RolloutServiceConfig.model_validate({"model": {"path": "/m", "engine": "vllm"}, "generation": generation})
    assert field in str(refused.value)


def test_truncated_sampling_on_transformers_is_taken():
    config = RolloutServiceConfig.model_validate({"model": {"path": "/m"}, "generation": {"top_k": 20, "top_p": 0.8}})
    assert (config.generation.top_k, config.generation.top_p) == (20, 0.8)


def test_truncated_sampling_with_episodes_is_refused_before_the_engine_loads(tmp_path):
    # Episodes record no sampling support yet: the trainer could not replay the kept set (docs/concepts/objective.md).
    _model, train, _ = tiny_assets(tmp_path / "assets", train_size=4, eval_size=2)
    buffer = start_buffer(train, tmp_path / "wal", **{"run_spec.episodes.default": {"environment": "calculator"}})
    try:
        config = load_config(RolloutServiceConfig, None, {
            "server.listen": "127.0.0.1:0", "model.path": str(tmp_path / "no-model-needed"), "trainer": None,
            "generation.top_p": 0.8, "buffer.address": buffer.address, "buffer.retry_seconds": 5})
        with pytest.raises(ConfigError) as refused:
            build(config)
        assert str(refused.value).startswith("generation.top_p: multi-turn episodes")
    finally:
        buffer.stop()
