"""The Pod Security table (docs/security.md, rendering/podsecurity.py) proven by the API server's own PodSecurity
admission: every rendered pod shape is created (server-side dry run) in namespaces enforcing restricted, baseline
and privileged, and is admitted exactly where its level allows. Then, end to end, a SpecServing whose pods a
namespace refuses reads Degraded=True/PodSecurityRefused naming the level they need."""

from __future__ import annotations

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
