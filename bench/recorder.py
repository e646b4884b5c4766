"""What the watches saw in one namespace, with the time each thing was first seen.

One Recorder per namespace: it watches SpecServings, every child kind the renderer makes, and pods, and keeps
- when each object was first seen (its ADDED event's arrival),
- when each SpecServing was first Ready for its current generation,
- when all of an instance's Deployments were first available at once (the baseline's "Ready"),
- per instance, a history of (time, ready decode pods) for the scale measurements.
Times are time.monotonic() at the moment the event reached the bench.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

from bench.kubeapi import Api, Watch

INSTANCE = "specserving.io/instance"
ROLE = "specserving.io/role"
# (path template, kind) of everything the bench watches; {ns} is the namespace.
RESOURCES = [
    ("/apis/specserving.io/v1alpha1/namespaces/{ns}/specservings", "SpecServing"),
    ("/apis/apps/v1/namespaces/{ns}/deployments", "Deployment"),
    ("/api/v1/namespaces/{ns}/services", "Service"),
    ("/api/v1/namespaces/{ns}/serviceaccounts", "ServiceAccount"),
    ("/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles", "Role"),
    ("/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings", "RoleBinding"),
    ("/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets", "PodDisruptionBudget"),
    ("/api/v1/namespaces/{ns}/pods", "Pod"),
]


def sps_ready(obj: dict[str, Any]) -> bool:
    generation = obj.get("metadata", {}).get("generation")
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True" and c.get("observedGeneration") == generation
    return False


def deployment_available(obj: dict[str, Any]) -> bool:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    want = spec.get("replicas", 1)
    return (status.get("observedGeneration", 0) >= obj["metadata"].get("generation", 0)
            and status.get("replicas", 0) == want and status.get("updatedReplicas", 0) >= want
            and status.get("availableReplicas", 0) >= want)


def pod_ready(obj: dict[str, Any]) -> bool:
    if obj["metadata"].get("deletionTimestamp"):
        return False
    status = obj.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


class Recorder:
    def __init__(self, api: Api, namespace: str) -> None:
        self.namespace = namespace
        self.lock = threading.Lock()
        self.first_seen: dict[tuple[str, str], float] = {}
        self.sps_ready_at: dict[str, float] = {}  # name -> first Ready for the generation it was Ready at
        self.sps_ready_gen: dict[str, int] = {}
        self.sps_state: dict[str, tuple[int, bool]] = {}  # name -> (generation, ready)
        self.available: dict[str, bool] = {}  # deployment name -> available
        self.deploy_instance: dict[str, str] = {}
        self.all_available_at: dict[str, float] = {}  # instance -> first time all its deployments were available
        self.decode_ready: dict[str, set[str]] = defaultdict(set)  # instance -> ready decode pod names
        self.decode_pods: dict[str, set[str]] = defaultdict(set)  # instance -> decode pods not being deleted
        self.decode_history: dict[str, list[tuple[float, int]]] = defaultdict(list)
        self.decode_created: dict[str, list[tuple[float, int]]] = defaultdict(list)  # (time, decode pods) history
        self.events = 0
        self.watches = [Watch(api, path.format(ns=namespace), self._handler(kind)) for path, kind in RESOURCES]

    def start(self) -> None:
        for w in self.watches:
            w.start()
        for w in self.watches:
            if not w.synced.wait(60):
                raise RuntimeError(f"the bench's watch on {w.path} did not start: {w.error}")

    def stop(self) -> None:
        for w in self.watches:
            w.stop()

    def errors(self) -> list[str]:
        return [f"{w.path}: {w.error}" for w in self.watches if w.error]

    def _handler(self, kind: str):  # type: ignore[no-untyped-def]
        def handle(type_: str, obj: dict[str, Any], t: float) -> None:
            meta = obj.get("metadata") or {}
            name = meta.get("name", "")
            with self.lock:
                self.events += 1
                if type_ != "DELETED":
                    self.first_seen.setdefault((kind, name), t)
                if kind == "SpecServing":
                    self._sps(type_, name, obj, t)
                elif kind == "Deployment":
                    self._deployment(type_, name, obj, t)
                elif kind == "Pod":
                    self._pod(type_, name, obj, t)

        return handle

    def _sps(self, type_: str, name: str, obj: dict[str, Any], t: float) -> None:
        if type_ == "DELETED":
            self.sps_state.pop(name, None)
            return
        generation = int(obj["metadata"].get("generation") or 0)
        ready = sps_ready(obj)
        self.sps_state[name] = (generation, ready)
        if ready and self.sps_ready_gen.get(name) != generation:
            self.sps_ready_gen[name] = generation
            self.sps_ready_at.setdefault(name, t)

    def _deployment(self, type_: str, name: str, obj: dict[str, Any], t: float) -> None:
        instance = (obj["metadata"].get("labels") or {}).get(INSTANCE)
        if not instance:
            return
        self.deploy_instance[name] = instance
        self.available[name] = type_ != "DELETED" and deployment_available(obj)
        if instance not in self.all_available_at:
            mine = [d for d, i in self.deploy_instance.items() if i == instance]
            if len(mine) >= 3 and all(self.available.get(d) for d in mine):
                self.all_available_at[instance] = t

    def _pod(self, type_: str, name: str, obj: dict[str, Any], t: float) -> None:
        labels = obj["metadata"].get("labels") or {}
        instance = labels.get(INSTANCE)
        if not instance or labels.get(ROLE) != "decode":
            return
        ready, pods = self.decode_ready[instance], self.decode_pods[instance]
        before, existed = len(ready), len(pods)
        if type_ != "DELETED" and pod_ready(obj):
            ready.add(name)
        else:
            ready.discard(name)
        if type_ != "DELETED" and not obj["metadata"].get("deletionTimestamp"):
            pods.add(name)
        else:
            pods.discard(name)
        if len(ready) != before:
            self.decode_history[instance].append((t, len(ready)))
        if len(pods) != existed:
            self.decode_created[instance].append((t, len(pods)))

    # -- queries (under the lock) -----------------------------------------------------------------------------

    def seen(self, kind: str, name: str) -> float | None:
        with self.lock:
            return self.first_seen.get((kind, name))

    def all_seen(self, refs: list[tuple[str, str]]) -> float | None:
        """When the last of `refs` was first seen, or None while some are missing."""
        with self.lock:
            times = [self.first_seen.get(r) for r in refs]
        return None if any(x is None for x in times) else max(times)  # type: ignore[type-var]

    def ready_at(self, name: str) -> float | None:
        with self.lock:
            return self.sps_ready_at.get(name)

    def sps_is_ready(self, name: str) -> bool:
        with self.lock:
            generation, ready = self.sps_state.get(name, (0, False))
            return ready

    def available_at(self, instance: str) -> float | None:
        with self.lock:
            return self.all_available_at.get(instance)

    def decode_reached(self, instance: str, count: int, since: float) -> float | None:
        """The first time after `since` when `instance` had `count` or more ready decode pods."""
        with self.lock:
            for t, n in self.decode_history[instance]:
                if t >= since and n >= count:
                    return t
        return None

    def decode_pods_reached(self, instance: str, count: int, since: float) -> float | None:
        """The first time after `since` when `instance` had `count` or more decode pods (created, maybe not ready)."""
        with self.lock:
            for t, n in self.decode_created[instance]:
                if t >= since and n >= count:
                    return t
        return None

    def decode_settled(self, instance: str, count: int) -> bool:
        """Exactly `count` decode pods exist (none extra, none being deleted) and all of them are ready."""
        with self.lock:
            return len(self.decode_pods[instance]) == count and len(self.decode_ready[instance]) == count
