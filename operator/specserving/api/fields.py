"""Field metadata for the API dataclasses: the single place where docs, defaults and bounds are declared.

Every field of every API dataclass is declared with `field()` from here. The CRD generator (schema.py) and
the parser (parsing.py) both read this metadata, so the CRD and the Python model cannot disagree.
"""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING
from typing import Any, NewType

# Opaque Kubernetes sub-objects (resources, affinity, env...) that we pass through to pods unchanged.
# The schema keeps them with x-kubernetes-preserve-unknown-fields; the apiserver's own pod validation checks them.
RawObject = NewType("RawObject", dict[str, Any])
StringMap = NewType("StringMap", dict[str, str])


@dataclasses.dataclass(frozen=True)
class CelRule:
    """One x-kubernetes-validations entry: a CEL rule, the message shown when it fails, and the field it blames."""

    rule: str
    message: str
    field_path: str | None = None
    message_expression: str | None = None


def field(
    description: str,
    *,
    default: Any = MISSING,
    default_factory: Any = MISSING,
    required: bool = False,
    enum: tuple[str, ...] | None = None,
    minimum: int | None = None,
    maximum: int | None = None,
    max_length: int | None = None,
    pattern: str | None = None,
    max_items: int | None = None,
    item_max_length: int | None = None,
    item_pattern: str | None = None,
    item_minimum: int | None = None,
    item_maximum: int | None = None,
    json_name: str | None = None,
    list_type: str | None = None,
    list_map_keys: tuple[str, ...] | None = None,
) -> Any:
    """Declare an API field. `required` fields have no default; optional fields without a default are None."""
    if required and (default is not MISSING or default_factory is not MISSING):
        raise ValueError("a required field cannot have a default")
    meta = {
        "description": description,
        "required": required,
        "enum": enum,
        "minimum": minimum,
        "maximum": maximum,
        "max_length": max_length,
        "pattern": pattern,
        "max_items": max_items,
        "item_max_length": item_max_length,
        "item_pattern": item_pattern,
        "item_minimum": item_minimum,
        "item_maximum": item_maximum,
        "json_name": json_name,
        "list_type": list_type,
        "list_map_keys": list_map_keys,
    }
    if required:
        return dataclasses.field(metadata=meta)
    if default_factory is not MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=None if default is MISSING else default, metadata=meta)


def json_name(f: dataclasses.Field[Any]) -> str:
    """The camelCase JSON name of a dataclass field."""
    explicit = f.metadata.get("json_name")
    if explicit:
        return str(explicit)
    head, *rest = f.name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def static_default(f: dataclasses.Field[Any]) -> Any:
    """The field's static default as plain data, or None when it has none."""
    if f.default_factory is not MISSING:
        value = f.default_factory()
        # An object default of {} lets the apiserver fill the nested defaults, as Kubernetes' own types do.
        return {} if dataclasses.is_dataclass(value) else value
    if f.default is MISSING or f.default is None:
        return None
    return f.default
