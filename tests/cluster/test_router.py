"""The router, run for real: the operator's own rendered router Deployment runs the real sglang-router and smg
(PyPI wheels, Rust on CPU) on the real node, and discovers the operator's own prefill and decode pods through the
real API server. Those pods run on the real node too, with the stand-in engine image (hack/stand-in-engine: NOT
SGLang, an HTTP server where a GPU process would answer) under the operator's rendered command, probes, preStop
drain and labels. What is asserted is read from each router's own API (GET /workers):

- every prefill and decode pod of the SpecServing is registered, every DP rank of each (dp-aware, dp 8), each
  prefill with its bootstrap port from the sglang.ai/bootstrap-port annotation;
- pods of another SpecServing in the namespace, and a look-alike pod with the same labels in another namespace,
  are never registered;
- a decode pod removed by `kubectl scale` is deregistered while it is still draining (its preStop runs);
- a PD-contract change under steady traffic through the router Service: no request fails, and every answer paired
  a prefill and a decode pod of one revision (docs/rollouts.md);
- ServingVerified is True after the rollout (a generate request through the router's Service reached a decode
  pod that fetched its bootstrap room from a prefill pod), and False with the router's error when the engines
  are made to fail, then True again once they recover (its retries with backoff).

The figures (Ready to registered, deletion to deregistered) are printed; docs/router.md quotes them. What stands
in: the engines (no model, no KV transfer, no GPU), the GPUs and RDMA NICs (extended resources the test
advertises on the real node), and the router image (the wheels on the stand-in Python base, not an lmsysorg image).
"""

from __future__ import annotations

import calendar
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .kube import Cluster, condition, wait_for
from .operating import Operator, cond_is, crd, ready, seed
from .realnode import (ENGINE_PORT, PLACEMENT, START_TIMEOUT, engine_image, fake_devices, http, on_real_node,
                       router_image, workers)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1800)]
__all__ = ["crd", "engine_image", "fake_devices", "router_image"]  # fixtures, used by name

BOOTSTRAP_PORT = 8998
DP = 8
POLL = 0.2


def real_spec(name: str, engine_image: str, router_image: str, implementation: str, *, prefill: int, decode: int,
              routers: int = 1) -> dict[str, Any]:
    """The seed (DSPARK, TP8/DP8, DP attention) on the real node (realnode.on_real_node)."""
    obj = seed()
    obj["metadata"]["name"] = name
    obj["spec"]["prefill"]["replicas"], obj["spec"]["decode"]["replicas"] = prefill, decode
    return on_real_node(obj, engine_image, router_image, implementation, routers=routers)


