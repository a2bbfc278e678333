"""Algorithm presets carry the values of the reference and of the papers; bad settings name their field."""

from __future__ import annotations

from typing import get_args

import pytest
from pydantic import ValidationError

from zerobubble.common.config import ConfigError
from zerobubble.common.presets import PresetName
from zerobubble.common.run_spec import RunSpec
from zerobubble.trainer.algorithms import PRESETS, AlgorithmConfig, algorithm_config


def test_reference_presets_carry_colossal_rl_values():
    grpo = algorithm_config("GRPO")
    assert (grpo.advantage_estimator, grpo.clip_low, grpo.clip_high, grpo.beta, grpo.aggregation) == (
        "grpo", 0.2, 0.2, 0.01, "sample_level")
    assert not grpo.overlong_filtering and not grpo.soft_overlong_punishment
    dapo = algorithm_config("DAPO")
    assert (dapo.clip_low, dapo.clip_high, dapo.beta, dapo.aggregation) == (0.2, 0.28, 0.0, "token_level")
    assert dapo.overlong_filtering and dapo.soft_overlong_punishment and dapo.overlong_cache_length is None
    assert algorithm_config("RLOO").advantage_estimator == "rloo"
    assert algorithm_config("REINFORCE_PPB").advantage_estimator == "reinforce_pp"
    # What the presets ask of the whole run is the run spec's: dynamic sampling and the producer's annealing.
    assert RunSpec(algorithm="DAPO").filter_range == (0.01, 0.99) and RunSpec(algorithm="GRPO").filter_range is None
    assert all(RunSpec(algorithm=name).sampling.temperature_annealing for name in ("GRPO", "DAPO", "RLOO",
                                                                                  "REINFORCE_PPB"))
    assert not any(RunSpec(algorithm=name).sampling.temperature_annealing for name in ("DR_GRPO", "GSPO"))
    # One list of names: the trainer's presets and the run spec's field type.
    assert set(PRESETS) == set(get_args(PresetName))
    with pytest.raises(ValidationError, match="algorithm"):
        RunSpec.model_validate({"algorithm": "PPO"})


def test_a_preset_and_its_overrides_are_one_typed_section():
    dapo = AlgorithmConfig.model_validate({"preset": "dapo", "clip_high": 0.3})
    assert (dapo.preset, dapo.clip_high, dapo.beta, dapo.aggregation) == ("DAPO", 0.3, 0.0, "token_level")
    # A config written out and read back is the same algorithm.
    assert AlgorithmConfig.model_validate(dapo.model_dump()) == dapo
    assert "preset" in AlgorithmConfig.model_json_schema()["properties"]


def test_paper_presets_dr_grpo_and_gspo():
    dr = algorithm_config("DR_GRPO")
    assert (dr.advantage_estimator, dr.aggregation, dr.beta) == ("dr_grpo", "constant", 0.0)
    gspo = algorithm_config("GSPO")
    assert (gspo.ratio_level, gspo.aggregation, gspo.clip_low, gspo.clip_high) == (
        "sequence", "sample_level", 3e-4, 4e-4)


def test_every_preset_is_a_valid_config_and_presets_cannot_be_mutated():
    assert set(PRESETS) == {"GRPO", "DAPO", "RLOO", "REINFORCE_PPB", "DR_GRPO", "GSPO", "CISPO", "SAPO", "DPPO",
                            "DISTILL"}
    for name in PRESETS:
        assert isinstance(algorithm_config(name), AlgorithmConfig)
    with pytest.raises(TypeError):
        PRESETS["GRPO"].loss["beta"] = 1.0  # type: ignore[index]
    changed = algorithm_config("grpo", beta=0.0, off_policy="truncated_is", behaviour_weight_cap=2.0)
    assert (changed.beta, changed.off_policy, changed.behaviour_weight_cap) == (0.0, "truncated_is", 2.0)
    assert algorithm_config("GRPO").beta == 0.01


def test_every_preset_corrects_stale_samples_with_the_decoupled_objective_by_default():
    # Samples arrive up to max_staleness versions old in asynchronous runs, whichever the algorithm.
    for name in PRESETS:
        config = algorithm_config(name)
        assert (config.off_policy, config.behaviour_weight_cap) == ("decoupled", 5.0), name
    assert algorithm_config("GRPO", off_policy="behaviour_ratio").off_policy == "behaviour_ratio"


@pytest.mark.parametrize("overrides, field", [
    ({"clip_lo": 0.1}, "clip_lo"),
    ({"clip_low": 1.5}, "clip_low"),
    ({"beta": -0.1}, "beta"),
    ({"aggregation": "mean"}, "aggregation"),
    ({"behaviour_weight_cap": 1.0}, "behaviour_weight_cap"),
    ({"off_policy": "importance"}, "off_policy"),
    ({"filter_range": (0.9, 0.1)}, "filter_range"),
    ({"ratio_level": "sequence", "aggregation": "token_level"}, "ratio_level"),
    ({"ratio_level": "sequence", "aggregation": "sample_level", "surrogate": "cispo"}, "surrogate"),
    ({"surrogate": "clip"}, "surrogate"),
    ({"mismatch_mask": "icepop", "off_policy": "none"}, "mismatch_mask"),
    ({"mismatch_mask": "tokens"}, "mismatch_mask"),
    ({"mismatch_high": 0.9}, "mismatch_high"),
    ({"dppo_delta": 0.0}, "dppo_delta"),
])
def test_bad_overrides_name_the_field(overrides, field):
    with pytest.raises(ConfigError, match=field):
        algorithm_config("DAPO", **overrides)


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ConfigError, match="unknown algorithm preset 'PPO'.*GRPO, DAPO"):
        algorithm_config("PPO")
