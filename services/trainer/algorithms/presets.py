"""The GRPO family as one typed configuration, and named presets for the reference's algorithms and their kin."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from zerobubble.common.config import ConfigError, Schema
from zerobubble.common.presets import PRESETS, PresetName

AdvantageEstimator = Literal["grpo", "dr_grpo", "rloo", "reinforce_pp"]
Aggregation = Literal["sample_level", "token_level", "constant"]
RatioLevel = Literal["token", "sequence"]
OffPolicyCorrection = Literal["decoupled", "truncated_is", "behaviour_ratio", "none"]
Surrogate = Literal["clipped", "cispo", "sapo", "dppo"]
MismatchMask = Literal["none", "sequence", "icepop", "geometric_mean"]


class AlgorithmConfig(Schema):
    """Everything of the loss that tells GRPO, DAPO, RLOO, REINFORCE++, Dr.GRPO and GSPO apart: a preset, and any
    of its fields set beside it overrides the preset's. What a preset asks of the whole run (dynamic sampling,
    temperature annealing) is the run spec's (common/run_spec.py)."""

    preset: PresetName = Field("GRPO", description="the named algorithm whose values the unset fields take; the run "
                               "spec's algorithm must be the same")
    advantage_estimator: AdvantageEstimator = Field(
        "grpo", description="grpo: (r-mean)/(std+1e-4); dr_grpo: r-mean; rloo: (r-mean)*G/(G-1); "
        "reinforce_pp: r-mean, then whitened over the batch's tokens"
    )
    clip_low: float = Field(0.2, ge=0, lt=1, description="the ratio is clipped below at 1 - clip_low")
    clip_high: float = Field(0.2, ge=0, description="the ratio is clipped above at 1 + clip_high")
    beta: float = Field(0.01, ge=0, description="weight of the k3 KL to the reference model; 0 needs no reference")
    aggregation: Aggregation = Field(
        "sample_level", description="sample_level: mean over samples of each sample's token mean; token_level: "
        "sum over tokens / effective tokens of the mini-batch; constant: sum / (samples * max_new_tokens)"
    )
    ratio_level: RatioLevel = Field(
        "token", description="token: one importance ratio per token; sequence: GSPO's length-normalised "
        "sequence ratio, clipped per sample"
    )
    off_policy: OffPolicyCorrection = Field(
        "decoupled", description="how samples drawn by older weights (or another engine's numerics) are "
        "corrected. decoupled: ratio against the policy before this step, times the behaviour weight "
        "pi_old / pi_behaviour, tokens whose weight exceeds behaviour_weight_cap dropped (AReaL); truncated_is: "
        "the same with the weight truncated at the cap (TIS); behaviour_ratio: the ratio's denominator is the "
        "sampler's log-prob (Colossal-RL); none: ratio against the policy before this step, no weight"
    )
    behaviour_weight_cap: float = Field(
        5.0, gt=1, description="cap of the behaviour weight pi_old / pi_behaviour (decoupled, truncated_is)"
    )
    surrogate: Surrogate = Field(
        "clipped", description="the per-token objective (docs/concepts/objective.md). clipped: PPO's "
        "-min(r A, clip(r) A); cispo: -sg(min(r, 1 + clip_high)) A log pi (MiniMax-M1); sapo: -(4 / tau) "
        "sigmoid(tau (r - 1)) A, a soft gate in place of the clip (SAPO); dppo: -M r A, tokens whose probability "
        "moved more than dppo_delta in the advantage's direction masked (DPPO)"
    )
    sapo_tau_positive: float = Field(1.0, gt=0, description="SAPO's gate temperature for tokens with A > 0")
    sapo_tau_negative: float = Field(1.05, gt=0, description="SAPO's gate temperature for tokens with A < 0")
    dppo_delta: float = Field(
        0.15, gt=0, lt=1, description="DPPO's trust region: the largest change of a sampled token's probability "
        "(binary total variation) in the advantage's direction before the token is masked"
    )
    mismatch_mask: MismatchMask = Field(
        "none", description="tokens left out for the rollout-trainer mismatch, judged by the behaviour weight "
        "pi_old / pi_behaviour (with decoupled or truncated_is). sequence: a sample whose weight product leaves "
        "[mismatch_low, mismatch_high] (TRL's sequence-level masked IS); icepop: a token whose weight leaves it "
        "(IcePop); geometric_mean: a sample whose geometric-mean weight leaves it (verl's rejection sampling)"
    )
    mismatch_low: float = Field(0.5, ge=0, lt=1, description="lower bound of the weight mismatch_mask keeps")
    mismatch_high: float = Field(2.0, gt=1, description="upper bound of the weight mismatch_mask keeps")
    distillation_coef: float = Field(
        0.0, ge=0, description="on-policy distillation: each sampled token's advantage gains -coef (log p_student - "
        "log p_teacher), the per-token reverse KL to the trainer's teacher (docs/guides/distillation.md); 0: off"
    )
    distillation_centred: bool = Field(
        False, description="the distillation term less its mean over the step's trained tokens (a baseline: the "
        "gradient's expectation is kept, its spread cut; docs/concepts/objective.md)"
    )
    distillation_discount: float = Field(
        0.0, ge=0, le=1, description="each sampled token's distillation term also carries the log-ratios of the "
        "tokens after it, discounted by this factor a position (the future reverse KL it led to); 0: its own alone"
    )
    reward_advantage: bool = Field(
        True, description="the advantage estimator's term from the verifier's reward; false: the distillation term "
        "alone (needs distillation_coef > 0)"
    )
    overlong_filtering: bool = Field(False, description="truncated responses are masked out of the loss")
    soft_overlong_punishment: bool = Field(
        False, description="DAPO's length penalty near max_new_tokens; truncated responses get no answer reward"
    )
    overlong_cache_length: int | None = Field(
        None, gt=0, description="width of the penalty zone; null means min(1024, max_new_tokens // 4)"
    )
    overlong_penalty_scale: float = Field(
        1.0, gt=0, description="multiplies the penalty; the reference uses its correct-answer reward (10)"
    )

    @model_validator(mode="before")
    @classmethod
    def _preset_values(cls, data: Any) -> Any:
        """The preset's values under the fields given beside it."""
        if not isinstance(data, dict):
            return data
        preset = str(data.get("preset", "GRPO")).upper()
        return {**(PRESETS[preset].loss if preset in PRESETS else {}), **data, "preset": preset}

    @model_validator(mode="after")
    def _sequence_ratio_is_per_sample(self) -> AlgorithmConfig:
        # GSPO's objective averages one clipped term per sequence; token_level would weight long answers more.
        if self.ratio_level == "sequence" and self.aggregation != "sample_level":
            raise ValueError("ratio_level 'sequence' needs aggregation 'sample_level' (GSPO averages per sequence)")
        if self.ratio_level == "sequence" and self.surrogate != "clipped":
            raise ValueError(f"surrogate {self.surrogate!r} is per token: it needs ratio_level 'token'")
        if not self.reward_advantage and self.distillation_coef == 0:
            raise ValueError("reward_advantage false leaves no advantage: set distillation_coef above 0 (with a "
                             "teacher) or reward_advantage true")
        if self.mismatch_mask != "none" and self.off_policy not in ("decoupled", "truncated_is"):
            raise ValueError(f"mismatch_mask {self.mismatch_mask!r} reads the behaviour weight: it needs off_policy "
                             f"'decoupled' or 'truncated_is', not {self.off_policy!r}")
        return self


def algorithm_config(preset: str = "GRPO", **overrides: Any) -> AlgorithmConfig:
    """The named preset with `overrides` applied; ConfigError names the preset or the offending field."""
    if preset.upper() not in PRESETS:
        raise ConfigError(f"unknown algorithm preset {preset!r}; known: {', '.join(PRESETS)}")
    try:
        return AlgorithmConfig.model_validate({"preset": preset, **overrides})
    except ValidationError as exc:
        fields = "; ".join(
            f"{'.'.join(str(part) for part in item['loc']) or 'algorithm'}: {item['msg']}" for item in exc.errors()
        )
        raise ConfigError(f"invalid algorithm configuration (preset {preset.upper()}): {fields}") from None
