"""The run spec: the facts every service of one run must agree on, defined once.

The buffer owns it (its config's `run_spec`) and serves it (GetRunSpec); rollout workers and the trainer fetch it
at start and refuse to run when their own configuration states something else. A service's config carries these
facts only as optional expectations, checked by `require_agreement`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from zerobubble.common.config import ConfigError, Schema
from zerobubble.common.episodes import EpisodeSpec
from zerobubble.common.presets import PRESETS, PresetName
from zerobubble.common.routing import VerifierRouting


class RunSpecMismatch(ConfigError):
    """A service's configuration states a run fact the run spec contradicts; the message names both values."""


class ModelIdentity(Schema):
    """Which model the run trains: every worker and the trainer must hold the same vocabulary."""

    vocab_size: int | None = Field(None, gt=0, description="the model's vocabulary size: token ids must be below "
                                   "it (null: not pinned; ids are only checked to be non-negative)")
    tokenizer: str | None = Field(None, description="tokenizer_fingerprint of the tokenizer (null: not pinned)")


class SamplingSchedule(Schema):
    temperature: float = Field(1.0, gt=0, description="the sampling temperature (at the start, when annealed)")
    temperature_annealing: bool = Field(
        False, description="in the first epoch, move the temperature linearly towards annealed_temperature; "
        "default: the algorithm preset's")
    annealed_temperature: float = Field(0.9, gt=0, description="where annealing ends, and stays after epoch 0")

    def temperature_at(self, epoch: int, progress: float) -> float:
        """The temperature for prompts of `epoch` when `progress` (0 to 1) of that epoch is finished."""
        if not self.temperature_annealing:
            return self.temperature
        if epoch > 0:
            return self.annealed_temperature
        return self.temperature + (self.annealed_temperature - self.temperature) * min(max(progress, 0.0), 1.0)


class RunSpec(VerifierRouting):
    """`verifier` and `by_data_source` (from VerifierRouting) route each prompt row to the verifier that scores it."""

    algorithm: PresetName = Field("GRPO", description="the algorithm preset; the trainer's algorithm.preset must "
                                  "match, and it gives filter_range and annealing their defaults")
    model: ModelIdentity = ModelIdentity()
    num_generations: int = Field(8, gt=1, description="trajectories per group (two at least: a group's advantages "
                                 "compare its samples)")
    max_prompt_tokens: int = Field(512, gt=0, description="longer prompts lose the start of their content, never "
                                   "the chat template around it")
    max_new_tokens: int = Field(256, gt=0, description="the response limit: generation, the constant loss "
                                "normalisation and the overlong rules")
    max_staleness: int | None = Field(None, ge=0, description="groups more than this many versions behind the "
                                      "weights that would train them are dropped, and workers wait for newer "
                                      "weights instead of making them (0: strictly on-policy; null: unbounded)")
    weight_updates: Literal["between_batches", "between_turns", "in_flight"] = Field(
        "between_batches", description="when rollout workers take new weights: between generate calls, also between "
        "the turns of an episode, or also between decode steps (tokens then carry the version that drew them)")
    filter_range: tuple[float, float] | None = Field(
        None, description="dynamic sampling: keep groups whose mean answer accuracy is in [low, high]; default: "
        "the algorithm preset's (DAPO: [0.01, 0.99])")
    sampling: SamplingSchedule = SamplingSchedule()
    episodes: EpisodeSpec = Field(EpisodeSpec(), description="multi-turn episodes: which rows are played out in "
                                  "an environment over several turns, and their limits (none by default)")

    @model_validator(mode="before")
    @classmethod
    def _preset_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        preset = str(data.get("algorithm", "GRPO")).upper()
        defaults = PRESETS[preset].run if preset in PRESETS else None
        if defaults is None:
            return data   # the Literal refuses it, naming the field
        data = {**data, "algorithm": preset}
        data.setdefault("filter_range", defaults.filter_range)
        sampling = data.get("sampling")
        if sampling is None or isinstance(sampling, dict):
            data["sampling"] = {"temperature_annealing": defaults.temperature_annealing, **(sampling or {})}
        return data

    @field_validator("filter_range")
    @classmethod
    def _ordered_fractions(cls, value: tuple[float, float] | None) -> tuple[float, float] | None:
        if value is not None and not 0.0 <= value[0] <= value[1] <= 1.0:
            raise ValueError(f"expected 0 <= low <= high <= 1, got {list(value)}")
        return value

    def value(self, dotted: str) -> Any:
        node: Any = self
        for part in dotted.split("."):
            node = getattr(node, part)
        return node


def require_agreement(spec: RunSpec, expectations: Mapping[str, tuple[str, Any]], *, source: str) -> None:
    """`expectations`: a spec field -> (the local config field stating it, its value; None states nothing).
    Raises RunSpecMismatch naming every disagreement with both values."""
    problems = []
    for field, (local_field, local) in expectations.items():
        if local is None:
            continue
        theirs = spec.value(field)
        if isinstance(theirs, tuple):
            local = tuple(local)
        if theirs != local:
            problems.append(f"{local_field} is {local!r} but the run spec from {source} has {field} {theirs!r}")
    if problems:
        raise RunSpecMismatch("this service's configuration disagrees with the run: " + "; ".join(problems))


def model_expectations(spec: RunSpec, path: Path, field: str) -> dict[str, tuple[str, Any]]:
    """The identity of the local model folder `path` (the config's `field`), for the fields the spec pins; the
    folder is read only when it pins any."""
    pinned = [name for name in ModelIdentity.model_fields if getattr(spec.model, name) is not None]
    local = model_identity(path) if pinned else None
    return {f"model.{name}": (f"{field} {path}: its {name}", getattr(local, name)) for name in pinned}


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """The first 16 hex digits of a SHA-256 over the tokenizer's vocabulary (token -> id, special tokens
    included): two tokenizers with the same fingerprint map text to the same ids."""
    vocabulary = sorted(tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps(vocabulary, ensure_ascii=False).encode()).hexdigest()[:16]


def model_identity(path: Path) -> ModelIdentity:
    """The identity of an HF-format model folder (its config and tokenizer are read, not its weights)."""
    from transformers import AutoConfig, AutoTokenizer

    vocab_size = AutoConfig.from_pretrained(path).get_text_config().vocab_size
    return ModelIdentity(vocab_size=vocab_size, tokenizer=tokenizer_fingerprint(AutoTokenizer.from_pretrained(path)))
