"""The Pod Security table (docs/security.md, rendering/podsecurity.py) proven by the API server's own PodSecurity
admission: every rendered pod shape is created (server-side dry run) in namespaces enforcing restricted, baseline
and privileged, and is admitted exactly where its level allows. Then, end to end, a SpecServing whose pods a
namespace refuses reads Degraded=True/PodSecurityRefused naming the level they need.

On the real node, the rendered serving pod's user and capabilities are run for real: the process that starts as
PID 1 reads its own CapEff from /proc/1/status and locks memory past a zero memlock rlimit, which is what RDMA
memory registration needs (docs/security.md). The images stand in for a base and a built image that differ in
their USER: the stand-in engine image (root) and the stand-in router image (USER 65532)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from specserving.api.loading import spec_of
from specserving.rendering import render
from specserving.rendering.podsecurity import LEVELS, admits, required_level

from .kube import Cluster, condition, wait_for
from .operating import NAME, Operator, cond_is, crd, operator, seed
from .registry import local_image

__all__ = ["crd", "operator"]  # fixtures, used by name

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

PVC = {"mountPath": "/data2", "persistentVolumeClaim": {"claimName": "weights"}}
NFS = {"mountPath": "/data2", "nfs": {"server": "nfs.example.com", "path": "/export"}}
MULTUS = {"mode": "Multus", "multusNetworks": ["ib-net"]}
TCP = {"spec.transfer.backend": "mooncake_tcp", "spec.transfer.ibDevices": None}
SHAPES: dict[str, dict[str, Any]] = {
    "seed-host-network-hostpath-rdma": {},
    "multus-rdma-pvc": {"spec.transfer.network": MULTUS, "spec.model.volume": PVC},
    "multus-tcp-pvc": {"spec.transfer.network": MULTUS, "spec.model.volume": PVC, **TCP},
    "multus-tcp-nfs": {"spec.transfer.network": MULTUS, "spec.model.volume": NFS, **TCP},
    "multus-tcp-hostpath": {"spec.transfer.network": MULTUS, **TCP},
}


@pytest.fixture
def enforcing(cluster: Cluster) -> Iterator[dict[str, str]]:
    """level -> a namespace whose PodSecurity admission enforces it."""
    made = {}
    try:
        for level in LEVELS:
            name = f"pss-{level}-{uuid.uuid4().hex[:6]}"
            cluster.kubectl("create", "namespace", name)
            cluster.kubectl("label", "namespace", name, f"pod-security.kubernetes.io/enforce={level}",
                            "specserving.io/test=true")
            made[level] = name
        yield made
    finally:
        for name in made.values():
            cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


def _pods(changes: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """role -> a Pod built from the rendered Deployment's template of that role."""
    obj = seed(**{k: v for k, v in changes.items() if v is not None})
    for key, value in changes.items():
        if value is None:  # remove the field
            node = obj
            *parents, last = key.split(".")
            for part in parents:
                node = node[part]
            node.pop(last, None)
    pods = {}
    for child in render(spec_of(obj), {"name": NAME, "namespace": "x", "uid": "u"}):
        if child["kind"] != "Deployment":
            continue
        role = child["metadata"]["labels"]["specserving.io/role"]
        template = child["spec"]["template"]
        pod_spec = dict(template["spec"])
        pod_spec.pop("serviceAccountName", None)  # the ServiceAccount is not created here; PodSecurity ignores it
        pods[role] = {"apiVersion": "v1", "kind": "Pod",
                      "metadata": {"name": f"{role}-probe", "labels": template["metadata"]["labels"]},
                      "spec": pod_spec}
    return pods


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_real_pod_security_admission_agrees_with_the_table(cluster: Cluster, enforcing: dict[str, str],
                                                           shape: str) -> None:
    disagreements = []
    for role, pod in _pods(SHAPES[shape]).items():
        needed, why = required_level(pod["spec"])
        for level, ns in enforcing.items():
            out = cluster.kubectl("create", "--dry-run=server", "-n", ns, "-f", "-", input=yaml.safe_dump(pod),
                                  check=False)
            admitted = out.returncode == 0
            if out.returncode != 0:
                assert "violates PodSecurity" in out.stderr, out.stderr  # refused for no other reason
            if admitted != admits(level, needed):
                disagreements.append((role, level, needed, why, out.stderr.strip()))
    assert not disagreements, disagreements


def test_pods_a_namespace_refuses_degrade_the_specserving_naming_the_level(cluster: Cluster, namespace: str,
                                                                             operator: Operator) -> None:
    ns = namespace
    cluster.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=baseline")
    cluster.apply(seed(), namespace=ns)
    obj = wait_for(lambda: cond_is(cluster, ns, "Degraded", "True", "PodSecurityRefused"), 60,
                   "Degraded=True PodSecurityRefused")
    message = condition(obj, "Degraded")["message"]
    assert "need the privileged level" in message and "hostNetwork=true" in message, message
    assert "pod-security.kubernetes.io/enforce=privileged" in message and "violates PodSecurity" in message
    assert obj["status"]["phase"] == "Degraded"
    # The admin raises the level: the pods are created, and the condition clears.
    cluster.kubectl("label", "--overwrite", "namespace", ns, "pod-security.kubernetes.io/enforce=privileged")
    wait_for(lambda: cond_is(cluster, ns, "Degraded", "False"), 120, "Degraded=False once the level allows the pods")


