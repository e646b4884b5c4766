"""The peer in the same run: the LeaderWorkerSet controller (sigs.k8s.io/lws v0.9.0, Go, controller-runtime), built
from its Go module and started by hack/lws.sh on the bench's own cluster, with its CRDs and admission webhooks.

It gets the operator's treatment: N LeaderWorkerSets in one `kubectl apply --server-side -f` after a marker line,
and from that line, per object, the arrival at the bench's watches of its StatefulSets (the leader one, which LWS
creates, and the worker one, which LWS creates once the StatefulSet controller has made the leader pod), of its
pods, and of its Available condition; then the manager's CPU and peak RSS from /proc. Each LeaderWorkerSet is one
group of two pods (leader and worker, no GPU: only creation is timed), the shape of a SpecServing pool replica that
spans two nodes. What it does not share with a SpecServing: no image resolution, 2 direct children instead of 11,
no Services or RBAC objects, and its status is one condition.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.cluster import Cluster, log
from bench.kubeapi import Api, Watch
from bench.measure import apply_stream, wait_until
from bench.operating import CLK_TCK
from bench.stats import summary
from bench.workload import marker
from harness.cluster import cluster_sh

NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
PAUSE = "registry.k8s.io/pause:3.10"  # kwok plays the containers: nothing pulls it


def name(i: int) -> str:
    return f"lws-{i:04d}"


def leaderworkerset(i: int, namespace: str) -> dict[str, Any]:
    pod = {"spec": {"nodeSelector": {"type": "kwok"},
                    "containers": [{"name": "engine", "image": PAUSE,
                                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}}
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": name(i), "namespace": namespace},
            "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": 2, "leaderTemplate": pod,
                                                              "workerTemplate": pod}}}


class PeerRecorder:
    """First arrivals per LeaderWorkerSet: its StatefulSets, its pods, and its Available condition."""

    def __init__(self, api: Api, namespace: str) -> None:
        self.lock = threading.Lock()
        self.sets: dict[str, dict[str, float]] = defaultdict(dict)  # lws -> StatefulSet name -> first seen
        self.pods: dict[str, dict[str, float]] = defaultdict(dict)
        self.available: dict[str, float] = {}
        base = f"/namespaces/{namespace}"
        self.watches = [
            Watch(api, f"/apis/apps/v1{base}/statefulsets", self._child(self.sets)),
            Watch(api, f"/api/v1{base}/pods", self._child(self.pods)),
            Watch(api, f"/apis/leaderworkerset.x-k8s.io/v1{base}/leaderworkersets", self._lws),
        ]

    def start(self) -> None:
        for w in self.watches:
            w.start()
        for w in self.watches:
            if not w.synced.wait(60):
                raise RuntimeError(f"the bench's watch on {w.path} did not start: {w.error}")

    def stop(self) -> None:
        for w in self.watches:
            w.stop()

    def _child(self, into: dict[str, dict[str, float]]):  # type: ignore[no-untyped-def]
        def handle(type_: str, obj: dict[str, Any], t: float) -> None:
            owner = (obj["metadata"].get("labels") or {}).get(NAME_LABEL)
            if owner and type_ != "DELETED":
                with self.lock:
                    into[owner].setdefault(obj["metadata"]["name"], t)
        return handle

    def _lws(self, type_: str, obj: dict[str, Any], t: float) -> None:
        conditions = (obj.get("status") or {}).get("conditions") or []
        if type_ != "DELETED" and any(c.get("type") == "Available" and c.get("status") == "True"
                                      for c in conditions):
            with self.lock:
                self.available.setdefault(obj["metadata"]["name"], t)

    def both(self, table: dict[str, dict[str, float]], lws: str) -> float | None:
        """When the second of an LWS's two objects of one kind arrived."""
        with self.lock:
            seen = sorted(table.get(lws, {}).values())
        return seen[1] if len(seen) >= 2 else None

    def available_at(self, lws: str) -> float | None:
        with self.lock:
            return self.available.get(lws)


def _proc(pid: int) -> tuple[float, float]:
    """(CPU seconds so far, peak RSS in MiB) of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    peak = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            peak = int(line.split()[1]) / 1024
    return (int(fields[11]) + int(fields[12])) / CLK_TCK, peak


def _all(fn: Any, n: int) -> dict[int, float] | None:
    found = {}
    for i in range(n):
        t = fn(name(i))
        if t is None:
            return None
        found[i] = t
    return found


def lws_phase(cluster: Cluster, n: int, out_dir: Path, timeout: float) -> dict[str, Any]:
    """Start the LWS manager on the bench's cluster, apply N LeaderWorkerSets, time them, stop it (CRDs and all)."""
    assert cluster.name is not None, "hack/cluster.sh starts the manager on a cluster it knows by name"
    env = dict(cluster.env, SPECSERVING_CLUSTER_NAME=cluster.name)
    up = cluster_sh("lws-up", env, 1800)
    if up.returncode != 0:
        raise RuntimeError(f"hack/cluster.sh lws-up failed:\n{up.stderr[-3000:]}")
    ns = f"bench-lws-{n}"
    pid = int((Path(cluster.kubeconfig).parent / "lws" / "pid").read_text())
    cluster.create_namespace(ns, {"specserving.io/bench": "true"})
    rec = PeerRecorder(cluster.api, ns)
    rec.start()
    try:
        cpu0, _ = _proc(pid)
        log(f"N={n} LeaderWorkerSet peer: kubectl apply --server-side of {n} LeaderWorkerSets in {ns}")
        docs = [marker(ns, f"lws-{n}"), *(leaderworkerset(i, ns) for i in range(n))]
        times = apply_stream(cluster, docs, out_dir / f"lws-{n}.yaml")
        t0 = times[0]
        sets = wait_until("the LeaderWorkerSets' StatefulSets", lambda: _all(lambda x: rec.both(rec.sets, x), n),
                          timeout)
        pods = wait_until("the LeaderWorkerSets' pods", lambda: _all(lambda x: rec.both(rec.pods, x), n), timeout)
        available = wait_until("the LeaderWorkerSets Available", lambda: _all(rec.available_at, n), timeout * 2)
        cpu1, peak = _proc(pid)
        out: dict[str, Any] = {
            "version": "v0.9.0",
            "statefulsets": summary([sets[i] - t0 for i in sorted(sets)]),
            "pods": summary([pods[i] - t0 for i in sorted(pods)]),
            "available": summary([available[i] - t0 for i in sorted(available)]),
            "statefulsets_since_own_apply": summary([sets[i] - times[i + 1] for i in sorted(sets)]),
            "cpu_seconds": cpu1 - cpu0, "peak_rss_mib": peak,
        }
        log(f"N={n} LeaderWorkerSet peer: StatefulSets p50 {out['statefulsets']['p50']:.3f} s, Available p50 "
            f"{out['available']['p50']:.3f} s, {out['cpu_seconds']:.1f} CPU s, peak RSS {peak:.0f} MiB")
        return out
    finally:
        rec.stop()
        down = cluster_sh("lws-down", env, 600)  # the CRDs go, and with them every LeaderWorkerSet
        if down.returncode != 0:
            log(f"hack/cluster.sh lws-down failed: {down.stderr[-1000:]}")
        cluster.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)
