"""Multi-node replicas on the real LeaderWorkerSet controller (sigs.k8s.io/lws, built from its Go module and run
by `hack/cluster.sh lws-up` with its CRDs and admission webhooks; `lws-down` removes all three when the module
ends, so the rest of the tier sees a cluster without LWS, as test_operator's DependencyMissing test needs).

examples/dspark-pd-tp16-2node.yaml (the seed at TP16/DP16 over two nodes per replica, for both pools): the
operator's LeaderWorkerSets are admitted and defaulted by LWS's own webhook, its controller makes the groups, the
pods land one per fake GPU node, LWS's pod webhook injects the leader address and worker index, and each pod's
arguments, expanded from the env on the pod object as the kubelet would, pass SGLang's start-up checks in the
release's own interpreter. The router's selectors pick the leaders only.

On kwok's fake nodes no container runs; the last test puts the groups on the real node (realnode.py's stand-ins)
so that the kubelet runs the probes, the leader's preStop drain and the terminations, with the real sglang-router
registering the leaders."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .kube import REPO, Cluster, condition, wait_for
from .operating import (NAME, READY_TIMEOUT, RESYNC_SECONDS, Operator, children, crd, example, operator, pods,
                        ready, sps)
from .realnode import ENGINE_PORT, START_TIMEOUT, engine_image, fake_devices, on_real_node, router_image, workers

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]
__all__ = ["crd", "engine_image", "fake_devices", "operator", "router_image"]  # fixtures, used by name

EXAMPLE = REPO / "examples" / "dspark-pd-tp16-2node.yaml"
RENDEZVOUS_PORT = 20000
LWS_LABEL = "leaderworkerset.sigs.k8s.io"
SERVER_ARGS_CHECK = REPO / "tests" / "decode_path" / "server_args_check.py"


def multinode(**changes: Any) -> dict[str, Any]:
    """examples/dspark-pd-tp16-2node.yaml, named as the seed (the helpers look pods up by that name)."""
    return example(EXAMPLE, **{"metadata.name": NAME, **changes})


def _cluster_sh(cluster: Cluster, command: str) -> subprocess.CompletedProcess[str]:
    # The cluster's folder is $KWOK_WORKDIR/clusters/<name>/, its kubeconfig inside it.
    cluster_dir = cluster.kubeconfig.parent
    env = {**cluster.env, "SPECSERVING_CLUSTER_NAME": cluster_dir.name,
           "SPECSERVING_KWOK_WORKDIR": str(cluster_dir.parent.parent)}
    return subprocess.run(["bash", str(REPO / "hack" / "cluster.sh"), command], env=env, text=True,
                          capture_output=True, timeout=900, check=False)


@pytest.fixture(scope="module")
def lws(cluster: Cluster) -> Iterator[None]:
    up = _cluster_sh(cluster, "lws-up")
    if up.returncode != 0:
        pytest.fail(f"hack/cluster.sh lws-up failed (exit {up.returncode}):\n{up.stderr[-4000:]}")
    try:
        yield
    finally:
        down = _cluster_sh(cluster, "lws-down")
        if down.returncode != 0:
            pytest.fail(f"hack/cluster.sh lws-down failed (exit {down.returncode}):\n{down.stderr[-4000:]}")


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if isinstance(e.get("value"), str)}


def expand(args: list[str], env: dict[str, str]) -> list[str]:
    """$(VAR) expanded from the container's env, as the kubelet does (an unknown name stays as written)."""
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), a) for a in args]


def _value(args: list[str], flag: str) -> str:
    assert flag in args, f"{flag} missing from {args}"
    return args[args.index(flag) + 1]


