"""Apply the CRD schema's static defaults to a raw object, the way the apiserver does on decode."""

from __future__ import annotations

import copy
from typing import Any


def apply_defaults(value: Any, schema: dict[str, Any]) -> Any:
    """Return a copy of `value` with every missing defaulted property filled, recursively.

    As in the apiserver, a property set to null is dropped first unless its schema says `nullable: true`, so a
    null where the schema has a default gets the default, and a null elsewhere reads as not set."""
    if isinstance(value, dict) and schema.get("type") == "object":
        props = schema.get("properties", {})
        out = {k: v for k, v in value.items() if v is not None or k not in props or props[k].get("nullable")}
        for name, prop in props.items():
            if name not in out and "default" in prop:
                out[name] = copy.deepcopy(prop["default"])
            if name in out:
                out[name] = apply_defaults(out[name], prop)
        return out
    if isinstance(value, list) and schema.get("type") == "array" and "items" in schema:
        return [apply_defaults(v, schema["items"]) for v in value]
    return value
