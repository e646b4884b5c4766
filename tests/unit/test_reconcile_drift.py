"""Drift detection and pruning: does an observed child match its rendering; which children are no longer rendered."""

from __future__ import annotations

import copy

import pytest

from specserving.reconcile.drift import matches, needs_apply, parse_quantity, prunable
from specserving.rendering.kinds import CHILD_KINDS, kind_of
from specserving.reconcile.observed import child_of, ref_of
from specserving.api.loading import spec_of
from specserving.rendering import labels as L
from specserving.rendering import render

from .builders import seed

OWNER = "uid-1"


def rendered() -> list[dict]:
    obj = seed()
    obj["metadata"].update(namespace="ns", uid=OWNER)
    return render(spec_of(obj), obj["metadata"])


def as_stored(desired: dict) -> dict:
    """What the API server gives back: defaults added, zero values dropped, quantities canonical, status set."""
    obj = copy.deepcopy(desired)
    obj["metadata"].update(uid="child-uid", resourceVersion="42", generation=1,
                           managedFields=[{"manager": "specserving-operator", "operation": "Apply"}])
    obj["status"] = {"observedGeneration": 1}
    spec = obj.get("spec", {})
    if obj["kind"] == "Service":
        spec.pop("publishNotReadyAddresses", None)  # false is omitted
        spec["clusterIPs"] = ["None"]
        spec["sessionAffinity"] = "None"
    if obj["kind"] == "Deployment":
        spec["revisionHistoryLimit"] = 10
        spec["progressDeadlineSeconds"] = 600
        pod = spec["template"]["spec"]
        pod["schedulerName"] = "default-scheduler"
        for c in pod["containers"]:
            c["terminationMessagePath"] = "/dev/termination-log"
    return obj


