"""The suite's own convergence check, tested: each kind of problem it exists to find makes it fire.

A check that cannot fail proves nothing (the SIGKILL tests rest on this one). The inventories here are built from
the renderer's real output for a small SpecServing, then spoiled one way at a time: a duplicate of a pool's
Deployment under another revision's name, an extra pod, a second live ReplicaSet, an orphan, a child controlled by
an older incarnation, a finalizer, a missing child. No cluster is needed.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from .faults import INSTANCE, ROLE, problems_in, rendered_children, small

NS = "checks"
UID = "0000-new"


def _stored() -> dict[str, Any]:
    obj = small("dup")
    obj["metadata"].update(namespace=NS, uid=UID, generation=1)
    obj["status"] = {"observedGeneration": 1, "conditions": [
        {"type": "Ready", "status": "True", "observedGeneration": 1, "reason": "Ready", "message": ""}]}
    return obj


def _owned(meta: dict[str, Any], role: str) -> dict[str, Any]:
    return {**meta, "labels": {INSTANCE: "dup", ROLE: role}}


def _converged() -> tuple[dict[str, list[dict[str, Any]]], Any]:
    obj = _stored()
    children = rendered_children(obj, NS)
    pods, sets = [], []
    for role in ("prefill", "decode", "router"):
        pods.append({"metadata": _owned({"name": f"dup-{role}-pod"}, role), "status": {"phase": "Running"}})
        sets.append({"metadata": _owned({"name": f"dup-{role}-rs"}, role), "spec": {"replicas": 1}})
    inv = {"specservings": [obj], "children": children, "replicasets": sets, "pods": pods}
    return inv, lambda stored: rendered_children(stored, NS)


def _decode_deployment(inv: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    return next(c for c in inv["children"] if c["kind"] == "Deployment" and c["metadata"]["labels"][ROLE] == "decode")


def test_a_converged_inventory_has_no_problem() -> None:
    inv, rendered = _converged()
    assert problems_in(inv, rendered) == []


def _spoiled(how: str) -> dict[str, list[dict[str, Any]]]:
    inv, _ = _converged()
    if how == "duplicate deployment":
        twin = copy.deepcopy(_decode_deployment(inv))
        twin["metadata"]["name"] = "dup-decode-0ld0ld00"
        inv["children"].append(twin)
    elif how == "extra pod":
        inv["pods"].append({"metadata": _owned({"name": "dup-decode-pod-2"}, "decode"), "status": {"phase": "Running"}})
    elif how == "second live replicaset":
        inv["replicasets"].append({"metadata": _owned({"name": "dup-decode-rs-2"}, "decode"), "spec": {"replicas": 1}})
    elif how == "orphan":
        stray = copy.deepcopy(_decode_deployment(inv))
        stray["metadata"]["name"] = "gone-decode"
        stray["metadata"]["labels"][INSTANCE] = "gone"
        inv["children"].append(stray)
    elif how == "old owner":
        _decode_deployment(inv)["metadata"]["ownerReferences"][0]["uid"] = "0000-old"
    elif how == "finalizer":
        _decode_deployment(inv)["metadata"]["finalizers"] = ["example.com/hold"]
    elif how == "missing child":
        inv["children"].remove(_decode_deployment(inv))
    return inv


@pytest.mark.parametrize(("how", "expected"), [
    ("duplicate deployment", "2 Deployment objects for role 'decode', want 1"),
    ("extra pod", "2 live decode pods, want 1"),
    ("second live replicaset", "2 decode ReplicaSets with replicas > 0"),
    ("orphan", "orphan Deployment/gone-decode of SpecServing gone"),
    ("old owner", "is controlled by"),
    ("finalizer", "has finalizers ['example.com/hold']"),
    ("missing child", "missing children [('Deployment', 'dup-decode-"),
])
def test_each_problem_makes_the_check_fire(how: str, expected: str) -> None:
    _, rendered = _converged()
    problems = problems_in(_spoiled(how), rendered)
    assert any(expected in p for p in problems), problems
