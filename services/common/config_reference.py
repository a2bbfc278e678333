"""`zerobubble config SERVICE`: every field of a service's schema with its default and meaning,
read from the schema itself so the reference never drifts from the code."""

from __future__ import annotations

from pydantic import BaseModel
from pydantic_core import PydanticUndefined


def _show(value) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def describe(schema: type[BaseModel], section: BaseModel | None = None, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted name, default, description) for every leaf field, sections expanded. `section` is the
    parent's default for this section, which may differ from the class defaults (e.g. a port)."""
    rows = []
    for name, field in schema.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            inner = getattr(section, name) if section is not None else field.default
            rows += describe(annotation, inner if isinstance(inner, BaseModel) else None, f"{prefix}{name}.")
            continue
        if section is not None and field.default_factory is None:
            default = _show(getattr(section, name))
        elif field.default_factory is not None:
            default = "(computed)"
        else:
            default = "(required)" if field.default is PydanticUndefined else _show(field.default)
        rows.append((f"{prefix}{name}", default, field.description or ""))
    return rows


def reference(schema: type[BaseModel]) -> str:
    rows = describe(schema)
    width = max(len(name) for name, _, _ in rows)
    return "\n".join(f"{name:<{width}}  {default:<12}  {doc}".rstrip() for name, default, doc in rows)
