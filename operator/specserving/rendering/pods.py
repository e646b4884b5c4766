"""The pod template of a prefill or decode replica: GPUs, RDMA, IPC_LOCK, shared memory, model, probes, drain.

One replica of TP8/DP8 is one pod on one 8-GPU node, as in the seed deployment.
"""

from __future__ import annotations

import copy
from typing import Any

from specserving.api.types import SpecServingSpec
from specserving.capabilities import ServingFacts, load
from specserving.rendering import labels as L
from specserving.rendering.args import LAUNCHER, server_args, speculates
from specserving.rendering.image import ResolvedImage

GPU_RESOURCE = "nvidia.com/gpu"
SHM_VOLUME = "dshm"
MODEL_VOLUME = "model"
PROBE_PERIOD_SECONDS = 10
# How long a stopping pod keeps serving so the router drops it before SGLang gets SIGTERM.
DEREGISTER_SECONDS = 15
ENGINE_INIT_TIMEOUT_ENV = "SGLANG_DISAGGREGATION_ENGINE_INIT_TIMEOUT"
ENGINE_INIT_TIMEOUT_DEFAULT = 60  # SGLang 0.5.20's default (environ.py)


def gpus_per_pod(spec: SpecServingSpec, role: str) -> int:
    """GPUs of one pod: the replica's tp spread over its nodes."""
    pool = spec.pool(role)
    return spec.engine.tp // pool.nodes_per_replica


def rdma_per_pod(spec: SpecServingSpec, role: str) -> int:
    """RDMA device-plugin units one pod requests; zero when KV goes over TCP."""
    if spec.transfer.backend == "mooncake_tcp":
        return 0
    return spec.transfer.rdma.count or gpus_per_pod(spec, role)


def engine_init_timeout(spec: SpecServingSpec, role: str) -> int:
    """Seconds SGLang gives the KV-transfer engine (NIXL; Mooncake does not read it) to initialise: SGLang's own
    60, or less so it stays below the startup probe's budget and SGLang names the stuck engine itself before
    the kubelet restarts the pod without a word."""
    budget = spec.pool(role).startup_timeout_seconds
    return min(ENGINE_INIT_TIMEOUT_DEFAULT, budget - 2 * PROBE_PERIOD_SECONDS)


# Environment variables the operator sets, with what decides each: spec.engine.env and a pool's env may not set
# them (Kubernetes takes the last of two entries, so a user entry would silently replace the operator's).
OWNED_ENV: dict[str, str] = {
    "POD_NAME": "the operator (the pod's name)",
    "POD_NAMESPACE": "the operator (the pod's namespace)",
    "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "the operator (probes must not run a generation)",
    "SGLANG_HOST_IP": "spec.transfer.network.mode (HostNetwork: the pod IP)",
    "SGLANG_LOCAL_IP_NIC": "spec.transfer.network.mode (Multus: net1)",
    ENGINE_INIT_TIMEOUT_ENV: "spec.<pool>.startupTimeoutSeconds (with the nixl backend)",
    "SGLANG_RAGGED_VERIFY_MODE": "spec.speculative.algorithm (DSPARK under DP attention)",
    "SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION": "spec.speculative.algorithm (DFLASH under DP attention)",
}


