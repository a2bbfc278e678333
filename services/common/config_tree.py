"""A config as the user wrote it, before any schema: the YAML file with its dotted overrides, and a schema's keys
as plain data (a key tree). Nothing here imports pydantic, so a mistyped key can be named in the time Python takes to
start, before the schemas (which take longer to build than to use) exist.

A key tree is the JSON-able form of a schema's keys:
    {"closed": bool, "fields": {name: {"nest": "section" | "list" | "dict" | "", "model": <key tree> | None,
                                      "choices": [str, ...] | None}}}
"closed" says unknown keys are refused; "nest" how a nested schema's entries sit under the field (the field's
value itself, each entry of a list, or each entry of a named mapping); "choices" the values a field accepts;
"scoped" (optional) marks a section whose schema is checked on its own, its unknown keys compared with its keys
alone.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the offending field."""


def set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {dotted!r}: {key!r} is not a section")
        node = child
    node[keys[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """'a.b=value' -> ('a.b', value), the value read as YAML so numbers, lists and null work."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r}: expected KEY=VALUE, e.g. server.listen=0.0.0.0:50051")
    return key.strip(), yaml.safe_load(raw) if raw.strip() else ""


def read_tree(path: str | Path | None, overrides: list[str] | dict[str, Any] | None = None) -> dict[str, Any]:
    """The YAML file's mapping (empty without a file), then the dotted overrides on top."""
    tree: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        try:
            loaded = yaml.safe_load(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {path}: the top level must be a mapping")
        tree = loaded or {}
    items = overrides.items() if isinstance(overrides, dict) else map(parse_override, overrides or [])
    for key, value in items:
        set_path(tree, key, value)
    return tree


def invalid_config(schema_name: str, path: str | Path | None, overrides: Any, lines: list[str]) -> ConfigError:
    """The refusal of a config, naming its source: a mistake in an override is not the file's."""
    source = (f" in {path} with its overrides" if overrides else f" in {path}") if path else ""
    return ConfigError(f"invalid {schema_name} configuration{source}:\n" + "\n".join(lines))


def leaf_keys(keys: dict[str, Any] | None, prefix: str = "") -> list[str]:
    """Every key a user can write, sections expanded; a list or dict of entries is one key (its entries' keys are
    the entries' own)."""
    found = []
    for name, field in (keys or {}).get("fields", {}).items():
        inner = leaf_keys(field["model"], f"{prefix}{name}.") if field["nest"] == "section" else []
        found += inner or [f"{prefix}{name}"]
    return found


def _holder(keys: dict[str, Any], loc: tuple) -> tuple[dict[str, Any], int] | None:
    """The entry of a list or dict that the key at `loc` sits in: its key tree and where its own keys start in
    `loc`; None when the key sits in sections only."""
    node, holder, position = keys, None, 0
    while position < len(loc) - 1:
        field = node.get("fields", {}).get(loc[position])
        if field is None or field["model"] is None:
            return holder
        position += 2 if field["nest"] in ("list", "dict") else 1
        if field["nest"] in ("list", "dict"):
            holder = (field["model"], position)
        node = field["model"]
    return holder


def closest_key(keys: dict[str, Any], loc: tuple, prefix: str = "") -> str | None:
    """The closest key to the unknown one at `loc`: among its entry's own keys when it sits in a list or dict entry
    (named as the entry writes it), else among every key of the schema, across sections."""
    holder = _holder(keys, loc)
    if holder is not None:
        entry, start = holder
        candidates, typed = leaf_keys(entry), ".".join(str(part) for part in loc[start:])
    else:
        candidates = [prefix + key for key in leaf_keys(keys)]
        typed = prefix + ".".join(str(part) for part in loc)
    close = difflib.get_close_matches(typed, candidates, n=1)
    return close[0] if close else None


def unknown_key_message(keys: dict[str, Any], loc: tuple, prefix: str = "") -> str:
    close = closest_key(keys, loc, prefix)
    return "unknown key" + (f"; did you mean {close}?" if close else "")


def choices_message(choices: list[str]) -> str:
    """As pydantic words a value outside a Literal, so both checks say the same."""
    shown = [repr(choice) for choice in choices]
    return "Input should be " + (f"{', '.join(shown[:-1])} or {shown[-1]}" if len(shown) > 1 else shown[0])


def key_errors(keys: dict[str, Any], tree: Any) -> list[str]:
    """The unknown keys and the values outside their choices in `tree`, one line each as `describe_errors` writes
    them; only what is certain (a value of another type is left to the schema)."""
    return [f"  {'.'.join(map(str, loc))}: {message}" for loc, message in _walk(keys, tree, keys, (), ())]


def _walk(node: dict[str, Any], value: Any, scope: dict[str, Any], base: tuple, loc: tuple):
    """`scope` is the schema whose keys an unknown key is compared with, found at `base`: a field marked "scoped"
    holds a schema of its own (a service's section of `up`), checked as that service checks it."""
    if not isinstance(value, dict):
        return
    fields = node.get("fields", {})
    for name, item in value.items():
        field = fields.get(name)
        here = (*loc, name)
        if field is None:
            if node.get("closed"):
                prefix = "".join(f"{part}." for part in base)
                yield here, unknown_key_message(scope, here[len(base):], prefix)
            continue
        # Regardless of case: a preset's schema upper-cases its name before checking it.
        if field["choices"] is not None and isinstance(item, str) \
                and item.casefold() not in {choice.casefold() for choice in field["choices"]}:
            yield here, choices_message(field["choices"])
        model = field["model"]
        if model is None or item is None:
            continue
        inner_scope, inner_base = (model, here) if field.get("scoped") else (scope, base)
        if field["nest"] == "section":
            yield from _walk(model, item, inner_scope, inner_base, here)
        elif field["nest"] == "list" and isinstance(item, list):
            for index, entry in enumerate(item):
                yield from _walk(model, entry, inner_scope, inner_base, (*here, index))
        elif field["nest"] == "dict" and isinstance(item, dict):
            for key, entry in item.items():
                yield from _walk(model, entry, inner_scope, inner_base, (*here, key))
