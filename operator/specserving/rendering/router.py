"""The router in PD mode: sglang-router or its successor smg. Both discover prefill and decode pods by label in
their own namespace, read each prefill pod's bootstrap port from the sglang.ai/bootstrap-port annotation, and
need only read access to pods. docs/router.md says which SGLang image carries which router."""

from __future__ import annotations

from typing import Any

from specserving.api.naming import child_name
from specserving.api.types import SpecServingSpec
from specserving.capabilities import load
from specserving.rendering import labels as L
from specserving.rendering.image import ResolvedImage, sglang_version

SGLANG_ROUTER = "sglang-router"
SMG = "smg"
# The module each implementation runs as; both wheels ship a Rust core behind a Python launcher.
LAUNCHERS = {SGLANG_ROUTER: ["python3", "-m", "sglang_router.launch_router"],
             SMG: ["python3", "-m", "smg.launch_router"]}
# What the operator rendered before the choice existed, and what images up to SGLang 0.5.x carry when nobody has
# recorded otherwise (docs/router.md).
DEFAULT_IMPLEMENTATION = SGLANG_ROUTER
METRICS_PORT = 29000
DEFAULT_RESOURCES = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "4Gi"}}


def implementation(spec: SpecServingSpec) -> str:
    """spec.router.implementation, else the router the image's SGLang version carries, else the default."""
    if spec.router.implementation:
        return spec.router.implementation
    caps = load().lookup(sglang_version(spec))
    return caps.image_router if caps is not None and caps.image_router else DEFAULT_IMPLEMENTATION


def implementation_known(spec: SpecServingSpec) -> bool:
    """Whether the router choice rests on the spec or on a recorded fact, not on the default."""
    caps = load().lookup(sglang_version(spec))
    return bool(spec.router.implementation or (caps is not None and caps.image_router))


# sglang-router 0.3.2 registers DP ranks as http://IP:PORT@RANK, then in PD mode sends each request to
# http://0.0.0.RANK/generate (the rank read as the URL's host): every request fails. Measured with the real wheel
# (tests/cluster/test_router.py, docs/router.md); smg 1.13.0 routes ranks correctly.
DP_AWARE_WORKS = frozenset({SMG})


def dp_aware(spec: SpecServingSpec) -> bool:
    """Register each DP rank as a worker: by default when attention is data-parallel over dp > 1 ranks and the
    implementation routes ranks correctly in PD mode."""
    if spec.router.dp_aware is not None:
        return spec.router.dp_aware
    return spec.engine.enable_dp_attention and spec.engine.dp > 1 and implementation(spec) in DP_AWARE_WORKS


def _selector_args(name: str, spec: SpecServingSpec, role: str, revision: str) -> list[str]:
    sel = L.pool_selector(name, role, revision)
    pool = spec.pool(role)
    if pool.nodes_per_replica > 1:
        sel[L.LWS_WORKER_INDEX] = "0"  # only a LeaderWorkerSet's leader serves HTTP
    return [f"{k}={v}" for k, v in sorted(sel.items())]


# Router flag -> what decides it. spec.router.extraArgs may not set these (nor any alias of one): two values for one
# setting would leave the router's behaviour to argparse's last-one-wins rule, and static worker lists or another
# selector would pair pods of two revisions (or of another SpecServing).
ROUTER_OWNED_FLAGS: dict[str, str] = {
    "--pd-disaggregation": "the operator (the router always pairs prefill and decode)",
    "--service-discovery": "the operator (workers are the pools' pods)",
    "--prefill-selector": "the operator (the prefill pods of the serving revision)",
    "--decode-selector": "the operator (the decode pods of the serving revision)",
    "--service-discovery-namespace": "the operator (the SpecServing's namespace)",
    "--service-discovery-port": "spec.engine.port",
    "--policy": "spec.router.policy",
    "--prefill-policy": "spec.router.prefillPolicy",
    "--decode-policy": "spec.router.decodePolicy",
    "--dp-aware": "spec.router.dpAware",
    "--disable-tokenizer-autoload": "the operator (smg: PD routing needs no tokenizer)",
    "--host": "the operator (always 0.0.0.0)",
    "--port": "spec.router.port",
    "--prometheus-port": f"the operator (metrics on {METRICS_PORT})",
    "--worker-urls": "the operator (workers come from service discovery)",
    "--prefill": "the operator (workers come from service discovery)",
    "--decode": "the operator (workers come from service discovery)",
    "--selector": "the operator (the pools' selectors)",
}