def _env(spec: SpecServingSpec, role: str, image: ResolvedImage) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        # /health otherwise runs a generation per probe, which a decode pod cannot do without a prefill peer.
        {"name": "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "value": "0"},
    ]
    if spec.transfer.network.mode == "HostNetwork":
        # Mooncake advertises this address to its peers; on the host network it is the node's address.
        env.append({"name": "SGLANG_HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    else:
        # The first Multus attachment is net1; Mooncake takes the address of that interface.
        env.append({"name": "SGLANG_LOCAL_IP_NIC", "value": "net1"})
    if _facts(image).engine_init_timeout_env and spec.transfer.backend == "nixl":
        env.append({"name": ENGINE_INIT_TIMEOUT_ENV, "value": str(engine_init_timeout(spec, role))})
    if speculates(spec, role) and spec.engine.enable_dp_attention:
        if spec.speculative.algorithm == "DSPARK":
            env.append({"name": "SGLANG_RAGGED_VERIFY_MODE", "value": "static"})
        if spec.speculative.algorithm == "DFLASH":
            env.append({"name": "SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION", "value": "0"})
    pool = spec.pool(role)
    # A pool's entry replaces the engine-wide one of the same name (the API server refuses an applied list with
    # two entries of one name); pool entries come last, so their $(VAR) references may name engine entries.
    pool_names = {e.get("name") for e in pool.env or [] if isinstance(e, dict) and isinstance(e.get("name"), str)}
    env += [copy.deepcopy(e) for e in spec.engine.env or []
            if not (isinstance(e, dict) and isinstance(e.get("name"), str) and e["name"] in pool_names)]
    env += copy.deepcopy(pool.env or [])
    return env


def _resources(spec: SpecServingSpec, role: str) -> dict[str, Any]:
    pool = spec.pool(role)
    res: dict[str, Any] = copy.deepcopy(pool.resources or {})
    device = {GPU_RESOURCE: str(gpus_per_pod(spec, role))}
    if rdma_per_pod(spec, role):
        device[spec.transfer.rdma.resource_name] = str(rdma_per_pod(spec, role))
    # Extended resources must have requests equal to limits.
    res["limits"] = {**res.get("limits", {}), **device}
    res["requests"] = {**res.get("requests", {}), **device}
    return res


def _drain_command(port: int, grace: int, metrics: bool) -> list[str]:
    """preStop: let the router drop the pod, then wait for running requests to finish (bounded by the grace)."""
    budget = max(grace - DEREGISTER_SECONDS - 5, 0)
    if not metrics:
        return ["/bin/sh", "-c", f"sleep {DEREGISTER_SECONDS}"]
    script = (
        "import re,time,urllib.request as u\n"
        f"time.sleep({DEREGISTER_SECONDS})\n"
        f"end=time.time()+{budget}\n"
        "while time.time()<end:\n"
        " try:\n"
        f"  m=u.urlopen('http://127.0.0.1:{port}/metrics',timeout=5).read().decode()\n"
        "  n=sum(float(x) for x in re.findall(r'^sglang:num_running_reqs\\S* (\\S+)$',m,re.M))\n"
        " except Exception:\n"
        "  break\n"
        " if n==0:\n"
        "  break\n"
        " time.sleep(2)\n"
    )
    return ["python3", "-c", script]


def _facts(image: ResolvedImage) -> ServingFacts:
    caps = load().lookup(image.sglang_version)
    return caps.serving if caps is not None else ServingFacts()


def probe_path(image: ResolvedImage) -> str:
    """/ready where the version has it; /health otherwise, which every version has (and which _env keeps from
    running a generation)."""
    return "/ready" if _facts(image).ready_endpoint else "/health"


def _probes(spec: SpecServingSpec, role: str, image: ResolvedImage) -> dict[str, Any]:
    pool = spec.pool(role)
    http = {"path": probe_path(image), "port": "http"}
    return {
        "startupProbe": {"httpGet": http, "periodSeconds": PROBE_PERIOD_SECONDS, "timeoutSeconds": 5,
                         "failureThreshold": -(-pool.startup_timeout_seconds // PROBE_PERIOD_SECONDS)},
        "readinessProbe": {"httpGet": http, "periodSeconds": PROBE_PERIOD_SECONDS, "timeoutSeconds": 5,
                           "failureThreshold": 3},
        "livenessProbe": {"httpGet": http, "periodSeconds": 30, "timeoutSeconds": 10, "failureThreshold": 5},
    }


def _volumes(spec: SpecServingSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes: list[dict[str, Any]] = [{"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}}]
    mounts: list[dict[str, Any]] = [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}]
    vol = spec.model.volume
    if vol is None:
        return volumes, mounts
    if vol.persistent_volume_claim:
        pvc = vol.persistent_volume_claim
        source: dict[str, Any] = {"persistentVolumeClaim": {"claimName": pvc.claim_name, "readOnly": pvc.read_only}}
        read_only = pvc.read_only
    elif vol.host_path:
        source = {"hostPath": {"path": vol.host_path.path, "type": vol.host_path.type}}
        read_only = True
    else:
        assert vol.nfs is not None  # the CRD's CEL rule requires exactly one source
        source = {"nfs": {"server": vol.nfs.server, "path": vol.nfs.path, "readOnly": vol.nfs.read_only}}
        read_only = vol.nfs.read_only
    volumes.append({"name": MODEL_VOLUME, **source})
    mounts.append({"name": MODEL_VOLUME, "mountPath": vol.mount_path, "readOnly": read_only})
    return volumes, mounts


def _ports(spec: SpecServingSpec, role: str) -> list[dict[str, Any]]:
    ports = [{"name": "http", "containerPort": spec.engine.port, "protocol": "TCP"}]
    if role == L.PREFILL:
        ports.append({"name": "bootstrap", "containerPort": spec.prefill.bootstrap_port, "protocol": "TCP"})
    if spec.transfer.network.mode == "HostNetwork":
        # Declared host ports let the scheduler keep two pools' pods off one node's ports.
        for p in ports:
            p["hostPort"] = p["containerPort"]
    return ports


def _default_affinity(name: str, role: str) -> dict[str, Any]:
    return {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
        "weight": 100,
        "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": L.selector(name, role)}},
    }]}}


def _container_security(spec: SpecServingSpec, role: str) -> dict[str, Any]:
    """Every capability dropped; IPC_LOCK kept only where RDMA is used (Mooncake and NIXL pin KV memory for the
    NIC to read, which needs IPC_LOCK or an unlimited memlock rlimit, and Kubernetes can set no rlimit)."""
    capabilities: dict[str, Any] = {"drop": ["ALL"]}
    if rdma_per_pod(spec, role):
        capabilities["add"] = ["IPC_LOCK"]
    return {"privileged": False, "allowPrivilegeEscalation": False, "capabilities": capabilities}


# The serving process runs as root in its container, whatever the image's USER says, so that a built image and
# the base it came from run the same way. Root because a capability added to a non-root process is not effective:
# the runtime puts it in the bounding and permitted sets but not the ambient set, so execve as a non-root user
# clears it (measured on the real node: CapEff 0 as UID 65532, IPC_LOCK as UID 0; docs/security.md). Root here
# holds nothing but IPC_LOCK (with RDMA), no privilege escalation, and the runtime's default seccomp filter.
SERVING_USER = {"runAsUser": 0, "runAsGroup": 0}


def pod_template(name: str, spec: SpecServingSpec, role: str, image: ResolvedImage, *,
                 multinode: bool = False, leader: bool = True) -> dict[str, Any]:
    """The pod template of one pool. For a LeaderWorkerSet, `leader` picks the HTTP-serving rank-0 pod."""
    pool = spec.pool(role)
    volumes, mounts = _volumes(spec)
    container: dict[str, Any] = {
        "name": "sglang",
        "image": image.ref,
        "imagePullPolicy": spec.image.pull_policy,
        "command": list(LAUNCHER),
        "args": server_args(spec, role, multinode=multinode),
        "env": _env(spec, role, image),
        "ports": _ports(spec, role),
        "resources": _resources(spec, role),
        "volumeMounts": mounts,
        "securityContext": _container_security(spec, role),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if leader:
        container.update(_probes(spec, role, image))
        container["lifecycle"] = {"preStop": {"exec": {"command": _drain_command(
            spec.engine.port, pool.termination_grace_period_seconds, spec.engine.metrics.enabled)}}}
    pod_labels = L.labels(name, role)
    annotations: dict[str, str] = {}
    if role == L.PREFILL:
        annotations[L.BOOTSTRAP_PORT_ANNOTATION] = str(spec.prefill.bootstrap_port)
    if spec.transfer.network.mode == "Multus":
        annotations[L.MULTUS_ANNOTATION] = ",".join(spec.transfer.network.multus_networks or [])
    pod_spec: dict[str, Any] = {
        "containers": [container],
        # The container runtime's default syscall filter: nothing SGLang or Mooncake needs is outside it.
        "securityContext": {**SERVING_USER, "seccompProfile": {"type": "RuntimeDefault"}},
        "volumes": volumes,
        "terminationGracePeriodSeconds": pool.termination_grace_period_seconds,
        "affinity": copy.deepcopy(pool.affinity) if pool.affinity else _default_affinity(name, role),
        "enableServiceLinks": False,
    }
    if spec.transfer.network.mode == "HostNetwork":
        pod_spec["hostNetwork"] = True
        pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    if pool.node_selector:
        pod_spec["nodeSelector"] = dict(pool.node_selector)
    if pool.tolerations:
        pod_spec["tolerations"] = copy.deepcopy(pool.tolerations)
    if spec.image.pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s.name} for s in spec.image.pull_secrets]
    metadata: dict[str, Any] = {"labels": pod_labels}
    if annotations:
        metadata["annotations"] = annotations
    return {"metadata": metadata, "spec": pod_spec}