def lookalike(name: str, engine_image: str) -> dict[str, Any]:
    """A Ready stand-in engine carrying route-a's decode labels, in another namespace."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"specserving.io/instance": "route-a", "specserving.io/role": "decode"}},
            "spec": {**PLACEMENT, "containers": [{
                "name": "sglang", "image": engine_image, "command": ["python3", "-m", "sglang.launch_server"],
                "args": ["--disaggregation-mode", "decode", "--dp-size", str(DP), "--port", str(ENGINE_PORT)],
                "readinessProbe": {"httpGet": {"path": "/health", "port": ENGINE_PORT}, "periodSeconds": 2}}]}}


def pods_of(cluster: Cluster, ns: str, name: str, role: str) -> list[dict[str, Any]]:
    return cluster.list("pods", ns, f"specserving.io/instance={name},specserving.io/role={role}")


def urls(pod: dict[str, Any], dp_aware: bool) -> list[str]:
    """The workers a pod should be: one per DP rank (dp-aware), or the pod itself."""
    base = f"http://{pod['status']['podIP']}:{ENGINE_PORT}"
    return [f"{base}@{rank}" for rank in range(DP)] if dp_aware else [base]


def expected_urls(pods: list[dict[str, Any]], dp_aware: bool) -> set[str]:
    return {u for p in pods for u in urls(p, dp_aware)}


def ready_since(pod: dict[str, Any]) -> float:
    c = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    return float(calendar.timegm(time.strptime(c["lastTransitionTime"], "%Y-%m-%dT%H:%M:%SZ")))


def verified(cluster: Cluster, ns: str, status: str, reason: str, what: str) -> dict[str, Any]:
    """Wait for ServingVerified=status/reason; on timeout, say what the condition was."""
    deadline = time.monotonic() + 120
    while True:
        found = cond_is(cluster, ns, "ServingVerified", status, reason, name="route-a")
        if found is not None:
            return found
        if time.monotonic() > deadline:
            now = condition(cluster.get("specservings", "route-a", ns), "ServingVerified")
            pytest.fail(f"timed out after 120s waiting for {what}; ServingVerified is {now}", pytrace=False)
        time.sleep(0.5)


def fail_engines(pods: list[dict[str, Any]], how: dict[str, bool]) -> None:
    for p in pods:
        http("POST", f"http://{p['status']['podIP']}:{ENGINE_PORT}/stand-in/fail", how)


@pytest.fixture
def other_namespace(cluster: Cluster) -> Iterator[str]:
    name = f"lookalike-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    wait_for(lambda: cluster.get("serviceaccount", "default", name), 30, f"the default ServiceAccount in {name}")
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.mark.parametrize("implementation", ["sglang-router", "smg"])
def test_real_router_registers_exactly_our_pods(cluster: Cluster, namespace: str, other_namespace: str, crd: None,
                                                tmp_path: Path, engine_image: str, router_image: str,
                                                fake_devices: None, implementation: str) -> None:
    op = Operator(cluster, namespace, tmp_path / "operator.log", extra=["--serving-checks", "On"])
    try:
        _exercise(cluster, namespace, other_namespace, engine_image, router_image, implementation)
    finally:
        op.stop()
        print(f"\n--- operator log ---\n{op.log.read_text()[-5000:]}")
        logs = cluster.kubectl("logs", "-n", namespace, "deployment/route-a-router", "--tail=40", check=False)
        print(f"--- {implementation} log ---\n{logs.stdout}{logs.stderr}")


def _exercise(cluster: Cluster, ns: str, other_ns: str, engine_image: str, router_image: str,
              implementation: str) -> None:
    cluster.apply(real_spec("route-a", engine_image, router_image, implementation, prefill=1, decode=2),
                  namespace=ns)
    cluster.apply(real_spec("route-b", engine_image, router_image, implementation, prefill=1, decode=1, routers=0),
                  namespace=ns)
    cluster.apply(lookalike("route-a-decode-lookalike", engine_image), namespace=other_ns)
    for name in ("route-a", "route-b"):
        wait_for(lambda: ready(cluster, ns, name), START_TIMEOUT, f"SpecServing {name} to become Ready")

    router = pods_of(cluster, ns, "route-a", "router")[0]
    router_ip = router["status"]["podIP"]
    prefill, decode = pods_of(cluster, ns, "route-a", "prefill"), pods_of(cluster, ns, "route-a", "decode")
    strangers = {p["status"]["podIP"] for p in [*pods_of(cluster, ns, "route-b", "prefill"),
                                                 *pods_of(cluster, ns, "route-b", "decode"),
                                                 *cluster.list("pods", other_ns)] if p["status"].get("podIP")}
    assert len(strangers) == 3, f"route-b's two pods and the look-alike must be running: {strangers}"
    # smg routes DP ranks (dp-aware by default under DP attention); sglang-router 0.3.2 misroutes them in PD mode,
    # so the operator registers whole pods with it (docs/router.md).
    dp_aware = implementation == "smg"
    want = expected_urls(prefill, dp_aware) | expected_urls(decode, dp_aware)
    first_seen: dict[str, float] = {}

    def registered() -> dict[str, dict[str, Any]] | None:
        found = workers(router_ip)
        if found is None:
            return None
        now = time.time()
        for url in found:
            first_seen.setdefault(url, now)
        wrong = {u for u in found if u.split("//")[1].split(":")[0] in strangers}
        assert not wrong, f"{implementation} registered pods of another SpecServing or namespace: {wrong}"
        return found if set(found) == want else None

    found = wait_for(registered, 120, f"{implementation} to register exactly route-a's {len(want)} workers "
                                      f"(seen: {sorted(first_seen)})", interval=POLL)
    for p in prefill:
        for url in urls(p, dp_aware):
            assert found[url]["worker_type"] == "prefill" and found[url]["bootstrap_port"] == BOOTSTRAP_PORT, found[url]
    for p in decode:
        assert {found[url]["worker_type"] for url in urls(p, dp_aware)} == {"decode"}
    # From the later of the pod's and the router's Ready: an engine pod may be Ready before the router runs.
    router_ready = ready_since(cluster.get("pod", router["metadata"]["name"], ns) or router)
    lags = {p["metadata"]["name"]: max(first_seen[u] for u in urls(p, dp_aware)) - max(ready_since(p), router_ready)
            for p in [*prefill, *decode]}
    print(f"\n{implementation}: pod and router Ready -> registered "
          f"({'all ' + str(DP) + ' ranks' if dp_aware else 'the pod'}), seconds (Ready is stamped to the second): "
          + ", ".join(f"{k} {v:.1f}" for k, v in sorted(lags.items())))

    # ServingVerified: the first rollout's request went through the router to one decode and one prefill pod.
    message = condition(verified(cluster, ns, "True", "RequestServed", "ServingVerified=True"),
                        "ServingVerified")["message"]
    names = {p["metadata"]["name"] for p in [*prefill, *decode]}
    assert "decode pod" in message and any(n in message for n in names), message
    print(f"{implementation}: ServingVerified: {message}")

    # Broken engines, then a scale-down (a new rollout): the victim leaves the router while it still drains.
    fail_engines(decode, {"generate": True})
    before = {p["metadata"]["name"] for p in decode}
    cluster.kubectl("scale", "specserving", "route-a", "--replicas=1", "-n", ns)
    victim = wait_for(lambda: next((p for p in pods_of(cluster, ns, "route-a", "decode")
                                    if p["metadata"].get("deletionTimestamp")), None), 60, "a decode pod to terminate")
    deleting_at = time.time()
    assert victim["metadata"]["name"] in before
    gone_urls = expected_urls([victim], dp_aware)

    def deregistered() -> bool:
        found = workers(router_ip)
        return found is not None and not gone_urls & set(found)

    wait_for(deregistered, 60, f"{implementation} to deregister {victim['metadata']['name']}", interval=POLL)
    lag = time.time() - deleting_at
    still_there = cluster.get("pod", victim["metadata"]["name"], ns)
    assert still_there is not None and still_there["metadata"].get("deletionTimestamp"), \
        f"{victim['metadata']['name']} finished draining before {implementation} deregistered it ({lag:.1f}s)"
    print(f"{implementation}: deletion -> deregistered {lag:.1f}s (upper bound: seen by this poll); the pod was "
          "still draining (preStop)")

    message = condition(verified(cluster, ns, "False", "RequestFailed",
                                 "ServingVerified=False/RequestFailed with the engines failing"),
                        "ServingVerified")["message"]
    assert "stand-in engine told to fail" in message, message
    print(f"{implementation}: ServingVerified with failing engines: {message}")

    fail_engines([p for p in decode if p["metadata"]["name"] != victim["metadata"]["name"]], {})
    verified(cluster, ns, "True", "RequestServed", "ServingVerified=True again once the engines recover (a retry)")


class Traffic:
    """Completions through the router Service, one after another from a thread, each answer recorded: which
    prefill and decode pod served it, or the error."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.served: list[tuple[float, str, str]] = []
        self.failed: list[tuple[float, str]] = []
        self.stopping = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping:
            try:
                answer = http("POST", self.url, {"model": "/models/stand-in", "prompt": "x", "max_tokens": 1})
                self.served.append((time.time(), answer["stand_in"]["prefill_pod"], answer["stand_in"]["pod"]))
            except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
                body = exc.read().decode(errors="replace")[:300] if isinstance(exc, urllib.error.HTTPError) else ""
                self.failed.append((time.time(), f"{exc} {body}".strip()))
            time.sleep(0.05)

    def stop(self) -> None:
        self.stopping = True
        self.thread.join(30)


