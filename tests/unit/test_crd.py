"""The CRD is generated from the API dataclasses and committed; these tests keep the two in step."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import yaml

from specserving.api.schema import crd
from specserving.api.naming import MAX_NAME_LENGTH, REVISION_LENGTH, workload_name

from .builders import ROOT

CRD_FILE = ROOT / "crds" / "specserving.io_specservings.yaml"


def _version() -> dict[str, Any]:
    return crd()["spec"]["versions"][0]


def test_committed_crd_is_the_generated_one() -> None:
    generated = yaml.safe_dump_all([crd()], sort_keys=False, default_flow_style=False, width=120)
    assert CRD_FILE.read_text() == generated, "crds/ is stale: run `make crds` and review the diff"


def _walk(schema: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, prop in schema.get("properties", {}).items():
        yield from _walk(prop, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from _walk(schema["items"], f"{path}[]")


def test_every_spec_and_status_field_has_a_description() -> None:
    root = _version()["schema"]["openAPIV3Schema"]
    missing = [p for part in ("spec", "status") for p, s in _walk(root["properties"][part], part)
               if not s.get("description") and not p.endswith("[]")]
    assert missing == []


def test_every_string_and_list_is_bounded() -> None:
    root = _version()["schema"]["openAPIV3Schema"]["properties"]["spec"]
    unbounded = [p for p, s in _walk(root, "spec")
                 if (s.get("type") == "string" and "maxLength" not in s and "enum" not in s)
                 or (s.get("type") == "array" and "maxItems" not in s)]
    assert unbounded == []


def test_names_group_and_short_name() -> None:
    spec = crd()["spec"]
    assert spec["group"] == "specserving.io"
    assert spec["names"]["plural"] == "specservings"
    assert spec["names"]["kind"] == "SpecServing"
    assert spec["names"]["shortNames"] == ["sps"]
    assert _version()["name"] == "v1alpha1"


def test_scale_subresource_maps_to_the_decode_pool() -> None:
    sub = _version()["subresources"]
    assert sub["status"] == {}
    assert sub["scale"] == {"specReplicasPath": ".spec.decode.replicas",
                            "statusReplicasPath": ".status.decode.replicas",
                            "labelSelectorPath": ".status.decode.selector"}


def test_printer_columns_cover_what_an_admin_looks_at_first() -> None:
    names = [c["name"] for c in _version()["additionalPrinterColumns"]]
    assert names[:7] == ["Ready", "Phase", "Algorithm", "Prefill", "Decode", "Serving", "Image"]
    assert names[-1] == "Age"


def test_name_length_rule_comes_from_the_child_suffixes() -> None:
    rules = _version()["schema"]["openAPIV3Schema"]["x-kubernetes-validations"]
    assert rules[0]["rule"] == f"self.metadata.name.size() <= {MAX_NAME_LENGTH}"
    longest_workload = workload_name("x" * MAX_NAME_LENGTH, "prefill", "0" * REVISION_LENGTH)
    assert len(longest_workload) + len("-999-99") == 63


def test_static_defaults_are_in_the_schema() -> None:
    spec = _version()["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert spec["speculative"]["properties"]["algorithm"]["default"] == "DSPARK"
    assert spec["engine"]["default"] == {}
    assert spec["engine"]["properties"]["tp"]["default"] == 8
    assert spec["transfer"]["properties"]["backend"]["enum"] == ["mooncake", "mooncake_tcp", "nixl"]
