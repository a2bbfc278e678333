"""What a run will actually do: every setting of `up`'s config that differs from its schema's default, with where
it came from (the base config, a flag, --set), and the values `up` derives (the schedule's length, the model's
identity). `zerobubble up --dry-run` prints it and exits; `up` logs it at the start."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from zerobubble.tooling.launcher.config import UpConfig


@dataclass(frozen=True)
class Setting:
    key: str
    value: Any
    source: str


def _leaves(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict) and tree:
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_leaves(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): tree}


def _under(key: str, given: dict[str, Any]) -> str | None:
    """The given key that set `key` (itself, or a section above it)."""
    return next((name for name in given if key == name or key.startswith(name + ".")), None)


def effective_settings(config: UpConfig, base: Path, flags: dict[str, str], sets: dict[str, Any]) -> list[Setting]:
    """`flags`: config key -> the flag that set it; `sets`: the --set overrides."""
    chosen = _leaves(config.model_dump(mode="json"))
    defaults = _leaves(UpConfig().model_dump(mode="json"))
    in_file = _leaves(yaml.safe_load(base.read_text()) or {}) if base.is_file() else {}
    settings = []
    for key, value in chosen.items():
        if defaults.get(key, object()) == value and _under(key, sets) is None and _under(key, flags) is None:
            continue
        if (name := _under(key, sets)) is not None:
            source = f"--set {name}"
        elif (name := _under(key, flags)) is not None:
            source = flags[name]
        elif _under(key, in_file) is not None:
            source = base.name
        else:
            source = "the preset's" if key.startswith("run.") else "derived"
        settings.append(Setting(key, value, source))
    return settings


def derived_settings(trainer: dict[str, Any], spec: dict[str, Any]) -> list[Setting]:
    """What `up` worked out from the rest, from the configs it hands the trainer and the buffer."""
    out = []
    total = trainer.get("strategy", {}).get("optim", {}).get("total_steps")
    if total is not None:
        out.append(Setting("trainer.strategy.optim.total_steps", total,
                           "derived: train rows x epochs // groups per step, x updates a step"))
    for name, value in (spec.get("model") or {}).items():
        if value is not None:
            out.append(Setting(f"run.model.{name}", value, "derived: read from the model folder"))
    return out


def render(settings: list[Setting]) -> str:
    width = max((len(s.key) for s in settings), default=0)
    return "\n".join(f"  {s.key:<{width}}  {json.dumps(s.value):<24}  ({s.source})" for s in settings)
