"""Other writers on the operator's children: what the operator owns comes back, what it does not own stays.

An `intruder` field manager takes fields the operator applies (the decode Deployment's replicas, the sglang
container's args) with `kubectl apply --server-side --force-conflicts`; the operator's next server-side apply
(force, field manager specserving-operator) takes them back. Hand edits (`kubectl patch`, an Update) and deleted
children are restored too. An annotation another manager adds is not the operator's: it stays, and the operator
makes no request about it. Target: restored within 5 s.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import yaml
from cluster.kube import Cluster, wait_for
from cluster.operating import NAME, Operator, apply_ready, deployment, events, total

from .faults import figure, ready_now

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

TARGET_SECONDS = 5.0
MANAGER = "specserving-operator"


def server_side(cluster: Cluster, ns: str, obj: dict[str, Any], manager: str) -> None:
    cluster.kubectl("apply", "--server-side", f"--field-manager={manager}", "--force-conflicts", "-n", ns, "-f", "-",
                    input=yaml.safe_dump(obj))


def owners_of(obj: dict[str, Any], field: str) -> set[str]:
    """Field managers whose managedFields name `field` (a fieldsV1 key such as f:replicas) anywhere."""
    return {m["manager"] for m in obj["metadata"].get("managedFields") or []
            if field in json.dumps(m.get("fieldsV1") or {})}


def managed(cluster: Cluster, ns: str, kind: str, name: str) -> dict[str, Any]:
    out = cluster.kubectl("get", kind, name, "-n", ns, "-o", "json", "--show-managed-fields")
    return dict(json.loads(out.stdout))


def timed(what: str, predicate: Any, timeout: float = 30) -> float:
    started = time.monotonic()
    wait_for(predicate, timeout, what, interval=0.1)
    return time.monotonic() - started


def test_owned_fields_come_back_and_foreign_fields_stay(cluster: Cluster, namespace: str,
                                                        operator: Operator) -> None:
    ns = namespace
    apply_ready(cluster, ns)
    decode = cluster.pool_name(NAME, "decode", ns)
    rendered = deployment(cluster, ns, "decode")
    args = rendered["spec"]["template"]["spec"]["containers"][0]["args"]
    figures: dict[str, float] = {}

    # An intruder takes the decode replicas by force.
    started = time.monotonic()
    server_side(cluster, ns, {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": decode},
                              "spec": {"replicas": 5}}, "intruder")
    wait_for(lambda: (d := managed(cluster, ns, "deployment", decode))["spec"]["replicas"] == 2
             and "intruder" not in owners_of(d, "f:replicas") and MANAGER in owners_of(d, "f:replicas"),
             30, "the operator to take spec.replicas back from the intruder", interval=0.1)
    figures["server-side apply of decode replicas by another manager"] = time.monotonic() - started

    # An intruder replaces the sglang container's args (an atomic list: the whole list changes hands).
    started = time.monotonic()
    server_side(cluster, ns, {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": decode},
                              "spec": {"template": {"spec": {"containers": [
                                  {"name": "sglang", "args": [*args, "--intruder-flag"]}]}}}}, "intruder")
    wait_for(lambda: (d := managed(cluster, ns, "deployment", decode))["spec"]["template"]["spec"]["containers"][0][
        "args"] == args and "intruder" not in owners_of(d, "f:args"), 30,
             "the operator to take the container args back", interval=0.1)
    figures["server-side apply of the decode container args by another manager"] = time.monotonic() - started

    # A hand edit (kubectl patch: an Update by another manager) of an owned field.
    started = time.monotonic()
    cluster.kubectl("patch", "deployment", cluster.pool_name(NAME, "prefill", ns), "-n", ns, "--type=merge", "-p",
                    '{"spec":{"replicas":4}}')
    wait_for(lambda: deployment(cluster, ns, "prefill")["spec"]["replicas"] == 1, 30, "prefill replicas restored",
             interval=0.1)
    figures["kubectl patch of prefill replicas"] = time.monotonic() - started

    # Deleted by hand.
    for kind, child in (("service", f"{NAME}-router"), ("deployment", decode),
                        ("rolebinding", f"{NAME}-router")):
        uid = cluster.get(kind, child, ns)["metadata"]["uid"]  # type: ignore[index]
        started = time.monotonic()
        cluster.kubectl("delete", kind, child, "-n", ns, "--wait=false")
        wait_for(lambda k=kind, c=child, u=uid: (o := cluster.get(k, c, ns)) and o["metadata"]["uid"] != u, 30,
                 f"{kind} {child} recreated", interval=0.1)
        figures[f"{kind} {child} deleted"] = time.monotonic() - started
    wait_for(lambda: (o := cluster.get("specservings", NAME, ns)) and ready_now(o), 90, "Ready again")

    # An annotation another manager adds is not drift: it stays, and the operator does not act on it.
    before = operator.metrics()
    passes = total(before, "specserving_reconcile_total")
    repaired = len(events(cluster, ns, "DriftRepaired"))
    server_side(cluster, ns, {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {
        "name": decode, "annotations": {"example.com/owner-note": "kept"}}}, "annotator")
    server_side(cluster, ns, {"apiVersion": "v1", "kind": "Service", "metadata": {
        "name": f"{NAME}-prefill", "labels": {"example.com/team": "kept"}}}, "annotator")
    wait_for(lambda: total(operator.metrics(), "specserving_reconcile_total") >= passes + 3, 30,
             "three more passes (child events and resyncs)")
    after = operator.metrics()
    d = managed(cluster, ns, "deployment", decode)
    assert d["metadata"]["annotations"]["example.com/owner-note"] == "kept"
    assert owners_of(d, "f:example.com/owner-note") == {"annotator"}
    svc = cluster.get("service", f"{NAME}-prefill", ns)
    assert svc and svc["metadata"]["labels"]["example.com/team"] == "kept"
    applies = total(after, "specserving_child_applies_total") - total(before, "specserving_child_applies_total")
    assert applies == 0, f"the operator re-applied children for a field it does not own ({applies:.0f} applies)"
    assert len(events(cluster, ns, "DriftRepaired")) == repaired

    for what, seconds in figures.items():
        figure(f"{what}: restored in {seconds:.2f}s")
    slow = {k: round(v, 2) for k, v in figures.items() if v > TARGET_SECONDS}
    assert not slow, f"restored later than the {TARGET_SECONDS:g}s target: {slow}"
