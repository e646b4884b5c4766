"""The SpecServing index entry: compact, yet every field a pass reads comes back as the watch delivered it."""

from __future__ import annotations

import json
from typing import Any

from specserving.reconcile.watched import OWNER_INDEX, StoredOwner, Watched


def stored(namespace: str, name: str, image: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "specserving.io/v1alpha1", "kind": "SpecServing",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "generation": 3,
                     "labels": {"team": "a"},
                     "annotations": {"note": "kept", "operator.specserving.io/last-handled-configuration": "{}"},
                     "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]},
        "spec": {"model": {"path": "/models/x"}, "decode": {"replicas": 2}},
        "status": {"observedGeneration": 2, **({"image": image} if image else {})},
    }


def test_the_entry_drops_managed_fields_and_kopf_annotations_and_keeps_the_rest() -> None:
    body = stored("ns", "a", image={"buildKey": "k", "resolved": "r@sha256:00"})
    entry = StoredOwner.of(body)
    back = entry.body()
    assert "managedFields" not in back["metadata"]
    assert back["metadata"]["annotations"] == {"note": "kept"}
    expected = json.loads(json.dumps(body))
    del expected["metadata"]["managedFields"]
    expected["metadata"]["annotations"] = {"note": "kept"}
    assert back == expected
    assert entry.image == {"buildKey": "k", "resolved": "r@sha256:00"}
    assert len(entry.raw) < len(json.dumps(body)) / 2


def test_an_object_with_only_kopf_annotations_keeps_none() -> None:
    body = stored("ns", "a")
    del body["metadata"]["annotations"]["note"]
    assert "annotations" not in StoredOwner.of(body).body()["metadata"]


def test_each_read_is_a_fresh_copy() -> None:
    w = Watched()
    w.indices = {OWNER_INDEX: {("ns", "a"): [StoredOwner.of(stored("ns", "a"))]}}
    first = w.owner(("ns", "a"))
    assert first is not None
    first["spec"]["decode"]["replicas"] = 9  # a pass that changes its copy changes nothing stored
    assert w.owner(("ns", "a"))["spec"]["decode"]["replicas"] == 2  # type: ignore[index]
    assert w.owner(("ns", "b")) is None


def test_images_in_lists_the_other_specservings_of_the_namespace_only() -> None:
    w = Watched()
    w.indices = {OWNER_INDEX: {
        ("ns", "a"): [StoredOwner.of(stored("ns", "a", image={"buildKey": "a"}))],
        ("ns", "b"): [StoredOwner.of(stored("ns", "b", image={"buildKey": "b"}))],
        ("ns", "c"): [StoredOwner.of(stored("ns", "c"))],
        ("other", "d"): [StoredOwner.of(stored("other", "d", image={"buildKey": "d"}))],
    }}
    assert sorted(map(str, w.images_in("ns", but=("ns", "a")))) == sorted(["{'buildKey': 'b'}", "None"])
    assert list(Watched().images_in("ns", but=("ns", "a"))) == []
