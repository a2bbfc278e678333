"""The named algorithms, each once: what its loss sets (the trainer's `AlgorithmConfig` fields) and what it asks of
the whole run (the run spec's). Torch-free, so the run spec, the launcher and the trainer's schema share it."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal, NamedTuple


class PresetRunDefaults(NamedTuple):
    """What an algorithm preset asks of the whole run, beyond the trainer's loss."""

    filter_range: tuple[float, float] | None = None
    temperature_annealing: bool = False


class Preset(NamedTuple):
    loss: Mapping[str, Any]
    run: PresetRunDefaults


def _preset(run: PresetRunDefaults, **loss: Any) -> Preset:
    return Preset(MappingProxyType(loss), run)


# The reference's producer anneals the temperature under every algorithm it ships.
_ANNEALED = PresetRunDefaults(temperature_annealing=True)

PRESETS: Mapping[str, Preset] = MappingProxyType({
    # Colossal-RL defaults (grpo_consumer): eps 0.2/0.2, beta 0.01, sample_level.
    "GRPO": _preset(
        _ANNEALED, advantage_estimator="grpo", clip_low=0.2, clip_high=0.2, beta=0.01, aggregation="sample_level",
    ),
    # DAPO (Yu et al. 2025) as Colossal-RL runs it: clip-higher, no KL, token-level loss, overlong filtering and
    # soft overlong punishment, and dynamic sampling (the run's filter_range).
    "DAPO": _preset(
        PresetRunDefaults(filter_range=(0.01, 0.99), temperature_annealing=True),
        advantage_estimator="grpo", clip_low=0.2, clip_high=0.28, beta=0.0, aggregation="token_level",
        overlong_filtering=True, soft_overlong_punishment=True,
    ),
    # RLOO (Ahmadian et al. 2024): leave-one-out baseline, otherwise the GRPO defaults.
    "RLOO": _preset(
        _ANNEALED, advantage_estimator="rloo", clip_low=0.2, clip_high=0.2, beta=0.01, aggregation="sample_level",
    ),
    # REINFORCE++ (Hu 2025) with the group-mean baseline, as Colossal-RL's REINFORCE_PPB.
    "REINFORCE_PPB": _preset(
        _ANNEALED, advantage_estimator="reinforce_pp", clip_low=0.2, clip_high=0.2, beta=0.01,
        aggregation="sample_level",
    ),
    # Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-like training"): no std division, no length
    # normalisation (a constant denominator), no KL.
    "DR_GRPO": _preset(
        PresetRunDefaults(), advantage_estimator="dr_grpo", clip_low=0.2, clip_high=0.2, beta=0.0,
        aggregation="constant",
    ),
    # GSPO (Zheng et al. 2025): sequence-level ratio with the paper's clipping range 3e-4/4e-4, no KL.
    "GSPO": _preset(
        PresetRunDefaults(), advantage_estimator="grpo", clip_low=3e-4, clip_high=4e-4, beta=0.0,
        aggregation="sample_level", ratio_level="sequence",
    ),
    # CISPO (MiniMax-M1, arXiv 2506.13585): a clipped, detached importance weight on the REINFORCE term, token-level
    # mean, no KL. The paper sets no lower bound and gives no single upper one: DAPO's clip-higher 0.28 here.
    "CISPO": _preset(
        PresetRunDefaults(), advantage_estimator="grpo", clip_low=0.2, clip_high=0.28, beta=0.0,
        aggregation="token_level", surrogate="cispo",
    ),
    # SAPO (Qwen, arXiv 2511.20347): the soft gate with the paper's tau_pos 1.0 and tau_neg 1.05, each sample's token
    # mean (its objective's 1 / |y_i|), no KL.
    "SAPO": _preset(
        PresetRunDefaults(), advantage_estimator="grpo", beta=0.0, aggregation="sample_level", surrogate="sapo",
        sapo_tau_positive=1.0, sapo_tau_negative=1.05,
    ),
    # DPPO (Qi et al., arXiv 2602.04879): the binary-TV trust region, token-level mean, no KL. Like every preset it
    # anchors on the policy before the step and weights by pi_old / pi_behaviour (decoupled); off_policy
    # 'behaviour_ratio' anchors on the sampler's policy, the paper's mu.
    "DPPO": _preset(
        PresetRunDefaults(), advantage_estimator="grpo", beta=0.0, aggregation="token_level", surrogate="dppo",
        dppo_delta=0.15,
    ),
    # On-policy distillation (Agarwal et al. 2024, GKD; Lu and Thinking Machines Lab 2025): the per-token reverse KL to
    # a teacher as the only advantage, coefficient 1, token-level mean, no KL to a reference (the teacher is the
    # anchor). The run needs a teacher (the trainer's `teacher`); reward_advantage true adds the verifier's back.
    "DISTILL": _preset(
        PresetRunDefaults(), advantage_estimator="grpo", beta=0.0, aggregation="token_level", distillation_coef=1.0,
        reward_advantage=False,
    ),
})

# The names as a type, for the schemas that take one (pydantic checks the value and lists the names).
PresetName = Literal[tuple(PRESETS)]  # type: ignore[valid-type]