def _sglang_start_up_checks(version: str, cases: list[dict[str, Any]]) -> dict[str, str | None]:
    """server_args_check.py (the decode_path tier's harness, with its named stand-ins) in the release's own
    interpreter: label -> SGLang's refusal, or None."""
    manifest = Path(os.environ.get("SPECSERVING_CACHE", Path.home() / ".cache/specserving")) / "decode-path/envs.json"
    if not manifest.is_file():
        pytest.fail(f"{manifest} is missing: the SGLang interpreters come from bash hack/decode-path-env.sh")
    env = json.loads(manifest.read_text())[version]
    proc = subprocess.run([env["python"], str(SERVER_ARGS_CHECK), json.dumps(cases)], text=True,
                          capture_output=True, timeout=600, check=False,
                          env={"PYTHONPATH": ":".join(env["pythonpath"]), "PYTHONWARNINGS": "ignore",
                               "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, f"server_args_check.py failed on sglang {version}:\n{proc.stderr[-4000:]}"
    return {r["label"]: r["error"] for r in json.loads(proc.stdout.strip().splitlines()[-1])["results"]}


def test_multinode_groups_on_the_real_lws_controller(cluster: Cluster, namespace: str, lws: None,
                                                     operator: Operator) -> None:
    ns = namespace
    obj = multinode()
    started = time.monotonic()
    cluster.apply(obj, namespace=ns)
    wait_for(lambda: ready(cluster, ns), READY_TIMEOUT, "Ready with multi-node groups")
    ready_seconds = time.monotonic() - started

    groups = {"prefill": obj["spec"]["prefill"]["replicas"], "decode": obj["spec"]["decode"]["replicas"]}
    sets = _leaderworkersets(cluster, ns)
    assert set(sets) == {"prefill", "decode"}, sets.keys()
    server_cases, leaders = [], {}
    for role, lws_obj in sets.items():
        name = lws_obj["metadata"]["name"]
        # Defaulted by LWS's own mutating webhook: the operator does not render it.
        assert lws_obj["spec"].get("networkConfig", {}).get("subdomainPolicy") == "Shared", lws_obj["spec"]
        assert lws_obj["status"].get("readyReplicas") == groups[role], lws_obj["status"]
        role_pods = [p for p in pods(cluster, ns, role) if p["metadata"]["labels"].get(f"{LWS_LABEL}/name") == name]
        assert len(role_pods) == 2 * groups[role], [p["metadata"]["name"] for p in role_pods]
        by_group: dict[str, list[dict[str, Any]]] = {}
        for pod in role_pods:
            labels = pod["metadata"]["labels"]
            group, worker = labels[f"{LWS_LABEL}/group-index"], labels[f"{LWS_LABEL}/worker-index"]
            by_group.setdefault(group, []).append(pod)
            container = next(c for c in pod["spec"]["containers"] if c["name"] == "sglang")
            env = _env(container)
            # Injected by LWS's pod webhook, on the pod object (the operator's templates do not carry them).
            assert env.get("LWS_WORKER_INDEX") == worker, env
            assert env.get("LWS_LEADER_ADDRESS") == f"{name}-{group}.{name}.{ns}", env
            args = expand(container["args"], env)
            assert _value(args, "--nnodes") == "2" and _value(args, "--node-rank") == worker, args
            assert _value(args, "--dist-init-addr") == f"{name}-{group}.{name}.{ns}:{RENDEZVOUS_PORT}", args
            assert not any("$(" in a for a in args), args
            server_cases.append({"label": pod["metadata"]["name"], "args": args, "model": "deepseek-v4-dspark",
                                 "draft": "deepseek-v4-dspark"})
            if worker == "0":
                leaders.setdefault(role, set()).add(pod["metadata"]["name"])
        assert sorted(len(v) for v in by_group.values()) == [2] * groups[role], by_group.keys()
    nodes = [p["spec"].get("nodeName") for role in sets for p in pods(cluster, ns, role)]
    assert None not in nodes and len(set(nodes)) == len(nodes), f"two pods share a node: {nodes}"

    # The router registers leaders only: its selectors match exactly the worker-0 pods.
    router = next(c for c in children(cluster, ns) if c["kind"] == "Deployment"
                  and c["metadata"]["labels"].get("specserving.io/role") == "router")
    router_args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    for role, flag in (("prefill", "--prefill-selector"), ("decode", "--decode-selector")):
        start = router_args.index(flag) + 1
        selector = []
        for token in router_args[start:]:
            if token.startswith("--"):
                break
            selector.append(token)
        matched = cluster.kubectl("get", "pods", "-n", ns, "-l", ",".join(selector), "-o", "json").stdout
        assert {p["metadata"]["name"] for p in json.loads(matched)["items"]} == leaders[role], (role, selector)

    refused = {k: v for k, v in _sglang_start_up_checks("0.5.17", server_cases).items() if v}
    assert not refused, f"SGLang 0.5.17 refuses expanded pod arguments: {refused}"
    sys.stderr.write(f"\nmulti-node: Ready in {ready_seconds:.1f}s with {sum(groups.values())} groups "
                     f"({len(nodes)} pods)\n")


def _leaderworkersets(cluster: Cluster, ns: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["labels"]["specserving.io/role"]: o
            for o in cluster.list("leaderworkersets", ns, f"specserving.io/instance={NAME}")}


def _group_pods(cluster: Cluster, ns: str, role: str) -> dict[str, dict[str, str]]:
    """group index -> {pod name: uid} of one pool's pods that are not being deleted."""
    out: dict[str, dict[str, str]] = {}
    for pod in pods(cluster, ns, role):
        group = pod["metadata"]["labels"].get(f"{LWS_LABEL}/group-index", "?")
        out.setdefault(group, {})[pod["metadata"]["name"]] = pod["metadata"]["uid"]
    return out


def _summary(cluster: Cluster, ns: str, role: str) -> str:
    return str(sps(cluster, ns).get("status", {}).get(role, {}).get("readySummary"))


def test_group_recreation_scale_by_group_and_no_idle_writes(cluster: Cluster, namespace: str, lws: None,
                                                            operator: Operator) -> None:
    ns = namespace
    cluster.apply(multinode(), namespace=ns)
    wait_for(lambda: ready(cluster, ns), READY_TIMEOUT, "Ready with multi-node groups")
    wait_for(lambda: _summary(cluster, ns, "decode") == "2/2 groups (4/4 pods)", 30,
             f"decode status 2/2 groups (4/4 pods), not {_summary(cluster, ns, 'decode')}")
    assert _summary(cluster, ns, "prefill") == "1/1 groups (2/2 pods)"

    # Idle: neither the operator nor LWS's webhook defaults make the LeaderWorkerSets change over three resyncs.
    versions = {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in _leaderworkersets(cluster, ns).values()}
    time.sleep(3 * RESYNC_SECONDS + 1)
    assert {o["metadata"]["name"]: o["metadata"]["resourceVersion"]
            for o in _leaderworkersets(cluster, ns).values()} == versions, "idle LeaderWorkerSet writes"

    # Killing a worker recreates its whole group (RecreateGroupOnPodRestart): the leader is a new pod too.
    before = _group_pods(cluster, ns, "decode")
    worker = _decode_pod(cluster, ns, "0", "1")["metadata"]["name"]
    cluster.kubectl("delete", "pod", worker, "-n", ns, "--wait=false")
    started = time.monotonic()

    def recreated() -> bool:
        now = _group_pods(cluster, ns, "decode")
        return len(now.get("0", {})) == 2 and not set(now["0"].values()) & set(before["0"].values())

    wait_for(recreated, 60, f"decode group 0 recreated after deleting its worker {worker}")
    assert _group_pods(cluster, ns, "decode")["1"] == before["1"], "the other group was touched"
    wait_for(lambda: ready(cluster, ns) and _summary(cluster, ns, "decode") == "2/2 groups (4/4 pods)", 60,
             "Ready again with 2/2 decode groups")
    recreate_seconds = time.monotonic() - started

    # kubectl scale on the SpecServing scales decode by whole groups.
    cluster.kubectl("scale", "specserving", NAME, "-n", ns, "--replicas=1")
    wait_for(lambda: set(_group_pods(cluster, ns, "decode")) == {"0"} and ready(cluster, ns)
             and _summary(cluster, ns, "decode") == "1/1 groups (2/2 pods)", 60, "decode scaled to one group")
    assert len(_group_pods(cluster, ns, "decode")["0"]) == 2
    sys.stderr.write(f"\nmulti-node: group recreated and Ready in {recreate_seconds:.1f}s\n")


def test_a_group_that_does_not_fit_is_named_in_status(cluster: Cluster, namespace: str, lws: None,
                                                      operator: Operator) -> None:
    """More decode groups than free GPU nodes: the groups that fit serve, the rest wait, and DecodeReady names the
    groups that cannot be placed whole (the scheduler places pod by pod: a group may hold a node for its leader
    while its worker waits; docs/operator.md lists the gang-scheduling options)."""
    ns = namespace
    nodes = len(cluster.list("nodes", None, "type=kwok"))
    groups = nodes // 2 + 2  # the prefill group takes two nodes as well: at least two decode groups cannot fit
    cluster.apply(multinode(**{"spec.decode.replicas": groups}), namespace=ns)

    def named() -> dict[str, Any] | None:
        status = sps(cluster, ns).get("status", {})
        decode = next((c for c in status.get("conditions", []) if c["type"] == "DecodeReady"), {})
        return status if "cannot be placed whole" in decode.get("message", "") else None

    wait_for(named, 60, "DecodeReady naming the groups that cannot be placed")
    time.sleep(10)  # the scheduler's retries settle: what stays is what a cluster admin would find
    status = named()
    assert status is not None, "the unplaceable groups are no longer named"
    decode = next(c for c in status["conditions"] if c["type"] == "DecodeReady")
    assert decode["status"] == "False" and "nodes are available" in decode["message"], decode
    assert status["phase"] != "Ready" and status["decode"]["readyReplicas"] < groups, status["decode"]
    placed = [p for p in pods(cluster, ns, "decode") if p["spec"].get("nodeName")]
    sys.stderr.write(f"\nmulti-node: {groups} decode groups on {nodes} GPU nodes: "
                     f"{status['decode']['readySummary']}, {len(placed)} decode pods placed; {decode['message']}\n")
    cluster.kubectl("scale", "specserving", NAME, "-n", ns, "--replicas=1")
    wait_for(lambda: ready(cluster, ns), 60, "Ready once the pool fits")


def _leader_urls(cluster: Cluster, ns: str) -> set[str]:
    """The engine URLs of both pools' leaders (worker index 0) that are not being deleted (pods() leaves those out)."""
    return {f"http://{p['status']['podIP']}:{ENGINE_PORT}" for role in ("prefill", "decode")
            for p in pods(cluster, ns, role)
            if p["metadata"]["labels"].get(f"{LWS_LABEL}/worker-index") == "0" and p.get("status", {}).get("podIP")}


def _decode_pod(cluster: Cluster, ns: str, group: str, worker: str) -> dict[str, Any]:
    return next(p for p in pods(cluster, ns, "decode")
                if p["metadata"]["labels"].get(f"{LWS_LABEL}/group-index") == group
                and p["metadata"]["labels"].get(f"{LWS_LABEL}/worker-index") == worker)


def test_groups_on_the_real_node_register_leaders_and_drain_before_their_workers_stop(
        cluster: Cluster, namespace: str, lws: None, operator: Operator, engine_image: str, router_image: str,
        fake_devices: None) -> None:
    """The same example with its groups on the real node (the kubelet runs them: the leader's preStop drain, the
    readiness probes, the terminations), the stand-in engine in each pod and the real sglang-router in front:

    - the router registers exactly the leaders (its own GET /workers), never a worker;
    - a worker killed: its group is recreated and status counts it as not ready meanwhile, the router follows the
      new leader;
    - `kubectl scale` down by one group: the removed group's leader is deregistered at once and drains (its preStop)
      while its worker keeps running; the worker stops only after the leader is gone (the garbage collector removes
      the worker StatefulSet once its owner, the leader pod, is gone), so a TP16 group can finish what it runs."""
    ns = namespace
    started = time.monotonic()
    cluster.apply(on_real_node(multinode(), engine_image, router_image, "sglang-router"), namespace=ns)
    wait_for(lambda: ready(cluster, ns) and _summary(cluster, ns, "decode") == "2/2 groups (4/4 pods)",
             START_TIMEOUT, "Ready with 2/2 decode groups on the real node")
    ready_seconds = time.monotonic() - started
    router_ip = next(p["status"]["podIP"] for p in pods(cluster, ns, "router"))
    wait_for(lambda: set(workers(router_ip) or {}) == _leader_urls(cluster, ns), 60,
             f"sglang-router to register exactly the leaders {sorted(_leader_urls(cluster, ns))}, "
             f"not {sorted(workers(router_ip) or {})}", interval=0.5)
    registered = workers(router_ip) or {}
    assert len(registered) == 3, registered  # 1 prefill + 2 decode groups: one leader each
    assert {w["worker_type"] for w in registered.values()} == {"prefill", "decode"}, registered

    # A worker killed: the whole group is recreated, and status says so while it happens.
    before = _group_pods(cluster, ns, "decode")
    worker = _decode_pod(cluster, ns, "0", "1")["metadata"]["name"]
    cluster.kubectl("delete", "pod", worker, "-n", ns, "--wait=false")
    killed = time.monotonic()
    summaries: dict[str, str] = {}

    def recovered() -> bool:
        summary = _summary(cluster, ns, "decode")
        if summary != "2/2 groups (4/4 pods)":
            summaries.setdefault(summary, str((condition(sps(cluster, ns), "DecodeReady") or {}).get("message")))
        now = _group_pods(cluster, ns, "decode")
        return (summary == "2/2 groups (4/4 pods)" and len(now.get("0", {})) == 2
                and not set(now["0"].values()) & set(before["0"].values()) and bool(ready(cluster, ns)))

    wait_for(recovered, START_TIMEOUT, f"decode group 0 recreated and Ready after deleting its worker {worker}",
             interval=0.3)
    recreate_seconds = time.monotonic() - killed
    assert any(s.startswith("1/2 groups") for s in summaries), f"status never showed the group down: {summaries}"
    assert any("1 of 2 decode groups" in m for m in summaries.values()), summaries
    assert _group_pods(cluster, ns, "decode")["1"] == before["1"], "the other group was touched"
    wait_for(lambda: set(workers(router_ip) or {}) == _leader_urls(cluster, ns), 60,
             "sglang-router to follow the recreated group's new leader", interval=0.5)

    # Scale down by one group: LWS removes group 1. Its leader goes first and drains; its worker outlives it.
    leader, worker = _decode_pod(cluster, ns, "1", "0"), _decode_pod(cluster, ns, "1", "1")
    leader_name, worker_name = leader["metadata"]["name"], worker["metadata"]["name"]
    leader_url = f"http://{leader['status']['podIP']}:{ENGINE_PORT}"
    cluster.kubectl("scale", "specserving", NAME, "-n", ns, "--replicas=1")
    scaled = time.monotonic()
    seen: dict[str, float] = {}
    leader_last_seen = 0.0
    overlaps: list[str] = []
    while time.monotonic() - scaled < 120 and "worker gone" not in seen:
        # One list is one snapshot of the namespace (a single resourceVersion), so "the leader still there while its
        # worker stops" is judged on a consistent view, not on two reads some 100 ms apart.
        snapshot = {p["metadata"]["name"]: p for p in cluster.list("pods", ns)}
        registered_now = workers(router_ip)
        now = time.monotonic() - scaled
        leader_pod, worker_pod = snapshot.get(leader_name), snapshot.get(worker_name)
        if leader_pod is None:
            seen.setdefault("leader gone", now)
        else:
            leader_last_seen = now
            if leader_pod["metadata"].get("deletionTimestamp"):
                seen.setdefault("leader deleting", now)
        if registered_now is not None and leader_url not in registered_now:
            seen.setdefault("leader deregistered", now)
        if worker_pod is None:
            seen.setdefault("worker gone", now)
        elif worker_pod["metadata"].get("deletionTimestamp"):
            seen.setdefault("worker stopping", now)
        if leader_pod is not None and (worker_pod is None or worker_pod["metadata"].get("deletionTimestamp")):
            overlaps.append(f"{now:.1f}s")
        time.sleep(0.2)
    timeline = ", ".join(f"{k} {v:.1f}s" for k, v in sorted(seen.items(), key=lambda kv: kv[1]))
    assert {"leader deleting", "leader deregistered", "leader gone", "worker gone"} <= set(seen), timeline
    assert seen["leader deregistered"] < seen["leader gone"], f"the leader was not deregistered first: {timeline}"
    assert not overlaps, f"the worker stopped while its leader was still there (snapshots at {overlaps}): {timeline}"
    assert leader_last_seen - seen["leader deleting"] >= 10, f"the leader did not drain (preStop): {timeline}"
    wait_for(lambda: ready(cluster, ns) and _summary(cluster, ns, "decode") == "1/1 groups (2/2 pods)", 60,
             "Ready with one decode group")
    assert set(workers(router_ip) or {}) == _leader_urls(cluster, ns)
    sys.stderr.write(f"\nmulti-node on the real node: Ready in {ready_seconds:.1f}s; group recreated and Ready in "
                     f"{recreate_seconds:.1f}s (status meanwhile: {summaries}); scale 2 -> 1 group: {timeline}\n")
