"""Status from observations: pool counts, conditions with reasons and counted messages, phase, transitions, and the
merge patch (None when nothing changed, so an idle resync writes nothing)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from specserving.reconcile import reasons as R
from specserving.reconcile.conditions import merge, transitions
from specserving.reconcile.observed import pod_of, workload_of
from specserving.reconcile.status import Observation, Outcome, compute, patch_for

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"
CRASH = "AttributeError: 'NoneType' object has no attribute 'prepare_for_decode'"
DESIRED = {"prefill": 1, "decode": 2, "router": 1}


def deployment(name: str, replicas: int, ready: int, updated: int | None = None, *, generation: int = 1,
               observed: int = 1, existing: int | None = None, deadline: bool = False) -> dict[str, Any]:
    status: dict[str, Any] = {"observedGeneration": observed, "replicas": replicas if existing is None else existing,
                              "readyReplicas": ready, "updatedReplicas": replicas if updated is None else updated}
    if deadline:
        status["conditions"] = [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                                 "message": f'ReplicaSet "{name}-5f" has timed out progressing.'}]
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "generation": generation}, "spec": {"replicas": replicas}, "status": status}


def pod(name: str, role: str, *, ready: bool = True, waiting: str | None = None, last: dict | None = None,
        terminated: dict | None = None, phase: str = "Running", restarts: int = 0) -> dict[str, Any]:
    state: dict[str, Any] = {"running": {}}
    if waiting:
        state = {"waiting": {"reason": waiting, "message": f"{waiting} message"}}
    if terminated:
        state = {"terminated": terminated}
    cs = {"name": "sglang", "ready": ready, "restartCount": restarts, "state": state,
          "lastState": {"terminated": last} if last else {}}
    return {"metadata": {"name": name, "labels": {"specserving.io/role": role}},
            "status": {"phase": phase, "podIP": "10.0.0.1", "containerStatuses": [cs],
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def observe(workloads: dict[str, dict | None] | None = None, pods: list[dict] | None = None,
            outcome: Outcome | None = None, old: dict | None = None, generation: int = 3,
            desired: dict | None = DESIRED) -> Observation:
    ready = {"prefill": deployment("sv-prefill", 1, 1), "decode": deployment("sv-decode", 2, 2),
             "router": deployment("sv-router", 1, 1)}
    ready.update(workloads or {})
    return Observation(
        name="sv", namespace="ns", generation=generation, outcome=outcome or Outcome(admitted=True),
        desired=desired, workloads={k: workload_of(v) if v else None for k, v in ready.items()},
        pods=[pod_of(p) for p in pods or []], router_port=8000,
        image={"base": "img:v0.5.17", "resolved": "img:v0.5.17", "sglangVersion": "0.5.17"}, old=old)


def cond(status: dict, type_: str) -> dict:
    return next(c for c in status["conditions"] if c["type"] == type_)


def test_all_ready() -> None:
    s = compute(observe(), T0)
    assert s["phase"] == "Ready"
    assert s["observedGeneration"] == 3
    assert s["endpoint"] == "http://sv-router.ns.svc:8000"
    assert s["decode"] == {"replicas": 2, "readyReplicas": 2, "updatedReplicas": 2, "desiredReplicas": 2,
                           "readySummary": "2/2", "selector": "specserving.io/instance=sv,specserving.io/role=decode"}
    # ServingVerified appears only where the serving check is on (test_serving_verified_condition).
    assert [c["type"] for c in s["conditions"]] == [t for t in R.CONDITION_TYPES if t != R.SERVING_VERIFIED]
    assert {c["type"]: c["status"] for c in s["conditions"]} == {
        "Admitted": "True", "ImageReady": "Unknown", "Progressing": "False", "PrefillReady": "True",
        "DecodeReady": "True", "RouterReady": "True", "Ready": "True", "Degraded": "False"}
    assert cond(s, "DecodeReady")["message"] == "2 of 2 decode replicas ready (Deployment sv-decode)"
    assert cond(s, "Progressing")["reason"] == R.ROLLOUT_COMPLETE
    assert all(c["observedGeneration"] == 3 and c["lastTransitionTime"] == T0 for c in s["conditions"])


def test_partly_ready_is_progressing_with_counts() -> None:
    s = compute(observe({"decode": deployment("sv-decode", 2, 1)}), T0)
    assert s["phase"] == "Progressing"
    assert s["decode"]["readySummary"] == "1/2"
    dr = cond(s, "DecodeReady")
    assert (dr["status"], dr["reason"]) == ("False", R.REPLICAS_NOT_READY)
    assert dr["message"] == "1 of 2 decode replicas ready (Deployment sv-decode)"
    ready = cond(s, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", R.POOLS_NOT_READY)
    assert "1 of 2 decode replicas ready" in ready["message"]
    assert cond(s, "Progressing")["message"] == "decode: 2 of 2 replicas updated, 1 ready"


def leaderworkerset(name: str, groups: int, ready: int, size: int = 2) -> dict[str, Any]:
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": name, "generation": 1, "labels": {"specserving.io/role": "decode"}},
            "spec": {"replicas": groups, "leaderWorkerTemplate": {"size": size}},
            "status": {"observedGeneration": 1, "replicas": groups, "readyReplicas": ready, "updatedReplicas": groups}}


def group_pods(group: int, *ready: bool) -> list[dict[str, Any]]:
    """One LeaderWorkerSet group's pods, leader first, Ready as given."""
    out = []
    for worker, is_ready in enumerate(ready):
        p = pod(f"sv-decode-{group}" + (f"-{worker}" if worker else ""), "decode", ready=is_ready)
        p["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/group-index"] = str(group)
        out.append(p)
    return out


