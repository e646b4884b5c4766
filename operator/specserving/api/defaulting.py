"""Apply the CRD schema's static defaults to a raw object, the way the apiserver does on decode."""

from __future__ import annotations

import copy
from typing import Any


def apply_defaults(value: Any, schema: dict[str, Any]) -> Any:
    """Return a copy of `value` with every missing defaulted property filled, recursively."""
    if isinstance(value, dict) and schema.get("type") == "object":
        out = dict(value)
        for name, prop in schema.get("properties", {}).items():
            if name not in out and "default" in prop:
                out[name] = copy.deepcopy(prop["default"])
            if name in out:
                out[name] = apply_defaults(out[name], prop)
        return out
    if isinstance(value, list) and schema.get("type") == "array" and "items" in schema:
        return [apply_defaults(v, schema["items"]) for v in value]
    return value
