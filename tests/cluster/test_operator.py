"""The operator against the real control plane: `specserving run` as a subprocess, one per test namespace.

Covers apply -> children -> pods Running on fake GPU nodes -> Ready with counts; the scale subresource and
prefill replicas; drift repair; a speculative-config update rolling the pods; an invalid resource refused by the
reconciler itself (no webhook here); deletion leaving no orphans; a crash-looping pod surfacing as Degraded with its
termination message; a missing CRD; and an idle window with zero writes. Every wait polls against a deadline.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from .kube import Cluster, condition, wait_for
from .operating import (CHILD_KINDS, CRASH, NAME, READY_TIMEOUT, Operator, apply_ready, children, cond_is, crd,
                        deployment, events, operator, parse_prometheus, pods, ready, seed, sps, total)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]
__all__ = ["crd", "operator"]  # fixtures, used by name

def test_apply_creates_children_pods_run_and_ready_counts(cluster: Cluster, namespace: str,
                                                          operator: Operator) -> None:
    ns = namespace
    obj, seconds = apply_ready(cluster, ns)
    print(f"\nfigure: apply -> Ready in {seconds:.1f}s (prefill 1, decode 2, router 1)")
    uid = obj["metadata"]["uid"]

    kinds = sorted((c["kind"], c["metadata"]["name"]) for c in children(cluster, ns))
    rev = obj["status"]["revision"]
    assert re.fullmatch(r"[0-9a-f]{8}", rev) and obj["status"]["servingRevision"] == rev
    assert kinds == sorted([
        ("Deployment", f"{NAME}-decode-{rev}"), ("Deployment", f"{NAME}-prefill-{rev}"),
        ("Deployment", f"{NAME}-router"),
        ("PodDisruptionBudget", f"{NAME}-decode"), ("PodDisruptionBudget", f"{NAME}-prefill"),
        ("Role", f"{NAME}-router"), ("RoleBinding", f"{NAME}-router"), ("Service", f"{NAME}-decode"),
        ("Service", f"{NAME}-prefill"), ("Service", f"{NAME}-router"), ("ServiceAccount", f"{NAME}-router")])
    shown = json.loads(cluster.kubectl("get", CHILD_KINDS, "-n", ns, "-l", f"specserving.io/instance={NAME}",
                                       "-o", "json", "--show-managed-fields").stdout)["items"]
    for child in shown:
        (ref,) = child["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == ("SpecServing", NAME, uid, True)
        assert any(m["manager"] == "specserving-operator" and m["operation"] == "Apply"
                   for m in child["metadata"]["managedFields"])

    decode = deployment(cluster, ns, "decode")["spec"]["template"]["spec"]["containers"][0]
    args = decode["args"]
    for flag, value in (("--speculative-algorithm", "DSPARK"), ("--disaggregation-mode", "decode"),
                        ("--tp-size", "8"), ("--dp-size", "8"), ("--disaggregation-ib-device",
                                                                 ",".join(f"mlx5_{i}" for i in range(8)))):
        assert args[args.index(flag) + 1] == value
    assert decode["resources"]["limits"] == {"nvidia.com/gpu": "8", "rdma/ib": "8"}

    for role, n in (("prefill", 1), ("decode", 2), ("router", 1)):
        running = pods(cluster, ns, role)
        assert len(running) == n and all(p["status"]["phase"] == "Running" for p in running)
        if role != "router":
            for p in running:
                node = cluster.get("node", p["spec"]["nodeName"])
                assert node and node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    gpu_nodes = {p["spec"]["nodeName"] for r in ("prefill", "decode") for p in pods(cluster, ns, r)}
    assert len(gpu_nodes) == 3  # one 8-GPU pod per node

    status = obj["status"]
    assert status["phase"] == "Ready"
    assert status["observedGeneration"] == obj["metadata"]["generation"]
    assert status["endpoint"] == f"http://{NAME}-router.{ns}.svc:8000"
    assert status["image"]["resolved"] == "lmsysorg/sglang:v0.5.17-cu129"
    assert status["image"]["sglangVersion"] == "0.5.17" and "DSPARK" in status["image"]["pdBuilders"]
    for role, n in (("prefill", 1), ("decode", 2), ("router", 1)):
        assert status[role]["readySummary"] == f"{n}/{n}"
        assert (status[role]["replicas"], status[role]["readyReplicas"], status[role]["desiredReplicas"]) == (n, n, n)
    assert condition(obj, "DecodeReady")["message"] == f"2 of 2 decode replicas ready (Deployment {NAME}-decode-{rev})"
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Admitted": "True", "ImageReady": "True", "Progressing": "False", "PrefillReady": "True",
        "DecodeReady": "True", "RouterReady": "True", "Ready": "True", "Degraded": "False"}
    assert set(status) <= {"observedGeneration", "phase", "endpoint", "conditions", "prefill", "decode", "router",
                           "image", "revision", "servingRevision"}, \
        "status holds only our fields (kopf's progress lives in annotations)"
    assert not obj["metadata"].get("finalizers")

    table = cluster.kubectl("get", "sps", NAME, "-n", ns).stdout
    assert re.search(rf"{NAME}\s+True\s+Ready\s+DSPARK\s+1/1\s+2/2\s+{rev}\s+lmsysorg/sglang:v0.5.17-cu129",
                     table), table
    assert events(cluster, ns, "ChildrenApplied")

    samples = operator.metrics()
    assert total(samples, "specserving_reconcile_total", result="applied") >= 1
    assert total(samples, "specserving_pool_replicas_ready", pool="decode") == 2
    assert total(samples, "specserving_specservings", phase="Ready") == 1


def test_scale_subresource_and_prefill_replicas(cluster: Cluster, namespace: str, operator: Operator) -> None:
    ns = namespace
    apply_ready(cluster, ns)
    started = time.monotonic()
    cluster.kubectl("scale", f"sps/{NAME}", "-n", ns, "--replicas=3")
    wait_for(lambda: deployment(cluster, ns, "decode")["spec"]["replicas"] == 3, 20, "decode Deployment at 3")
    obj = wait_for(lambda: ready(cluster, ns), READY_TIMEOUT, "Ready with 3 decode replicas")
    print(f"\nfigure: scale decode 2 -> 3 Ready in {time.monotonic() - started:.1f}s")
    assert obj["status"]["decode"]["readySummary"] == "3/3"
    scale = json.loads(cluster.kubectl(
        "get", "--raw", f"/apis/specserving.io/v1alpha1/namespaces/{ns}/specservings/{NAME}/scale").stdout)
    assert scale["spec"]["replicas"] == 3 and scale["status"]["replicas"] == 3
    assert scale["status"]["selector"] == f"specserving.io/instance={NAME},specserving.io/role=decode"

    # Scale down: the least-loaded decode pod goes first (load from the specserving.io/load annotation).
    decode_pods = sorted(p["metadata"]["name"] for p in pods(cluster, ns, "decode"))
    loads = dict(zip(decode_pods, ("7", "0", "3"), strict=True))
    for pod_name, load in loads.items():
        cluster.kubectl("annotate", "pod", pod_name, "-n", ns, f"specserving.io/load={load}", "--overwrite")
    idle = min(loads, key=lambda p: int(loads[p]))
    started = time.monotonic()
    cluster.kubectl("scale", f"sps/{NAME}", "-n", ns, "--replicas=2")
    obj = wait_for(lambda: (o := ready(cluster, ns)) and o["status"]["decode"]["replicas"] == 2 and o,
                   READY_TIMEOUT, "Ready with 2 decode replicas")
    print(f"figure: scale decode 3 -> 2 Ready in {time.monotonic() - started:.1f}s")
    remaining = {p["metadata"]["name"] for p in pods(cluster, ns, "decode")}
    assert idle not in remaining and remaining == set(decode_pods) - {idle}
    for p in pods(cluster, ns, "decode"):
        assert p["metadata"]["annotations"]["controller.kubernetes.io/pod-deletion-cost"] == \
            loads[p["metadata"]["name"]]
    assert events(cluster, ns, "DeletionCostSet")

    cluster.kubectl("patch", "sps", NAME, "-n", ns, "--type=merge", "-p", '{"spec":{"prefill":{"replicas":2}}}')
    wait_for(lambda: deployment(cluster, ns, "prefill")["spec"]["replicas"] == 2, 20, "prefill Deployment at 2")
    obj = wait_for(lambda: (o := ready(cluster, ns)) and o["status"]["prefill"]["readyReplicas"] == 2 and o,
                   READY_TIMEOUT, "Ready with 2 prefill replicas")
    assert obj["status"]["prefill"]["readySummary"] == "2/2"


def test_deleted_and_edited_children_are_restored(cluster: Cluster, namespace: str, operator: Operator) -> None:
    ns = namespace
    apply_ready(cluster, ns)
    svc_uid = cluster.get("service", f"{NAME}-decode", ns)["metadata"]["uid"]
    router_uid = deployment(cluster, ns, "router")["metadata"]["uid"]
    rendered_args = deployment(cluster, ns, "decode")["spec"]["template"]["spec"]["containers"][0]["args"]

    started = time.monotonic()
    cluster.kubectl("delete", "service", f"{NAME}-decode", "-n", ns, "--wait=false")
    cluster.kubectl("delete", "deployment", f"{NAME}-router", "-n", ns, "--wait=false")
    wait_for(lambda: (s := cluster.get("service", f"{NAME}-decode", ns)) and s["metadata"]["uid"] != svc_uid,
             30, "the decode Service to be recreated")
    wait_for(lambda: (d := cluster.get("deployment", f"{NAME}-router", ns)) and d["metadata"]["uid"] != router_uid,
             30, "the router Deployment to be recreated")
    print(f"\nfigure: deleted children restored in {time.monotonic() - started:.1f}s")

    patch = [{"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": "--hand-edit"},
             {"op": "replace", "path": "/spec/replicas", "value": 5}]
    cluster.kubectl("patch", "deployment", cluster.pool_name(NAME, "decode", ns), "-n", ns, "--type=json", "-p",
                    json.dumps(patch))
    wait_for(lambda: (d := deployment(cluster, ns, "decode"))["spec"]["replicas"] == 2
             and d["spec"]["template"]["spec"]["containers"][0]["args"] == rendered_args,
             30, "the hand-edited decode Deployment to be restored")
    wait_for(lambda: ready(cluster, ns), READY_TIMEOUT, "Ready again")
    assert events(cluster, ns, "DriftRepaired")


def test_speculative_update_rolls_the_pods(cluster: Cluster, namespace: str, operator: Operator) -> None:
    ns = namespace
    apply_ready(cluster, ns)
    old_hashes = {p["metadata"]["labels"]["pod-template-hash"] for p in pods(cluster, ns, "decode")}
    started = time.monotonic()
    cluster.kubectl("patch", "sps", NAME, "-n", ns, "--type=merge", "-p",
                    '{"spec":{"speculative":{"numSteps":3,"numDraftTokens":4}}}')
    wait_for(lambda: "--speculative-num-steps" in deployment(cluster, ns, "decode")["spec"]["template"]["spec"][
        "containers"][0]["args"], 20, "the decode template to carry --speculative-num-steps")

    def rolled() -> bool:
        current = pods(cluster, ns, "decode")
        hashes = {p["metadata"]["labels"]["pod-template-hash"] for p in current}
        return len(current) == 2 and not hashes & old_hashes and bool(ready(cluster, ns))

    wait_for(rolled, READY_TIMEOUT, "every decode pod on the new template, and Ready")
    print(f"\nfigure: speculative update rolled decode (2 pods) and Ready in {time.monotonic() - started:.1f}s")
    args = pods(cluster, ns, "decode")[0]["spec"]["containers"][0]["args"]
    assert args[args.index("--speculative-num-steps") + 1] == "3"
    obj = sps(cluster, ns)
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"] == 2


def test_invalid_resource_is_refused_without_children(cluster: Cluster, namespace: str, operator: Operator) -> None:
    ns = namespace
    cluster.apply(seed(**{"spec.speculative.algorithm": "NGRAM"}), namespace=ns)
    obj = wait_for(lambda: cond_is(cluster, ns, "Admitted", "False", "InvalidSpec"), 30, "Admitted=False")
    message = condition(obj, "Admitted")["message"]
    assert message.startswith('spec.speculative.algorithm: Unsupported value: "NGRAM"')
    assert obj["status"]["phase"] == "Rejected"
    assert condition(obj, "Ready")["reason"] == "InvalidSpec"
    assert children(cluster, ns) == []
    assert wait_for(lambda: events(cluster, ns, "InvalidSpec"), 10, "an InvalidSpec event")[0]["type"] == "Warning"
    # Fixing the spec admits it.
    cluster.kubectl("patch", "sps", NAME, "-n", ns, "--type=merge", "-p",
                    '{"spec":{"speculative":{"algorithm":"EAGLE"}}}')
    wait_for(lambda: ready(cluster, ns), READY_TIMEOUT, "Ready after the fix")


def test_missing_crd_is_a_dependency_condition(cluster: Cluster, namespace: str, operator: Operator) -> None:
    ns = namespace
    cluster.apply(seed(**{"spec.engine.tp": 16, "spec.engine.dp": 16, "spec.prefill.nodesPerReplica": 2,
                          "spec.decode.nodesPerReplica": 2}), namespace=ns)
    obj = wait_for(lambda: cond_is(cluster, ns, "Ready", "False", "DependencyMissing"), 30, "DependencyMissing")
    assert "LeaderWorkerSet (leaderworkerset.x-k8s.io/v1) is not served" in condition(obj, "Ready")["message"]
    assert obj["status"]["phase"] == "Pending"
    assert children(cluster, ns) == []


def test_deletion_leaves_no_orphans(cluster: Cluster, namespace: str, operator: Operator) -> None:
    ns = namespace
    apply_ready(cluster, ns)
    assert children(cluster, ns) and pods(cluster, ns, "decode")
    cluster.kubectl("delete", "sps", NAME, "-n", ns, "--wait=true", "--timeout=30s")
    started = time.monotonic()
    wait_for(lambda: not children(cluster, ns), 60, "every child to be garbage-collected")
    wait_for(lambda: not cluster.list("pods", ns, f"specserving.io/instance={NAME}"), 60, "every pod to go")
    print(f"\nfigure: children and pods gone {time.monotonic() - started:.1f}s after the SpecServing")


def test_crash_loop_degrades_with_the_termination_message(cluster: Cluster, namespace: str,
                                                          operator: Operator) -> None:
    ns = namespace
    apply_ready(cluster, ns)
    # A new decode template whose pods crash on their first decode (kwok's crash stage plays the container).
    patch = {"spec": {"template": {"metadata": {"annotations": {"kwok.specserving.io/crash-message": CRASH}}}}}
    cluster.kubectl("patch", "deployment", cluster.pool_name(NAME, "decode", ns), "-n", ns, "--type=merge", "-p",
                    json.dumps(patch))
    obj = wait_for(lambda: cond_is(cluster, ns, "Degraded", "True", "CrashLoopBackOff"), 60, "Degraded=True")
    message = condition(obj, "Degraded")["message"]
    assert re.fullmatch(rf"decode pod {NAME}-decode-\S+: container sglang is in CrashLoopBackOff after 3 restarts; "
                        rf"last terminated: Error \(exit code 1\): {re.escape(CRASH)}", message), message
    assert obj["status"]["phase"] == "Degraded"
    assert condition(obj, "DecodeReady")["status"] == "False"
    assert wait_for(lambda: events(cluster, ns, "CrashLoopBackOff"), 10, "a CrashLoopBackOff event")[0][
        "type"] == "Warning"
    # The annotation is not a field the operator renders, so it is not drift: the crash stays until fixed.
    cluster.kubectl("patch", "deployment", cluster.pool_name(NAME, "decode", ns), "-n", ns, "--type=json", "-p",
                    json.dumps([{"op": "remove", "path": "/spec/template/metadata/annotations"}]))
    wait_for(lambda: cond_is(cluster, ns, "Degraded", "False"), READY_TIMEOUT, "Degraded=False after the fix")


WRITE_VERBS = "POST|PUT|PATCH|APPLY|DELETE"
OUR_RESOURCES = "specservings|deployments|services|serviceaccounts|roles|rolebindings|poddisruptionbudgets|events"


def apiserver_writes(cluster: Cluster) -> dict[str, float]:
    """apiserver_request_total for write verbs on the kinds the operator writes, by verb/resource/subresource."""
    samples = parse_prometheus(cluster.kubectl("get", "--raw", "/metrics").stdout)
    out: dict[str, float] = {}
    for key, value in samples.items():
        metric, _, rest = key.partition("{")
        if metric != "apiserver_request_total":
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', rest))
        verb, resource, sub = labels.get("verb", ""), labels.get("resource", ""), labels.get("subresource")
        if re.fullmatch(WRITE_VERBS, verb) and re.fullmatch(OUR_RESOURCES, resource):
            k = f"{verb} {resource}{'/' + sub if sub else ''}"
            out[k] = out.get(k, 0) + value
    return out


def test_idle_resync_makes_no_writes(cluster: Cluster, namespace: str, operator: Operator) -> None:
    ns = namespace
    apply_ready(cluster, ns)

    # Let the last watch events settle: wait until a full resync passes without any request.
    def quiet() -> dict[str, float] | None:
        before = operator.metrics()
        passes = total(before, "specserving_reconcile_total")
        wait_for(lambda: total(operator.metrics(), "specserving_reconcile_total") > passes, 10, "a resync pass")
        after = operator.metrics()
        same = total(after, "specserving_api_requests_total") == total(before, "specserving_api_requests_total")
        return after if same else None

    start = wait_for(quiet, 30, "a resync pass without API requests")
    api_before = apiserver_writes(cluster)
    t0 = time.monotonic()
    passes0 = total(start, "specserving_reconcile_total")
    wait_for(lambda: total(operator.metrics(), "specserving_reconcile_total") >= passes0 + 5, 30,
             "five resync passes")
    end = operator.metrics()
    window = time.monotonic() - t0
    requests = total(end, "specserving_api_requests_total") - total(start, "specserving_api_requests_total")
    writes = total(end, "specserving_status_writes_total") - total(start, "specserving_status_writes_total")
    passes = total(end, "specserving_reconcile_total") - passes0
    api_after = apiserver_writes(cluster)
    api_delta = {k: v - api_before.get(k, 0) for k, v in api_after.items() if v != api_before.get(k, 0)}
    # Other clients keep writing in a shared cluster (the controller-manager updates Deployment status and events
    # while earlier tests' namespaces are deleted), so the API server's figure that is ours alone is server-side
    # apply (only the operator applies) and updates of specservings (the operator and its kopf; the namespace
    # controller only deletes them).
    api_writes = sum(v for k, v in api_delta.items()
                     if k.startswith("APPLY ") or (" specservings" in k and not k.startswith("DELETE ")))
    print(f"\nfigure: idle window {window:.1f}s, {passes:.0f} resync passes: {requests:.0f} operator API requests, "
          f"{writes:.0f} status writes; apiserver: {api_writes:.0f} applies and SpecServing writes (writes to our "
          f"kinds by all clients: {api_delta})")
    assert requests == 0 and writes == 0
    assert api_writes == 0



def test_a_restart_resumes_without_writes(cluster: Cluster, namespace: str, operator: Operator,
                                          tmp_path: Path) -> None:
    ns = namespace
    apply_ready(cluster, ns)
    operator.stop()
    api_before = apiserver_writes(cluster)
    again = Operator(cluster, ns, tmp_path / "operator-restarted.log")
    try:
        wait_for(lambda: total(again.metrics(), "specserving_reconcile_total") >= 3, 30,
                 "the resume pass and two resyncs")
        samples = again.metrics()
        api_delta = {k: v - api_before.get(k, 0) for k, v in apiserver_writes(cluster).items()
                     if v != api_before.get(k, 0)}
        print(f"\nfigure: restart: {total(samples, 'specserving_api_requests_total'):.0f} operator requests "
              f"({total(samples, 'specserving_api_requests_total', verb='DISCOVER'):.0f} discovery), apiserver "
              f"writes to our kinds by any client: {api_delta}")
        assert total(samples, "specserving_child_applies_total") == 0
        assert total(samples, "specserving_status_writes_total") == 0
        assert total(samples, "specserving_api_requests_total", verb="APPLY|PATCH|POST|PUT|DELETE") == 0
        assert ready(cluster, ns)
    finally:
        again.stop()


def test_a_child_the_api_server_refuses_blocks_the_whole_rendering(cluster: Cluster, namespace: str,
                                                                   operator: Operator) -> None:
    """A spec admission cannot judge whole (a toleration is free-form) renders a child the API server refuses: its
    dry run names the child and the API server's words in Ready, and nothing of the rendering is applied."""
    ns = namespace
    cluster.apply(seed(**{"spec.router.tolerations": [{"key": "gpu", "operator": "Sometimes"}]}), namespace=ns)
    obj = wait_for(lambda: cond_is(cluster, ns, "Ready", "False", "InvalidRenderedConfig"), 30,
                   "Ready=False InvalidRenderedConfig")
    message = condition(obj, "Ready")["message"]
    assert f"Deployment {NAME}-router" in message and "Sometimes" in message, message
    assert condition(obj, "Progressing")["reason"] == "InvalidRenderedConfig"
    assert condition(obj, "Admitted")["status"] == "True"
    assert children(cluster, ns) == []  # not even the Services and the ServiceAccount
    event = wait_for(lambda: events(cluster, ns, "InvalidRenderedConfig"), 10, "an InvalidRenderedConfig event")[0]
    assert event["type"] == "Warning"
    cluster.kubectl("patch", "sps", NAME, "-n", ns, "--type=json", "-p",
                    '[{"op":"remove","path":"/spec/router/tolerations"}]')
    wait_for(lambda: ready(cluster, ns), READY_TIMEOUT, "Ready after the fix")
    # A change to one child alone is not dry-run first (its apply is taken whole or not at all): the refusal of the
    # apply itself must read the same, and leave the child as it was.
    decode = next(c for c in children(cluster, ns)
                  if c["kind"] == "Deployment" and "-decode" in c["metadata"]["name"])
    cluster.kubectl("patch", "sps", NAME, "-n", ns, "--type=merge", "-p",
                    '{"spec":{"decode":{"tolerations":[{"key":"gpu","operator":"Sometimes"}]}}}')
    obj = wait_for(lambda: cond_is(cluster, ns, "Ready", "False", "InvalidRenderedConfig"), 30,
                   "Ready=False InvalidRenderedConfig for the decode pool alone")
    message = condition(obj, "Ready")["message"]
    assert f"Deployment {decode['metadata']['name']}" in message and "Sometimes" in message, message
    after = cluster.get("deployment", decode["metadata"]["name"], namespace=ns)
    assert after is not None, "the decode Deployment is gone"
    assert after["metadata"]["generation"] == decode["metadata"]["generation"], "the refused child changed"
