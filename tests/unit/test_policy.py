"""The serving-pod policy: what the cluster admin allows, enforced by validation (webhook and reconciler)."""

from __future__ import annotations

from typing import Any

import pytest

from specserving.cli import build_parser
from specserving.cli import _policy as policy_from_flags
from specserving.policy import ServingPolicy
from specserving.reconcile.plan import make_plan
from specserving.validation import validate

from .builders import DELETE, seed

DATA2 = ServingPolicy(host_path_prefixes=("/data2",))


def problems(changes: dict[str, Any], policy: ServingPolicy, namespace: str = "serving") -> list[str]:
    obj = seed(**changes)
    obj["metadata"]["namespace"] = namespace
    return [str(e) for e in validate(obj, policy=policy).errors]


@pytest.mark.parametrize("path", ["/", "/var/run", "/var/run/docker.sock", "/var/lib/kubelet", "/data", "/data2x"])
def test_host_paths_outside_the_allowed_folders_are_refused_naming_the_chart_value(path: str) -> None:
    (error,) = problems({"spec.model.volume.hostPath.path": path}, DATA2)
    assert error.startswith(f'spec.model.volume.hostPath.path: Forbidden: "{path}"')
    assert "servingPolicy.hostPathPrefixes" in error and "--allow-host-path" in error and "below: /data2" in error


@pytest.mark.parametrize("path", ["/data2", "/data2/", "/data2/models", "/data2/./m"])
def test_host_paths_at_or_below_an_allowed_folder_pass(path: str) -> None:
    assert problems({"spec.model.volume.hostPath.path": path}, DATA2) == []


def test_the_default_policy_allows_no_host_path_at_all() -> None:
    (error,) = problems({}, ServingPolicy())
    assert "only below: none" in error
    pvc = {"mountPath": "/data2", "persistentVolumeClaim": {"claimName": "weights"}}
    assert problems({"spec.model.volume": pvc}, ServingPolicy()) == []


def test_host_network_per_namespace() -> None:
    only_serving = ServingPolicy(host_path_prefixes=("/data2",), host_network_namespaces=("serving",))
    assert problems({}, only_serving, "serving") == []
    (error,) = problems({}, only_serving, "team-a")
    assert error.startswith('spec.transfer.network.mode: Forbidden: "HostNetwork"') and '"team-a"' in error
    assert "servingPolicy.hostNetwork.namespaces" in error
    nowhere = ServingPolicy(host_path_prefixes=("/data2",), host_network_namespaces=())
    assert "only in no namespace" in problems({}, nowhere)[0]
    multus = {"mode": "Multus", "multusNetworks": ["ib-net"]}
    assert problems({"spec.transfer.network": multus}, nowhere) == []


def test_rdma_resources_and_multus_networks() -> None:
    policy = ServingPolicy(host_path_prefixes=("/data2",), rdma_resources=("rdma/ib",), multus_networks=("ib-net",))
    (error,) = problems({"spec.transfer.rdma": {"resourceName": "rdma/other"}}, policy)
    assert error.startswith("spec.transfer.rdma.resourceName: Forbidden") and "servingPolicy.rdmaResources" in error
    # Over TCP no RDMA resource is requested, so none is checked.
    assert problems({"spec.transfer.rdma": {"resourceName": "rdma/other"}, "spec.transfer.backend": "mooncake_tcp",
                     "spec.transfer.ibDevices": DELETE}, policy) == []
    errors = problems({"spec.transfer.network": {"mode": "Multus", "multusNetworks": ["ib-net", "evil-net"]}}, policy)
    assert errors == [errors[0]] and errors[0].startswith("spec.transfer.network.multusNetworks[1]: Forbidden")


def test_offline_validation_has_no_policy() -> None:
    assert validate(seed(**{"spec.model.volume.hostPath.path": "/"})).ok


def test_the_reconciler_checks_the_policy_again() -> None:
    obj = seed(**{"spec.model.volume.hostPath.path": "/var/lib/kubelet"})
    obj["metadata"].update(namespace="ns", uid="u1", generation=1)
    plan = make_plan(obj, policy=DATA2)
    assert not plan.admitted and plan.children == ()
    assert "servingPolicy.hostPathPrefixes" in plan.errors[0]


def test_operator_flags_build_the_policy() -> None:
    args = build_parser().parse_args(["run", "-A", "--allow-host-path", "/data2,/models", "--allow-host-network-in",
                                      "serving", "--allow-rdma-resource", "rdma/ib"])
    assert policy_from_flags(args) == ServingPolicy(host_path_prefixes=("/data2", "/models"),
                                                    host_network_namespaces=("serving",), rdma_resources=("rdma/ib",))
    assert policy_from_flags(build_parser().parse_args(["run", "-A"])) == ServingPolicy()
    denied = policy_from_flags(build_parser().parse_args(["run", "-A", "--deny-host-network"]))
    assert denied.host_network_namespaces == ()