def revision_of_pod(pod_name: str, instance: str, role: str) -> str:
    return pod_name.removeprefix(f"{instance}-{role}-").split("-")[0]


@pytest.mark.parametrize("implementation", ["sglang-router", "smg"])
def test_real_router_switches_revisions_without_a_failed_request(cluster: Cluster, namespace: str, crd: None,
                                                                 tmp_path: Path, engine_image: str,
                                                                 router_image: str, fake_devices: None,
                                                                 implementation: str) -> None:
    """A contract change (speculative numSteps) under steady traffic through the router Service: every request is
    answered, and every answer paired a prefill and a decode pod of one revision; old first, then new."""
    op = Operator(cluster, namespace, tmp_path / "operator.log", extra=["--serving-checks", "On"])
    name = "roll"
    try:
        cluster.apply(real_spec(name, engine_image, router_image, implementation, prefill=1, decode=1),
                      namespace=namespace)
        obj = wait_for(lambda: ready(cluster, namespace, name), START_TIMEOUT, "the SpecServing to become Ready")
        old = obj["status"]["revision"]
        # Ready says the pods are; the Service's rules on the node follow a moment later (kube-proxy answers
        # "connection refused" until then). ServingVerified is the documented signal that the Service answers,
        # so the steady traffic, and what it counts, starts there: the claim is about the change, not start-up.
        wait_for(lambda: cond_is(cluster, namespace, "ServingVerified", "True", "RequestServed", name=name), 120,
                 "ServingVerified=True before the change")
        svc = cluster.get("service", f"{name}-router", namespace)
        traffic = Traffic(f"http://{svc['spec']['clusterIP']}:8000/v1/completions")
        wait_for(lambda: len(traffic.served) >= 5, 60, "traffic through the router before the change")
        changed = real_spec(name, engine_image, router_image, implementation, prefill=1, decode=1)
        changed["spec"]["speculative"]["numSteps"] = 3
        started = time.monotonic()
        changed_at = time.time()
        cluster.apply(changed, namespace=namespace)
        done = wait_for(lambda: (o := ready(cluster, namespace, name)) and o["status"]["revision"] != old
                        and o["status"].get("servingRevision") == o["status"]["revision"]
                        and "rollout" not in o["status"] and o, START_TIMEOUT, "the rollout to finish")
        new = done["status"]["revision"]
        seconds = time.monotonic() - started
        count = len(traffic.served)
        wait_for(lambda: len(traffic.served) >= count + 5, 60, "traffic served by the new revision")
        traffic.stop()
    finally:
        op.stop()
        print(f"\n--- operator log ---\n{op.log.read_text()[-3000:]}")
    pairs = [(revision_of_pod(p, name, "prefill"), revision_of_pod(d, name, "decode")) for _, p, d in traffic.served]
    assert not traffic.failed, f"{len(traffic.failed)} of {len(traffic.failed) + len(pairs)} requests failed " \
        f"(seconds from the change: {[round(t - changed_at, 2) for t, _ in traffic.failed[:5]]}): {traffic.failed[:5]}"
    assert all(p == d for p, d in pairs), [x for x in pairs if x[0] != x[1]][:5]
    # While the router rolls, a router pod of each revision answers (each pairs only its own); then only the new.
    times = {rev: [t for (t, _, _), (p, _) in zip(traffic.served, pairs, strict=True) if p == rev]
             for rev in (old, new)}
    assert times[old] and times[new] and set(p for p, _ in pairs) == {old, new}
    overlap = max(times[old]) - min(times[new])
    assert [p for p, _ in pairs[-5:]] == [new] * 5
    print(f"{implementation}: rollout {old} -> {new} in {seconds:.1f}s under traffic: {len(pairs)} requests, "
          f"0 failed, none paired across revisions; {len(times[old])} on the old revision, {len(times[new])} on "
          f"the new, both answering for {max(overlap, 0):.1f}s while the router rolled")