NODE_LABEL = "specserving.io/real-node"
CAP_IPC_LOCK = 1 << 14  # linux/capability.h
MLOCK_BYTES = 16 << 20
# Run as the container's PID 1, so that /proc/1/status is the serving process's own.
CAPABILITY_PROBE = f"""
import ctypes, json, mmap, os, resource
status = dict(line.split(":", 1) for line in open("/proc/1/status") if ":" in line)
_, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
resource.setrlimit(resource.RLIMIT_MEMLOCK, (0, hard))  # lowering needs no privilege
buf = mmap.mmap(-1, {MLOCK_BYTES})
libc = ctypes.CDLL(None, use_errno=True)
locked = libc.mlock(ctypes.c_void_p(ctypes.addressof(ctypes.c_char.from_buffer(buf))), {MLOCK_BYTES}) == 0
print(json.dumps({{"pid": os.getpid(), "uid": os.getuid(), "gid": os.getgid(), "mlock": locked,
                  "errno": ctypes.get_errno(), **{{k: status[k].strip() for k in ("CapEff", "CapPrm", "CapBnd")}}}}))
"""


def _run_probe(cluster: Cluster, ns: str, name: str, image: str, pod_security: dict[str, Any],
               container_security: dict[str, Any]) -> dict[str, Any]:
    """Run the capability probe on the real node under the given security contexts; its JSON report."""
    cluster.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "nodeSelector": {NODE_LABEL: "true"},
        "tolerations": [{"key": NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
        "restartPolicy": "Never", "securityContext": pod_security, "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "containers": [{"name": "sglang", "image": image, "command": ["python3", "-c", CAPABILITY_PROBE],
                        "securityContext": container_security}]}}, namespace=ns)

    def finished() -> dict[str, Any] | None:
        pod = cluster.get("pod", name, ns)
        return pod if pod and pod.get("status", {}).get("phase") in ("Succeeded", "Failed") else None

    pod = wait_for(finished, 300, f"pod {name} to finish")
    log = cluster.kubectl("logs", name, "-n", ns).stdout
    assert pod["status"]["phase"] == "Succeeded", (pod["status"], log)
    return dict(json.loads(log.strip().splitlines()[-1]))


def test_the_serving_process_holds_ipc_lock_exactly_where_rdma_needs_it(cluster: Cluster, namespace: str,
                                                                         real_node: str) -> None:
    images = {"root image": local_image(cluster, "stand-in-engine"),
              "USER 65532 image": local_image(cluster, "stand-in-router")}
    rdma, tcp = _pods({})["decode"]["spec"], _pods(TCP)["decode"]["spec"]

    def security(pod_spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        return pod_spec["securityContext"], pod_spec["containers"][0]["securityContext"]

    reports = {}
    for i, (label, image) in enumerate(images.items()):
        reports[f"rdma, {label}"] = _run_probe(cluster, namespace, f"caps-rdma-{i}", image, *security(rdma))
        reports[f"tcp, {label}"] = _run_probe(cluster, namespace, f"caps-tcp-{i}", image, *security(tcp))
    # The alternative not taken: a non-root user with IPC_LOCK added (what a built image's USER 65532 ran as).
    pod_sc, container_sc = security(rdma)
    non_root = {**pod_sc, "runAsUser": 65532, "runAsGroup": 65532, "runAsNonRoot": True}
    reports["non-root with IPC_LOCK added"] = _run_probe(cluster, namespace, "caps-nonroot", images["root image"],
                                                         non_root, container_sc)
    for label, r in reports.items():
        print(f"figure: {label}: uid {r['uid']} gid {r['gid']} CapEff {r['CapEff']} CapPrm {r['CapPrm']} "
              f"CapBnd {r['CapBnd']} mlock past a zero rlimit: {r['mlock']}")

    for label in images:
        for r in (reports[f"rdma, {label}"], reports[f"tcp, {label}"]):
            assert (r["pid"], r["uid"], r["gid"]) == (1, 0, 0), (label, r)  # the image's USER never decides
        r = reports[f"rdma, {label}"]
        assert int(r["CapEff"], 16) == int(r["CapBnd"], 16) == CAP_IPC_LOCK and r["mlock"], (label, r)
        r = reports[f"tcp, {label}"]
        assert int(r["CapEff"], 16) == int(r["CapBnd"], 16) == 0 and not r["mlock"], (label, r)
    r = reports["non-root with IPC_LOCK added"]
    assert int(r["CapBnd"], 16) == CAP_IPC_LOCK and int(r["CapEff"], 16) == 0 and not r["mlock"], r