def test_a_pool_spanning_nodes_counts_groups_and_pods() -> None:
    # Group 1 has one of its two pods Ready (its worker is being recreated): the group is not ready.
    pods = group_pods(0, True, True) + group_pods(1, True, False)
    s = compute(observe({"decode": leaderworkerset("sv-decode", 2, 1)}, pods=pods), T0)
    assert s["decode"]["readySummary"] == "1/2 groups (3/4 pods)"
    assert (s["decode"]["groupSize"], s["decode"]["readyPods"]) == (2, 3)
    assert cond(s, "DecodeReady")["message"] == "1 of 2 decode groups of 2 pods ready (LeaderWorkerSet sv-decode)"
    assert s["phase"] == "Progressing"
    assert "groupSize" not in s["prefill"] and s["prefill"]["readySummary"] == "1/1"


def test_a_group_whose_pod_went_is_not_ready_before_leaderworkerset_says_so() -> None:
    # Measured on the real node: LWS still reported readyReplicas 2 while group 0's worker was gone. The pods
    # decide: a group counts as ready only when all its pods are Ready (and not being deleted).
    lagging = leaderworkerset("sv-decode", 2, 2)
    s = compute(observe({"decode": lagging}, pods=group_pods(0, True) + group_pods(1, True, True)), T0)
    assert s["decode"]["readySummary"] == "1/2 groups (3/4 pods)"
    assert s["decode"]["readyReplicas"] == 1
    assert cond(s, "DecodeReady")["status"] == "False"
    assert cond(s, "DecodeReady")["message"].startswith("1 of 2 decode groups of 2 pods ready")
    assert s["phase"] != "Ready"
    deleting = group_pods(0, True, True) + group_pods(1, True, True)
    deleting[0]["metadata"]["deletionTimestamp"] = T0
    assert compute(observe({"decode": lagging}, pods=deleting), T0)["decode"]["readySummary"] == (
        "1/2 groups (3/4 pods)")
    # The pods never raise the count above what LWS reports (its readyReplicas may be the one that is behind).
    assert compute(observe({"decode": leaderworkerset("sv-decode", 2, 1)},
                           pods=group_pods(0, True, True) + group_pods(1, True, True)),
                   T0)["decode"]["readySummary"] == "1/2 groups (4/4 pods)"
    assert compute(observe({"decode": lagging}, pods=group_pods(0, True, True) + group_pods(1, True, True)),
                   T0)["decode"]["readySummary"] == "2/2 groups (4/4 pods)"


