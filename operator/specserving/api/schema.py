"""Generate the SpecServing CRD (OpenAPI v3 structural schema, CEL rules, subresources, printer columns).

The dataclasses in types.py and status.py are the one source of truth; `specserving crd` prints what this
module builds, and crds/specserving.io_specservings.yaml is that output, checked equal by a test.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Union

from specserving import GROUP, KIND, PLURAL, VERSION
from specserving.api.fields import CelRule, RawObject, StringMap, json_name, static_default
from specserving.api.naming import MAX_NAME_LENGTH
from specserving.api.status import SpecServingStatus
from specserving.api.types import SpecServingSpec

SHORT_NAMES = ["sps"]
CATEGORIES = ["specserving", "all"]
_READY = '.status.conditions[?(@.type=="Ready")].status'


def _unwrap_optional(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _cel(rules: tuple[CelRule, ...]) -> list[dict[str, Any]]:
    out = []
    for r in rules:
        entry: dict[str, Any] = {"rule": r.rule, "message": r.message}
        if r.message_expression:
            entry["messageExpression"] = r.message_expression
        if r.field_path:
            entry["fieldPath"] = r.field_path
        out.append(entry)
    return out


def type_schema(tp: Any) -> dict[str, Any]:
    """The structural schema of a Python type used in the API dataclasses."""
    tp = _unwrap_optional(tp)
    if tp is RawObject:
        return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    if tp is StringMap:
        return {"type": "object", "additionalProperties": {"type": "string"}}
    if tp is str:
        return {"type": "string"}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer", "format": "int64"}
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp)
        return {"type": "array", "items": type_schema(item)}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return object_schema(tp)
    raise TypeError(f"no schema for API type {tp!r}")


def _field_schema(f: dataclasses.Field[Any], tp: Any) -> dict[str, Any]:
    m = f.metadata
    schema = type_schema(tp)
    schema["description"] = m["description"]
    default = static_default(f)
    if default is not None:
        schema["default"] = default
    for key, prop in (("enum", "enum"), ("minimum", "minimum"), ("maximum", "maximum"),
                      ("max_length", "maxLength"), ("pattern", "pattern"), ("max_items", "maxItems")):
        if m.get(key) is not None:
            schema[prop] = list(m[key]) if key == "enum" else m[key]
    items = schema.get("items")
    if items is not None:
        for key, prop in (("item_max_length", "maxLength"), ("item_pattern", "pattern"), ("item_minimum", "minimum"),
                          ("item_maximum", "maximum")):
            if m.get(key) is not None:
                items[prop] = m[key]
    if m.get("list_type"):
        schema["x-kubernetes-list-type"] = m["list_type"]
    if m.get("list_map_keys"):
        schema["x-kubernetes-list-map-keys"] = list(m["list_map_keys"])
    return schema


def object_schema(cls: type) -> dict[str, Any]:
    """The structural schema of an API dataclass, with its CEL rules."""
    hints = typing.get_type_hints(cls)
    props: dict[str, Any] = {}
    required: list[str] = []
    for f in dataclasses.fields(cls):
        name = json_name(f)
        props[name] = _field_schema(f, hints[f.name])
        if f.metadata["required"]:
            required.append(name)
    schema: dict[str, Any] = {"type": "object", "description": (cls.__doc__ or "").strip(), "properties": props}
    if required:
        schema["required"] = required
    rules = getattr(cls, "CEL", ())
    if rules:
        schema["x-kubernetes-validations"] = _cel(rules)
    return schema


def printer_columns() -> list[dict[str, Any]]:
    return [
        {"name": "Ready", "type": "string", "jsonPath": _READY, "description": "The Ready condition."},
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Summary of the state."},
        {"name": "Algorithm", "type": "string", "jsonPath": ".spec.speculative.algorithm",
         "description": "Speculative decoding algorithm."},
        {"name": "Prefill", "type": "string", "jsonPath": ".status.prefill.readySummary",
         "description": "Ready/desired prefill replicas."},
        {"name": "Decode", "type": "string", "jsonPath": ".status.decode.readySummary",
         "description": "Ready/desired decode replicas."},
        {"name": "Serving", "type": "string", "jsonPath": ".status.servingRevision",
         "description": "The PD-contract revision the router pairs."},
        {"name": "Image", "type": "string", "jsonPath": ".status.image.resolved",
         "description": "The image the pools run."},
        {"name": "Endpoint", "type": "string", "jsonPath": ".status.endpoint", "priority": 1,
         "description": "The router's in-cluster URL."},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]


def openapi_schema() -> dict[str, Any]:
    """The openAPIV3Schema of the SpecServing resource."""
    spec = object_schema(SpecServingSpec)
    status = object_schema(SpecServingStatus)
    return {
        "type": "object",
        "description": "SpecServing runs one model with SGLang, disaggregated into prefill and decode pools with "
                       "speculative decoding and RDMA KV transfer, behind the SGLang router.",
        "properties": {
            "apiVersion": {"type": "string", "description": "APIVersion of this object: specserving.io/v1alpha1."},
            "kind": {"type": "string", "description": "Kind of this object: SpecServing."},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
        "required": ["spec"],
        "x-kubernetes-validations": [{
            "rule": f"self.metadata.name.size() <= {MAX_NAME_LENGTH}",
            "message": f"metadata.name must be at most {MAX_NAME_LENGTH} characters, so that the names of the "
                       "pools' Services and pods stay within Kubernetes' 63-character limit",
        }],
    }


def crd() -> dict[str, Any]:
    """The SpecServing CustomResourceDefinition."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}", "labels": {"app.kubernetes.io/name": "specserving"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": KIND, "listKind": f"{KIND}List", "plural": PLURAL, "singular": KIND.lower(),
                      "shortNames": SHORT_NAMES, "categories": CATEGORIES},
            "versions": [{
                "name": VERSION,
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": openapi_schema()},
                "subresources": {
                    "status": {},
                    "scale": {"specReplicasPath": ".spec.decode.replicas",
                              "statusReplicasPath": ".status.decode.replicas",
                              "labelSelectorPath": ".status.decode.selector"},
                },
                "additionalPrinterColumns": printer_columns(),
            }],
        },
    }