def router_args(name: str, spec: SpecServingSpec, revision: str) -> list[str]:
    """The router's command line: the typed flags (typed_router_args), then spec.router.extraArgs."""
    return [*typed_router_args(name, spec, revision), *(spec.router.extra_args or [])]


def typed_router_args(name: str, spec: SpecServingSpec, revision: str) -> list[str]:
    """The command-line flags, spelled as both implementations' parsers accept them, plus smg's own where it
    needs one (the decode_path tier runs the chosen implementation's parser on them for every SGLang version).
    The selectors name one PD-contract revision: the router never pairs pods of two."""
    r = spec.router
    args = ["--pd-disaggregation", "--service-discovery",
            "--prefill-selector", *_selector_args(name, spec, L.PREFILL, revision),
            "--decode-selector", *_selector_args(name, spec, L.DECODE, revision),
            "--service-discovery-namespace", "$(POD_NAMESPACE)",
            "--service-discovery-port", str(spec.engine.port),
            "--policy", r.policy]
    if r.prefill_policy:
        args += ["--prefill-policy", r.prefill_policy]
    if r.decode_policy:
        args += ["--decode-policy", r.decode_policy]
    if dp_aware(spec):
        args.append("--dp-aware")
    if implementation(spec) == SMG:
        # smg loads each discovered model's tokenizer before registering its workers, from the model path, which
        # only the engine pods mount: without this every registration waits out 10 s step timeouts (44 s
        # measured). PD routing over HTTP needs no tokenizer.
        args.append("--disable-tokenizer-autoload")
    args += ["--host", "0.0.0.0", "--port", str(r.port), "--prometheus-port", str(METRICS_PORT)]
    return args


# How long a router pod that is leaving stays in its Service's endpoints while requests still arrive, before it
# gets SIGTERM (endpoint removal propagates to kube-proxy asynchronously).
ROUTER_PRESTOP_SECONDS = 5


def render_router(name: str, spec: SpecServingSpec, image: ResolvedImage, revision: str,
                  deployment: bool = True) -> list[dict[str, Any]]:
    """The router's ServiceAccount, Role, RoleBinding, Deployment (pairing `revision`; left out with
    `deployment=False`, while a rollout keeps the router on the revision it serves) and Service."""
    rname = child_name(name, L.ROUTER)
    labels = L.labels(name, L.ROUTER)
    meta = {"name": rname, "labels": labels}
    container = {
        "name": "router",
        "image": spec.router.image or image.ref,
        "imagePullPolicy": spec.image.pull_policy,
        "command": list(LAUNCHERS[implementation(spec)]),
        "args": router_args(name, spec, revision),
        "env": [{"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}],
        "ports": [{"name": "http", "containerPort": spec.router.port, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        "resources": spec.router.resources or DEFAULT_RESOURCES,
        # /readiness answers 503 until the router has a healthy prefill and decode worker (both sglang-router
        # 0.3.2 and smg 1.13.0, measured): a router pod joins its Service only once it can pair a request, which
        # is what lets a rollout switch revisions by rolling the router (docs/rollouts.md).
        "readinessProbe": {"httpGet": {"path": "/readiness", "port": "http"}, "periodSeconds": 2,
                           "failureThreshold": 2},
        "livenessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 20, "failureThreshold": 3},
        "lifecycle": {"preStop": {"sleep": {"seconds": ROUTER_PRESTOP_SECONDS}}},
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    pod_spec: dict[str, Any] = {"serviceAccountName": rname, "containers": [container], "enableServiceLinks": False,
                                "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}}
    if spec.router.node_selector:
        pod_spec["nodeSelector"] = dict(spec.router.node_selector)
    if spec.router.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in spec.router.tolerations]
    if spec.image.pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s.name} for s in spec.image.pull_secrets]
    template_labels = {**labels, L.REVISION: revision}
    objs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": rname},
         "subjects": [{"kind": "ServiceAccount", "name": rname}]},
        {"apiVersion": "v1", "kind": "Service", "metadata": meta,
         "spec": {"type": spec.router.service_type, "selector": L.selector(name, L.ROUTER),
                  "ports": [{"name": "http", "port": spec.router.port, "targetPort": "http", "protocol": "TCP"},
                            {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics",
                             "protocol": "TCP"}]}},
    ]
    if deployment:
        # A new router pod is Ready (and so paired) before an old one leaves: the switch drops no request.
        objs.append({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
                     "spec": {"replicas": spec.router.replicas,
                              "selector": {"matchLabels": L.selector(name, L.ROUTER)},
                              "strategy": {"type": "RollingUpdate",
                                           "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                              "template": {"metadata": {"labels": template_labels}, "spec": pod_spec}}})
    return objs
