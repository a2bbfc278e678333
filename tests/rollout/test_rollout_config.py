"""The rollout config's checks that hold before any model loads."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

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


