"""The SGLang router in PD mode: it discovers prefill and decode pods by label in its own namespace, reads each
prefill pod's bootstrap port from the sglang.ai/bootstrap-port annotation, and needs only read access to pods."""

from __future__ import annotations

from typing import Any

from specserving.api.naming import child_name
from specserving.api.types import SpecServingSpec
from specserving.rendering import labels as L
from specserving.rendering.image import ResolvedImage

LAUNCHER = ["python3", "-m", "sglang_router.launch_router"]
METRICS_PORT = 29000
DEFAULT_RESOURCES = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "4Gi"}}


def _selector_args(name: str, spec: SpecServingSpec, role: str) -> list[str]:
    sel = L.selector(name, role)
    pool = spec.pool(role)
    if pool.nodes_per_replica > 1:
        sel[L.LWS_WORKER_INDEX] = "0"  # only a LeaderWorkerSet's leader serves HTTP
    return [f"{k}={v}" for k, v in sorted(sel.items())]


def router_args(name: str, spec: SpecServingSpec) -> list[str]:
    r = spec.router
    args = ["--pd-disaggregation", "--service-discovery",
            "--prefill-selector", *_selector_args(name, spec, L.PREFILL),
            "--decode-selector", *_selector_args(name, spec, L.DECODE),
            "--service-discovery-namespace", "$(POD_NAMESPACE)",
            "--service-discovery-port", str(spec.engine.port),
            "--policy", r.policy]
    if r.prefill_policy:
        args += ["--prefill-policy", r.prefill_policy]
    if r.decode_policy:
        args += ["--decode-policy", r.decode_policy]
    args += ["--host", "0.0.0.0", "--port", str(r.port), "--prometheus-port", str(METRICS_PORT)]
    return args + list(r.extra_args or [])


def render_router(name: str, spec: SpecServingSpec, image: ResolvedImage) -> list[dict[str, Any]]:
    """The router's ServiceAccount, Role, RoleBinding, Deployment and Service."""
    rname = child_name(name, L.ROUTER)
    labels = L.labels(name, L.ROUTER)
    meta = {"name": rname, "labels": labels}
    container = {
        "name": "router",
        "image": spec.router.image or image.ref,
        "imagePullPolicy": spec.image.pull_policy,
        "command": list(LAUNCHER),
        "args": router_args(name, spec),
        "env": [{"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}],
        "ports": [{"name": "http", "containerPort": spec.router.port, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        "resources": spec.router.resources or DEFAULT_RESOURCES,
        "readinessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 5},
        "livenessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 20, "failureThreshold": 3},
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]}},
    }
    pod_spec: dict[str, Any] = {"serviceAccountName": rname, "containers": [container], "enableServiceLinks": False}
    if spec.image.pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s.name} for s in spec.image.pull_secrets]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": rname},
         "subjects": [{"kind": "ServiceAccount", "name": rname}]},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
         "spec": {"replicas": spec.router.replicas, "selector": {"matchLabels": L.selector(name, L.ROUTER)},
                  "template": {"metadata": {"labels": labels}, "spec": pod_spec}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": meta,
         "spec": {"type": spec.router.service_type, "selector": L.selector(name, L.ROUTER),
                  "ports": [{"name": "http", "port": spec.router.port, "targetPort": "http", "protocol": "TCP"},
                            {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics",
                             "protocol": "TCP"}]}},
    ]
