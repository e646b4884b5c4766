"""The prefill and decode pools: a Deployment per pool (a LeaderWorkerSet when a replica spans nodes),
a headless Service, a PodDisruptionBudget, and a ServiceMonitor when asked for."""

from __future__ import annotations

from typing import Any

from specserving.api.naming import child_name, workload_name
from specserving.api.types import SpecServingSpec
from specserving.rendering import labels as L
from specserving.rendering.image import ResolvedImage
from specserving.rendering.pods import pod_template

LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"


def _in_place_update(spec: SpecServingSpec, replicas: int) -> dict[str, int]:
    """How a change outside the PD contract (docs/rollouts.md) rolls one revision's pool in place. A change to the
    contract never gets here: it starts a new revision. Surge adds a replica before removing one, so a 1-replica
    pool keeps serving; Stepped also never goes below the wanted count, in steps of maxSurge."""
    surge = 1 if spec.rollout.strategy == "Surge" else spec.rollout.max_surge
    return {"maxSurge": max(1, min(surge, max(replicas, 1))), "maxUnavailable": 0}


def workload(name: str, spec: SpecServingSpec, role: str, image: ResolvedImage, revision: str,
             replicas: int | None = None) -> dict[str, Any]:
    """The Deployment (one node per replica) or LeaderWorkerSet (several) of one pool at one revision."""
    pool = spec.pool(role)
    count = pool.replicas if replicas is None else replicas
    meta = {"name": workload_name(name, role, revision), "labels": {**L.labels(name, role), L.REVISION: revision}}
    if pool.nodes_per_replica == 1:
        template = pod_template(name, spec, role, image)
        template["metadata"]["labels"][L.REVISION] = revision
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta,
            "spec": {
                "replicas": count,
                "selector": {"matchLabels": L.pool_selector(name, role, revision)},
                "strategy": {"type": "RollingUpdate", "rollingUpdate": _in_place_update(spec, count)},
                "template": template,
            },
        }
    leader = pod_template(name, spec, role, image, multinode=True, leader=True)
    worker = pod_template(name, spec, role, image, multinode=True, leader=False)
    for template in (leader, worker):
        template["metadata"]["labels"][L.REVISION] = revision
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": "LeaderWorkerSet",
        "metadata": meta,
        "spec": {
            "replicas": count,
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {"type": "RollingUpdate",
                                "rollingUpdateConfiguration": _in_place_update(spec, count)},
            "leaderWorkerTemplate": {
                "size": pool.nodes_per_replica,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": leader,
                "workerTemplate": worker,
            },
        },
    }


def service(name: str, spec: SpecServingSpec, role: str) -> dict[str, Any]:
    """A headless Service giving the pool's pods DNS names and a target for monitors."""
    ports = [{"name": "http", "port": spec.engine.port, "targetPort": "http", "protocol": "TCP"}]
    if role == L.PREFILL:
        ports.append({"name": "bootstrap", "port": spec.prefill.bootstrap_port, "targetPort": "bootstrap",
                      "protocol": "TCP"})
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": child_name(name, role), "labels": L.labels(name, role)},
        "spec": {"clusterIP": "None", "selector": L.selector(name, role), "ports": ports,
                 "publishNotReadyAddresses": False},
    }


def disruption_budget(name: str, role: str) -> dict[str, Any]:
    """At most one replica of a pool drained at a time."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": child_name(name, role), "labels": L.labels(name, role)},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": L.selector(name, role)}},
    }


def service_monitor(name: str, role: str) -> dict[str, Any]:
    """A Prometheus Operator ServiceMonitor on the pool's /metrics."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": child_name(name, role), "labels": L.labels(name, role)},
        "spec": {"selector": {"matchLabels": L.selector(name, role)},
                 "endpoints": [{"port": "http", "path": "/metrics", "interval": "30s"}]},
    }


def render_pool(name: str, spec: SpecServingSpec, role: str, image: ResolvedImage, revision: str,
                replicas: int | None = None) -> list[dict[str, Any]]:
    """Every object of one pool: the workload of `revision` (with `replicas`, default the spec's) and the objects
    every revision shares (the Service, the PodDisruptionBudget, the ServiceMonitor select the role's pods of all
    revisions)."""
    objs = [workload(name, spec, role, image, revision, replicas), service(name, spec, role),
            disruption_budget(name, role)]
    if spec.engine.metrics.enabled and spec.engine.metrics.service_monitor:
        objs.append(service_monitor(name, role))
    return objs
