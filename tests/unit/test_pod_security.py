"""Which Pod Security level each rendered pod shape needs (podsecurity.py); the cluster tier proves the same table
against the API server's PodSecurity admission (tests/cluster/test_pod_security.py)."""

from __future__ import annotations

from typing import Any

import pytest

from specserving.api.loading import spec_of
from specserving.reconcile.observed import workload_of
from specserving.reconcile.status import Observation, Outcome, compute
from specserving.rendering import render
from specserving.rendering.podsecurity import BASELINE, PRIVILEGED, RESTRICTED, admits, required_level

from .builders import DELETE, seed

PVC = {"mountPath": "/data2", "persistentVolumeClaim": {"claimName": "weights"}}
MULTUS = {"mode": "Multus", "multusNetworks": ["ib-net"]}
# (shape, changes to the seed, level of the pool pods)
SHAPES: list[tuple[str, dict[str, Any], str]] = [
    ("seed: host network, hostPath, RDMA", {}, PRIVILEGED),
    ("multus, RDMA, PVC", {"spec.transfer.network": MULTUS, "spec.model.volume": PVC}, PRIVILEGED),
    ("multus, tcp, PVC", {"spec.transfer.network": MULTUS, "spec.model.volume": PVC,
                          "spec.transfer.backend": "mooncake_tcp", "spec.transfer.ibDevices": DELETE}, BASELINE),
    ("multus, tcp, hostPath", {"spec.transfer.network": MULTUS, "spec.transfer.backend": "mooncake_tcp",
                               "spec.transfer.ibDevices": DELETE}, PRIVILEGED),
]


def pod_specs(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """role -> the pod spec of its Deployment."""
    out = {}
    for child in render(spec_of(obj), {**obj["metadata"], "namespace": "ns", "uid": "u"}):
        if child["kind"] == "Deployment":
            out[child["metadata"]["labels"]["specserving.io/role"]] = child["spec"]["template"]["spec"]
    return out


@pytest.mark.parametrize(("changes", "level"), [s[1:] for s in SHAPES], ids=[s[0] for s in SHAPES])
def test_pool_pods_need_the_level_of_their_shape(changes: dict[str, Any], level: str) -> None:
    specs = pod_specs(seed(**changes))
    for role in ("prefill", "decode"):
        assert required_level(specs[role])[0] == level, required_level(specs[role])
    assert required_level(specs["router"]) == (RESTRICTED, [])


def test_reasons_name_what_keeps_a_pod_from_the_stricter_level() -> None:
    level, why = required_level(pod_specs(seed())["decode"])
    assert level == PRIVILEGED
    assert "hostNetwork=true" in why and "hostPath volume 'model'" in why
    assert any("IPC_LOCK" in w for w in why)


def test_levels_order() -> None:
    assert admits(PRIVILEGED, PRIVILEGED) and admits(PRIVILEGED, RESTRICTED) and admits(BASELINE, BASELINE)
    assert not admits(BASELINE, PRIVILEGED) and not admits(RESTRICTED, BASELINE)


def test_pods_refused_by_pod_security_degrade_the_specserving_naming_the_level() -> None:
    deployment = next(c for c in render(spec_of(seed()), {"name": "dsv4-flash", "namespace": "ns", "uid": "u"})
                      if c["kind"] == "Deployment" and c["metadata"]["labels"]["specserving.io/role"] == "decode")
    deployment["status"] = {"conditions": [{"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
                                            "message": 'pods "x" is forbidden: violates PodSecurity "baseline:latest":'
                                                       " host namespaces (hostNetwork=true)"}]}
    obs = Observation(name="dsv4-flash", namespace="ns", generation=1, outcome=Outcome(admitted=True),
                      desired={"prefill": 1, "decode": 1, "router": 1}, workloads={"decode": workload_of(deployment)})
    degraded = next(c for c in compute(obs, "t")["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "PodSecurityRefused")
    assert "need the privileged level (hostNetwork=true" in degraded["message"]
    assert "pod-security.kubernetes.io/enforce=privileged" in degraded["message"]
    assert 'violates PodSecurity "baseline:latest"' in degraded["message"]


def test_admission_warns_when_the_namespace_level_will_refuse_the_pods() -> None:
    from specserving.admission import review

    obj = seed()
    obj["metadata"]["namespace"] = "team-a"
    report = review(obj, None, enforced_level="baseline")
    assert report.ok
    warned = [str(w) for w in report.warnings if w.path == "metadata.namespace"]
    refused = sorted(role for w in warned for role in ("prefill", "decode", "router") if f"refuse the {role} pods" in w)
    assert refused == ["decode", "prefill"]  # the router's pods are restricted
    assert all(w.startswith('metadata.namespace: namespace "team-a" enforces Pod Security level baseline') for w in warned)
    assert all("need privileged" in w and "enforce=privileged" in w for w in warned)
    assert not [w for w in review(obj, None, enforced_level="privileged").warnings if w.path == "metadata.namespace"]
    assert not [w for w in review(obj, None, enforced_level=None).warnings if w.path == "metadata.namespace"]
