"""Load a SpecServing object into the typed spec, with the CRD's defaults applied as the apiserver would."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from specserving.api.defaulting import apply_defaults
from specserving.api.parsing import from_dict
from specserving.api.schema import openapi_schema
from specserving.api.types import SpecServingSpec


@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    """The openAPIV3Schema, built once per process."""
    return openapi_schema()


def defaulted(obj: dict[str, Any]) -> dict[str, Any]:
    """The whole object with every schema default filled in."""
    full: dict[str, Any] = apply_defaults(obj, schema())
    return full


def spec_of(obj: dict[str, Any]) -> SpecServingSpec:
    """The typed spec of a schema-valid SpecServing object."""
    return from_dict(SpecServingSpec, defaulted(obj).get("spec", {}))
