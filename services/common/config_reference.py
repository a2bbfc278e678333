"""`zerobubble config SERVICE`: every field of a service's schema with its default and meaning,
read from the schema itself so the reference never drifts from the code."""

from __future__ import annotations

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from zerobubble.common.config import nested_model

# How a nested schema's keys are written under its field: a section's directly, a list's for every entry, a
# dict's under each entry's name.
_UNDER = {"section": ".", "list": "[].", "dict": ".NAME."}


def _show(value) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def describe(schema: type[BaseModel], section: BaseModel | None = None, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted name, default, description) for every leaf field, every nested schema expanded: sections, optional
    sections (`lora.rank`), list entries (`environments[].name`) and named entries (`by_data_source.NAME.tools`).
    `section` is the parent's default for this section, which may differ from the class defaults (e.g. a port)."""
    rows = []
    for name, field in schema.model_fields.items():
        model, nesting = nested_model(field.annotation)
        value = getattr(section, name) if section is not None else field.default
        if model is not None and nesting == "section" and isinstance(value, BaseModel):
            rows += describe(model, value, f"{prefix}{name}.")
            continue
        if field.default_factory is not None:
            default = "(computed)" if section is None else _show(value)
        else:
            default = "(required)" if value is PydanticUndefined else _show(value)
        rows.append((f"{prefix}{name}", default, field.description or ""))
        if model is not None:
            # An optional section (null by default), or entries: their keys with the class defaults.
            rows += describe(model, None, f"{prefix}{name}{_UNDER[nesting]}")
    return rows


def reference(schema: type[BaseModel]) -> str:
    rows = describe(schema)
    width = max(len(name) for name, _, _ in rows)
    return "\n".join(f"{name:<{width}}  {default:<12}  {doc}".rstrip() for name, default, doc in rows)
