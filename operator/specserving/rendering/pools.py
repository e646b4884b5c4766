"""The prefill and decode pools: a Deployment per pool (a LeaderWorkerSet when a replica spans nodes),
a headless Service, a PodDisruptionBudget, and a ServiceMonitor when asked for."""

from __future__ import annotations

from typing import Any

from specserving.api.naming import child_name
from specserving.api.types import SpecServingSpec
from specserving.rendering import labels as L
from specserving.rendering.image import ResolvedImage
from specserving.rendering.pods import pod_template

LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"


def workload(name: str, spec: SpecServingSpec, role: str, image: ResolvedImage) -> dict[str, Any]:
    """The Deployment (one node per replica) or LeaderWorkerSet (several) of one pool."""
    pool = spec.pool(role)
    meta = {"name": child_name(name, role), "labels": L.labels(name, role)}
    if pool.nodes_per_replica == 1:
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta,
            "spec": {
                "replicas": pool.replicas,
                "selector": {"matchLabels": L.selector(name, role)},
                # A GPU node holds one replica: surging would wait for a spare 8-GPU node that may never come.
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
                "template": pod_template(name, spec, role, image),
            },
        }
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": "LeaderWorkerSet",
        "metadata": meta,
        "spec": {
            "replicas": pool.replicas,
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {"type": "RollingUpdate",
                                "rollingUpdateConfiguration": {"maxSurge": 0, "maxUnavailable": 1}},
            "leaderWorkerTemplate": {
                "size": pool.nodes_per_replica,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": pod_template(name, spec, role, image, multinode=True, leader=True),
                "workerTemplate": pod_template(name, spec, role, image, multinode=True, leader=False),
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


def render_pool(name: str, spec: SpecServingSpec, role: str, image: ResolvedImage) -> list[dict[str, Any]]:
    """Every object of one pool."""
    objs = [workload(name, spec, role, image), service(name, spec, role), disruption_budget(name, role)]
    if spec.engine.metrics.enabled and spec.engine.metrics.service_monitor:
        objs.append(service_monitor(name, role))
    return objs
