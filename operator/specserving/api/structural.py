"""Check a raw object against the CRD's structural schema offline, with kube-apiserver-like messages.

The apiserver does this itself on `kubectl apply`; the CLI and tests need the same answer without one.
jsonschema does the checking; this module only maps its findings onto field paths and Kubernetes wording.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonschema

from specserving.problems import Problem


def _strict(schema: dict[str, Any]) -> dict[str, Any]:
    """Unknown fields are errors offline (kubectl's strict field validation), so close every object."""
    out = copy.deepcopy(schema)

    def walk(node: dict[str, Any]) -> None:
        if node.get("type") == "object" and "properties" in node \
                and not node.get("x-kubernetes-preserve-unknown-fields"):
            node.setdefault("additionalProperties", False)
        for child in node.get("properties", {}).values():
            walk(child)
        if isinstance(node.get("items"), dict):
            walk(node["items"])

    walk(out)
    return out


def _path(prefix: str, parts: Any) -> str:
    path = prefix
    for p in parts:
        path += f"[{p}]" if isinstance(p, int) else f".{p}"
    return path


def _message(err: jsonschema.ValidationError) -> tuple[list[Any], str]:
    where = list(err.absolute_path)
    v, val = err.validator, err.validator_value
    if v == "required":
        missing = err.message.split("'")[1]
        return where + [missing], "Required value"
    if v == "additionalProperties":
        extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
        return where + [extra[0]] if len(extra) == 1 else where, \
            f"unknown field{'s' if len(extra) > 1 else ''} {', '.join(repr(e) for e in extra)}: remove " \
            f"{'them' if len(extra) > 1 else 'it'} or check the spelling (`kubectl explain specservings.spec`)"
    if v == "enum":
        supported = ", ".join(f'"{x}"' for x in val)
        return where, f'Unsupported value: "{err.instance}": supported values: {supported}'
    if v == "type":
        return where, f"Invalid value: {err.instance!r}: must be of type {val}"
    if v == "minimum":
        return where, f"Invalid value: {err.instance}: must be greater than or equal to {val}"
    if v == "maximum":
        return where, f"Invalid value: {err.instance}: must be less than or equal to {val}"
    if v == "maxLength":
        return where, f"Too long: may not be longer than {val}"
    if v == "maxItems":
        return where, f"Too many: {len(err.instance)}: must have at most {val} items"
    if v == "pattern":
        return where, f"Invalid value: {err.instance!r}: must match the pattern {val!r}"
    return where, err.message


_VALIDATORS: dict[int, tuple[dict[str, Any], jsonschema.Draft7Validator]] = {}


def _validator(openapi: dict[str, Any]) -> jsonschema.Draft7Validator:
    """One validator per schema object (callers pass the cached loading.schema()): building it deep-copies the
    whole schema, which cost as much as the validation itself. Schemas are not mutated once built."""
    hit = _VALIDATORS.get(id(openapi))
    if hit is None or hit[0] is not openapi:
        if len(_VALIDATORS) >= 8:
            _VALIDATORS.clear()
        hit = _VALIDATORS[id(openapi)] = (openapi, jsonschema.Draft7Validator(_strict(openapi)))
    return hit[1]


def whole_numbers(value: Any, node: dict[str, Any]) -> Any:
    """`value` with every whole float at an integer field made an int (8.0 -> 8), as the apiserver stores it: JSON
    has one number type, and the schema's "integer" admits 8.0. Rules downstream then see the integer."""
    kind = node.get("type")
    if kind == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    if kind == "object" and isinstance(value, dict):
        props, extra = node.get("properties", {}), node.get("additionalProperties")
        return {k: whole_numbers(v, props.get(k) or (extra if isinstance(extra, dict) else {}))
                for k, v in value.items()}
    if kind == "array" and isinstance(value, list) and isinstance(node.get("items"), dict):
        return [whole_numbers(v, node["items"]) for v in value]
    return value


def check(obj: dict[str, Any], openapi: dict[str, Any]) -> list[Problem]:
    """Every structural error in `obj` (a whole SpecServing), with its field path."""
    validator = _validator(openapi)
    problems = []
    for err in validator.iter_errors(obj):
        where, msg = _message(err)
        problems.append(Problem(_path("", where).lstrip("."), msg))
    return sorted(set(problems))