def test_a_group_that_cannot_be_placed_whole_is_named() -> None:
    leader = pod("sv-decode-2", "decode")
    worker = pod("sv-decode-2-1", "decode", ready=False, phase="Pending")
    placed = group_pods(0, True, True) + group_pods(1, True, True)
    worker["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                       "message": "0/8 nodes are available: 8 Insufficient nvidia.com/gpu."}]
    for p, group in ((leader, "2"), (worker, "2")):
        p["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/group-index"] = group
    s = compute(observe({"decode": leaderworkerset("sv-decode", 3, 2)}, pods=[*placed, leader, worker],
                        desired={**DESIRED, "decode": 3}), T0)
    assert cond(s, "DecodeReady")["message"] == (
        "2 of 3 decode groups of 2 pods ready (group 2 cannot be placed whole (pod sv-decode-2-1: 0/8 nodes are "
        "available: 8 Insufficient nvidia.com/gpu.))")


def test_nothing_created_yet_is_pending() -> None:
    s = compute(observe({"prefill": None, "decode": None, "router": None}), T0)
    assert s["phase"] == "Pending"
    assert cond(s, "PrefillReady")["reason"] == R.WORKLOAD_MISSING
    assert cond(s, "Progressing")["status"] == "True"
    assert s["prefill"]["readySummary"] == "0/1"


def test_a_rollout_in_progress() -> None:
    s = compute(observe({"decode": deployment("sv-decode", 2, 2, updated=1)}), T0)
    dr = cond(s, "DecodeReady")
    assert dr["status"] == "False"
    assert "1 of 2 on the current template" in dr["message"]
    assert cond(s, "Progressing")["reason"] == R.ROLLING_OUT


def test_a_workload_that_has_not_seen_its_spec_is_not_ready() -> None:
    s = compute(observe({"decode": deployment("sv-decode", 2, 2, generation=2, observed=1)}), T0)
    assert "has not yet observed its latest spec" in cond(s, "DecodeReady")["message"]


def test_scaling_down_waits_for_the_workload() -> None:
    s = compute(observe({"decode": deployment("sv-decode", 3, 3)}), T0)  # spec says 2
    assert cond(s, "DecodeReady")["status"] == "False"
    assert "is set to 3 replicas" in cond(s, "DecodeReady")["message"]


def test_scaled_to_zero() -> None:
    s = compute(observe({"decode": deployment("sv-decode", 0, 0)}, desired={**DESIRED, "decode": 0}), T0)
    assert cond(s, "DecodeReady")["reason"] == R.SCALED_TO_ZERO
    assert s["phase"] == "Ready"


def test_progress_deadline() -> None:
    s = compute(observe({"decode": deployment("sv-decode", 2, 1, deadline=True)}), T0)
    p = cond(s, "Progressing")
    assert (p["status"], p["reason"]) == ("False", R.PROGRESS_DEADLINE_EXCEEDED)
    assert "timed out progressing" in p["message"]


def test_rejected() -> None:
    errors = ('spec.speculative.algorithm: Unsupported value: "NGRAM": no builder',)
    s = compute(observe({"prefill": None, "decode": None, "router": None},
                        outcome=Outcome(admitted=False, errors=errors)), T0)
    assert s["phase"] == "Rejected"
    a = cond(s, "Admitted")
    assert (a["status"], a["reason"], a["message"]) == ("False", R.INVALID_SPEC, errors[0])
    assert cond(s, "Ready")["reason"] == R.INVALID_SPEC
    assert cond(s, "DecodeReady")["status"] == "Unknown"
    assert "endpoint" not in s


def test_dependency_missing() -> None:
    out = Outcome(admitted=True, blocked_reason=R.DEPENDENCY_MISSING, blocked_message="LeaderWorkerSet is missing")
    s = compute(observe({"prefill": None, "decode": None, "router": None}, outcome=out), T0)
    assert s["phase"] == "Pending"
    for t in ("Progressing", "Ready"):
        assert (cond(s, t)["status"], cond(s, t)["reason"]) == ("False", R.DEPENDENCY_MISSING)
    assert cond(s, "Ready")["message"] == "LeaderWorkerSet is missing"


def test_crash_loop_is_degraded_with_the_termination_message() -> None:
    crashing = pod("sv-decode-abc", "decode", ready=False, waiting="CrashLoopBackOff", restarts=3,
                   last={"reason": "Error", "exitCode": 1, "message": f"Traceback...\n{CRASH}\n"})
    s = compute(observe({"decode": deployment("sv-decode", 2, 1)},
                        pods=[pod("sv-decode-xyz", "decode"), crashing]), T0)
    d = cond(s, "Degraded")
    assert (d["status"], d["reason"]) == ("True", R.CRASH_LOOP_BACK_OFF)
    assert d["message"] == ("decode pod sv-decode-abc: container sglang is in CrashLoopBackOff after 3 restarts; "
                            f"last terminated: Error (exit code 1): Traceback...\n{CRASH}")
    assert s["phase"] == "Degraded"


@pytest.mark.parametrize(("kwargs", "reason", "text"), [
    ({"terminated": {"reason": "Error", "exitCode": 2, "message": "boom"}}, R.CONTAINER_FAILED,
     "terminated with Error (exit code 2): boom"),
    ({"waiting": "ImagePullBackOff"}, R.IMAGE_PULL_FAILED, "cannot pull its image: ImagePullBackOff"),
    ({"waiting": "CreateContainerConfigError"}, R.CONTAINER_FAILED, "cannot start: CreateContainerConfigError"),
    ({"phase": "Failed"}, R.POD_FAILED, "failed"),
])
def test_other_failures(kwargs: dict, reason: str, text: str) -> None:
    s = compute(observe(pods=[pod("sv-prefill-1", "prefill", **kwargs)]), T0)
    d = cond(s, "Degraded")
    assert (d["status"], d["reason"]) == ("True", reason)
    assert text in d["message"]


def test_several_failures_are_counted() -> None:
    bad = {"waiting": "CrashLoopBackOff", "restarts": 1, "ready": False}
    s = compute(observe(pods=[pod("b", "decode", **bad), pod("a", "prefill", **bad), pod("c", "decode", **bad)]), T0)
    msg = cond(s, "Degraded")["message"]
    assert msg.startswith("prefill pod a:")
    assert msg.endswith("and 2 more failing pods (2 decode)")


def test_a_long_termination_message_keeps_its_end() -> None:
    long = "x" * 5000 + CRASH
    s = compute(observe(pods=[pod("a", "decode", waiting="CrashLoopBackOff", ready=False,
                                  last={"reason": "Error", "exitCode": 1, "message": long})]), T0)
    msg = cond(s, "Degraded")["message"]
    assert msg.endswith(CRASH) and len(msg) < 2200


def test_last_transition_time_changes_only_with_status() -> None:
    first = compute(observe({"decode": deployment("sv-decode", 2, 1)}), T0)
    # same status, different message: the time stays
    second = compute(observe({"decode": deployment("sv-decode", 2, 0)}, old=first), T1)
    assert cond(second, "DecodeReady")["lastTransitionTime"] == T0
    assert cond(second, "DecodeReady")["message"] != cond(first, "DecodeReady")["message"]
    # status changes: the time moves
    third = compute(observe(old=second), T1)
    assert cond(third, "DecodeReady")["lastTransitionTime"] == T1
    assert cond(third, "Admitted")["lastTransitionTime"] == T0


def test_unchanged_status_needs_no_patch() -> None:
    first = compute(observe(), T0)
    again = compute(observe(old=first), T1)
    assert patch_for(first, again) is None


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386, as the API server applies a merge patch."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _merge_patch(out.get(k), v)
    return out


def test_patch_removes_keys_we_do_not_write() -> None:
    new = compute(observe(), T0)
    old = {**new, "kopf": {"progress": {}}, "decode": {**new["decode"], "stale": 1}}
    patch = patch_for(old, new)
    assert patch is not None and patch["kopf"] is None and patch["decode"]["stale"] is None
    assert _merge_patch(old, patch) == new


def test_a_patch_made_against_a_stale_view_still_leaves_the_new_status() -> None:
    """The operator's idea of the stored status can lag behind the server (its watch has not shown its last
    write): the patch must leave exactly the new status whatever the server holds."""
    degraded = compute(observe({"decode": deployment("sv-decode", 2, 1)}), T0)
    ready = compute(observe(old=degraded), T1)
    believed = ready  # what a lagging view took the server to hold ...
    stored = degraded  # ... while the server still had the degraded status
    new = compute(observe(old=believed), T1)
    assert patch_for(believed, new) is None  # nothing to write by what the operator believed
    changed = {**new, "observedGeneration": new.get("observedGeneration", 0) + 1}
    patch = patch_for(believed, changed)
    assert patch is not None
    assert _merge_patch(stored, patch) == changed, "a field stayed as the stale server had it"


def test_transitions_are_status_changes_and_new_bad_news() -> None:
    pending = compute(observe({"decode": deployment("sv-decode", 2, 1)}), T0)
    ready = compute(observe(old=pending), T1)
    found = {(t.type, t.status, t.reason, t.quiet) for t in transitions(pending["conditions"], ready["conditions"])}
    # DecodeReady rose too, quietly: Ready's rise says so, and a pool's own rise is not an Event.
    assert found == {("DecodeReady", "True", R.REPLICAS_READY, True), ("Ready", "True", R.ALL_POOLS_READY, False),
                     ("Progressing", "False", R.ROLLOUT_COMPLETE, False)}
    first_visit = {t.reason for t in transitions(None, pending["conditions"])}
    assert first_visit == set()  # nothing alarming on a first visit
    crashing = compute(observe(pods=[pod("a", "decode", waiting="CrashLoopBackOff", ready=False)], old=ready), T1)
    (t,) = transitions(ready["conditions"], crashing["conditions"])
    assert (t.type, t.reason, t.warning) == ("Degraded", R.CRASH_LOOP_BACK_OFF, True)
    lost = compute(observe({"decode": deployment("sv-decode", 2, 1)}, old=ready), T1)
    went_down = {(t.type, t.status, t.quiet) for t in transitions(ready["conditions"], lost["conditions"])}
    assert {("DecodeReady", "False", False), ("Ready", "False", False)} <= went_down  # a pool going down is posted


def test_merge_orders_conditions() -> None:
    out = merge(None, [{"type": "Ready", "status": "True"}, {"type": "Admitted", "status": "True"}], T0)
    assert [c["type"] for c in out] == ["Admitted", "Ready"]


def rolling(step_pods: list[dict] | None = None) -> Observation:
    from specserving.reconcile.status import RolloutView
    from specserving.rollout import Pools, Router, Strategy, decide

    pools = {"aaaa1111": Pools({"prefill": 1, "decode": 2}, {"prefill": 1, "decode": 2}, 3),
             "bbbb2222": Pools({"prefill": 1, "decode": 2}, {"prefill": 1, "decode": 0}, 3)}
    d = decide("bbbb2222", {"prefill": 1, "decode": 2}, Strategy(), pools, Router("aaaa1111"))
    view = RolloutView("bbbb2222", d, "Surge", "aaaa1111", {"prefill": 1, "decode": 0},
                       next((f"pod {p['metadata']['name']}: {p['status']['conditions'][-1]['message']}"
                             for p in step_pods or []), None))
    o = observe()
    return dataclasses.replace(o, rollout=view)


def test_a_rollout_reports_its_step_and_revisions_and_stays_ready() -> None:
    s = compute(rolling(), T0)
    assert s["revision"] == "bbbb2222" and s["servingRevision"] == "aaaa1111"
    assert s["rollout"] == {"fromRevision": "aaaa1111", "toRevision": "bbbb2222", "strategy": "Surge",
                            "step": "ScalingUpNew", "description": "revision bbbb2222 to prefill 1, decode 2",
                            "servingRevision": "aaaa1111"}
    p = cond(s, "Progressing")
    assert (p["status"], p["reason"]) == ("True", "ScalingUpNew")
    assert "Ready in revision bbbb2222: prefill 1, decode 0" in p["message"]
    assert cond(s, "Ready")["status"] == "True"  # the old revision serves throughout


def test_an_unschedulable_new_revision_is_named_and_the_old_keeps_serving() -> None:
    blocked = {"metadata": {"name": "sv-decode-bbbb2222-x"}, "status": {"conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/8 nodes are available: 8 Insufficient nvidia.com/gpu."}]}}
    s = compute(rolling([blocked]), T0)
    p = cond(s, "Progressing")
    assert (p["status"], p["reason"]) == ("False", R.NEW_REVISION_UNSCHEDULABLE)
    assert "0/8 nodes are available" in p["message"] and "revision aaaa1111 keeps serving" in p["message"]


def test_pod_summary_carries_revision_and_the_schedulers_message() -> None:
    p = pod_of({"metadata": {"name": "x", "labels": {"specserving.io/role": "decode",
                                                      "specserving.io/revision": "bbbb2222"}},
                "status": {"phase": "Pending", "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no node"}]}})
    assert (p.revision, p.unschedulable) == ("bbbb2222", "no node")