@pytest.mark.parametrize("desired", rendered(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_a_child_as_the_server_stores_it_matches_its_rendering(desired: dict) -> None:
    assert not needs_apply(desired, child_of(as_stored(desired)))


def test_an_unsettled_child_keeps_its_body_compact_and_gives_it_back_whole() -> None:
    stored = as_stored(rendered()[0])
    child = child_of(stored)
    assert child.whole and child.raw is not None
    expected = {k: v for k, v in stored.items() if k != "status"}
    expected["metadata"] = {k: v for k, v in stored["metadata"].items() if k != "managedFields"}
    assert child.body == expected
    first = child.body
    assert first is not None
    first["spec"] = {}  # a caller that edits its copy changes nothing kept
    assert child.body == expected


def test_a_settled_child_keeps_its_verdict_not_its_body() -> None:
    desired = rendered()[0]
    child = child_of(as_stored(desired))
    assert not needs_apply(desired, child, "d1")
    child.settle("d1")
    assert child.body is None and not child.whole
    assert not needs_apply(desired, child, "d1")
    # Settled against another rendering (the spec changed since), or asked without a digest: apply.
    assert needs_apply(desired, child, "d2")
    assert needs_apply(desired, child)


def test_a_missing_child_needs_apply() -> None:
    assert needs_apply(rendered()[0], None)


def test_a_hand_edited_deployment_needs_apply() -> None:
    deploy = next(d for d in rendered() if d["kind"] == "Deployment" and d["metadata"]["labels"]["specserving.io/role"] == "decode")
    edited = as_stored(deploy)
    edited["spec"]["template"]["spec"]["containers"][0]["args"].append("--oops")
    assert needs_apply(deploy, child_of(edited))
    scaled = as_stored(deploy)
    scaled["spec"]["replicas"] = 7
    assert needs_apply(deploy, child_of(scaled))
    relabelled = as_stored(deploy)
    del relabelled["metadata"]["labels"]["specserving.io/role"]
    assert needs_apply(deploy, child_of(relabelled))


def test_fields_added_by_others_are_not_drift() -> None:
    deploy = next(d for d in rendered() if d["kind"] == "Deployment")
    stored = as_stored(deploy)
    stored["metadata"]["annotations"] = {"deployment.kubernetes.io/revision": "3"}
    stored["metadata"]["labels"]["team"] = "ml"
    stored["spec"]["template"]["spec"]["containers"][0]["env"].append({"name": "EXTRA", "value": "1"})
    assert not needs_apply(deploy, child_of(stored))


@pytest.mark.parametrize(("desired", "observed", "same"), [
    ({"cpu": "500m"}, {"cpu": "0.5"}, True),
    ({"memory": "1Gi"}, {"memory": "1073741824"}, True),
    ({"memory": "1Gi"}, {"memory": "1G"}, False),
])
def test_quantities_compare_by_value(desired: dict, observed: dict, same: bool) -> None:
    assert matches({"requests": desired}, {"requests": observed}) is same


@pytest.mark.parametrize("zero", [False, 0, "", [], {}, None])
def test_zero_values_match_a_missing_field(zero: object) -> None:
    assert matches({"a": zero}, {})
    assert not matches({"a": 1}, {})


def test_named_lists_match_by_name_and_plain_lists_by_position() -> None:
    assert matches({"env": [{"name": "A", "value": "1"}]}, {"env": [{"name": "B"}, {"name": "A", "value": "1"}]})
    assert not matches({"env": [{"name": "A", "value": "1"}]}, {"env": [{"name": "A", "value": "2"}]})
    assert not matches({"args": ["a", "b"]}, {"args": ["b", "a"]})
    assert not matches({"args": ["a"]}, {"args": ["a", "b"]})


def test_types_are_not_coerced() -> None:
    assert not matches({"port": 8000}, {"port": "8000"})
    assert not matches({"flag": True}, {"flag": "true"})
    assert parse_quantity("8") == 8 and parse_quantity("x") is None


def test_prune_only_owned_children_no_longer_rendered() -> None:
    desired = rendered()
    kept = child_of(as_stored(desired[0]))
    stale = as_stored(next(d for d in desired if d["kind"] == "PodDisruptionBudget"))
    stale["metadata"]["name"] = "dsv4-flash-old"
    mine = child_of(stale)
    foreign = copy.deepcopy(stale)
    foreign["metadata"]["name"] = "someone-elses"
    foreign["metadata"]["ownerReferences"] = [{"uid": "other"}]
    orphan = copy.deepcopy(stale)
    orphan["metadata"]["name"] = "no-owner"
    orphan["metadata"].pop("ownerReferences")
    assert prunable([ref_of(d) for d in desired], [kept, mine, child_of(foreign), child_of(orphan)],
                    OWNER) == [mine]


def test_a_kind_switch_is_a_new_revision_whose_rendering_leaves_out_the_old_workloads() -> None:
    single = rendered()
    multi_obj = seed(**{"spec.decode.nodesPerReplica": 2, "spec.decode.gpusPerNode": 4})
    multi_obj["metadata"].update(namespace="ns", uid=OWNER)
    multi = render(spec_of(multi_obj), multi_obj["metadata"])
    observed = [child_of(as_stored(d)) for d in single]
    pruned = prunable([ref_of(d) for d in multi], observed, OWNER)
    old = sorted((d["kind"], d["metadata"]["name"]) for d in single if d["metadata"]["labels"].get(L.REVISION))
    assert [(c.ref.kind, c.ref.name) for c in pruned] == old
    assert {n.rsplit("-", 1)[0] for _, n in old} == {"dsv4-flash-prefill", "dsv4-flash-decode"}


def test_every_rendered_kind_has_a_row() -> None:
    multi_obj = seed(**{"spec.decode.nodesPerReplica": 2, "spec.decode.gpusPerNode": 4,
                        "spec.engine.metrics.serviceMonitor": True})
    kinds = {kind_of(d).kind for d in render(spec_of(multi_obj), multi_obj["metadata"]) + rendered()}
    assert kinds == {k.kind for k in CHILD_KINDS}
