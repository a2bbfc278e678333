"""What `up` and `serve` refuse before a schema is built: mistyped keys, values outside their choices and missing
model or data paths, in the time Python takes to start. Building the schemas (all of them, for `up`) costs more CPU
than the rest of a refusal, so their keys are kept as plain data in the user's cache, under a fingerprint of this
package's code: a cache made by other code is never read, and without one the schemas' own check (the same
messages) is all there is. This check only refuses; anything it lets through is checked again by the schemas.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import zerobubble
from zerobubble.common.config_tree import ConfigError, invalid_config, key_errors, read_tree
from zerobubble.common.local_paths import check_model, looks_like_hub_id, missing_path

# Where each config names a model folder and a data set, and how its refusal names the field: as the full check
# names it (preflight), so both say the same.
MODEL_PATHS = {"up": ["model"], "trainer": ["model"], "rollout": ["model.path"], "teacher": ["model.path"]}
DATA_PATHS = {"up": [("train_data", "train_data: ", "buffer.prompts"), ("eval_data", "eval_data: ", "buffer.prompts")],
              "buffer": [("prompts", "", "prompts")]}
# Where the keys are kept: this folder, else zerobubble/ in the user's cache ($XDG_CACHE_HOME, ~/.cache).
CACHE_ENV = "ZEROBUBBLE_CACHE"
# `up` checks a model that is not here at all; a served one may be a hub id in the loader's local cache.
HUB_IDS_PASS = {"trainer", "rollout", "teacher"}


def refuse_mistyped(kind: str, schema_name: str, path: str | Path | None, overrides: Any) -> None:
    """ConfigError for the unknown keys and values outside their choices in the config `kind` ("up" or a service's
    name) would read, as its schema would word them; nothing without a cache of its keys."""
    keys = cached_keys(kind)
    if keys is not None and (lines := key_errors(keys, read_tree(path, overrides))):
        raise invalid_config(schema_name, path, overrides, lines)


def refuse_missing_paths(kind: str, path: str | Path | None, overrides: Any) -> None:
    """ConfigError for a model folder or data set the config names that is not there (what is in them is checked
    once the schema is built)."""
    tree = read_tree(path, overrides)
    for dotted in MODEL_PATHS.get(kind, []):
        value = _at(tree, dotted)
        if isinstance(value, str) and value and not Path(value).exists() \
                and not (kind in HUB_IDS_PASS and looks_like_hub_id(Path(value))):
            check_model(Path(value), dotted)
    for dotted, name, field in DATA_PATHS.get(kind, []):
        value = _at(tree, dotted)
        value = value.get("path") if isinstance(value, dict) else value   # a data set is its path, or {path, ...}
        if isinstance(value, str) and value and (problem := missing_path(Path(value), field)):
            raise ConfigError(f"{name}{problem}")


def _at(tree: dict[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def cached_keys(kind: str) -> dict[str, Any] | None:
    try:
        return json.loads(_cache_file().read_text()).get(kind)
    except (OSError, ValueError):
        return None


def remember_keys(kind: str, keys: dict[str, Any]) -> None:
    """Keep `kind`'s key tree for the next start; a cache that cannot be written only costs the next one time."""
    target = _cache_file()
    try:
        known = json.loads(target.read_text()) if target.exists() else {}
        if known.get(kind) == keys:
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        for stale in target.parent.glob("config-keys-*.json"):
            if stale != target:
                stale.unlink(missing_ok=True)
        scratch = target.with_suffix(f".{os.getpid()}.tmp")
        scratch.write_text(json.dumps({**known, kind: keys}))
        scratch.replace(target)
    except (OSError, ValueError):
        pass


def _cache_file() -> Path:
    root = os.environ.get(CACHE_ENV) or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "zerobubble"
    return Path(root) / f"config-keys-{_code_fingerprint()}.json"


@functools.cache
def _code_fingerprint() -> str:
    """Every module of the package by name, size and modification time: any edit makes a new fingerprint."""
    package = Path(zerobubble.__file__).parent
    digest = hashlib.sha256()
    for module in sorted(package.rglob("*.py")):
        stat = module.stat()
        digest.update(f"{module.relative_to(package)}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:20]
