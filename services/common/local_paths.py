"""The local paths a config names, checked before anything that reads them loads: a model folder and a data set.
Nothing here imports more than the standard library, so `up` and `serve` refuse a mistyped path at once."""

from __future__ import annotations

import json
import re
from pathlib import Path

from zerobubble.common.config_tree import ConfigError

# namespace/name without a file suffix: what a hub id looks like, as opposed to a mistyped local path.
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def missing_path(path: Path, field: str) -> str | None:
    """What is wrong with a data path that does not exist (None if it does): checked before the readers load."""
    if path.exists():
        return None
    hint = ""
    if HUB_ID.fullmatch(str(path)) and not path.suffix:
        hint = (f"; {str(path)!r} looks like a Hugging Face hub id, and data sets from the hub need network: "
                f"download it first (huggingface-cli download --repo-type dataset {path} --local-dir DIR) and "
                "give the folder")
    return f"{field}.path: {path}: cannot read: no such file or folder{hint}"


def check_model(model: Path, field: str = "model") -> None:
    if not model.exists():
        if looks_like_hub_id(model):
            raise ConfigError(f"{field}: {model}: {str(model)!r} looks like a Hugging Face hub id, and models from the "
                              f"hub need network: download it first (huggingface-cli download {model} --local-dir "
                              "DIR) and give the folder")
        shown = model if model.is_absolute() or model.parts[0] == ".." else f"./{model}"
        raise ConfigError(f"{field}: no such folder {shown} ({field})")
    if not model.is_dir():
        raise ConfigError(f"{field}: {model} is a file; expected a Hugging Face model folder (with config.json)")
    try:
        json.loads((model / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{field}: {model} has no config.json: not a Hugging Face model folder") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{field}: {model}/config.json cannot be read: {exc}") from None


def looks_like_hub_id(model: Path) -> bool:
    """owner/name, where no folder `owner` is here: a mistyped path under an existing folder is a path."""
    return bool(HUB_ID.fullmatch(str(model))) and not Path(model.parts[0]).exists()
