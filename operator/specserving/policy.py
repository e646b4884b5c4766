"""The serving-pod policy: what a SpecServing may ask of a node, set by the cluster admin, never by the spec.

Anyone allowed to create a SpecServing gets pods through the operator's own rights, so what those pods may
touch on a node is the admin's decision: chart values `servingPolicy.*`, which become `specserving run` flags
(`--allow-host-path`, `--allow-host-network-in`, `--deny-host-network`, `--allow-rdma-resource`,
`--allow-multus-network`). The webhook refuses what the policy forbids, and the reconciler checks again before it
applies. Every refusal names the field and the chart value that would allow it.

Defaults: no hostPath at all (the admin lists the model folders, for example /data2), host networking allowed in
every namespace (RDMA serving needs it), any RDMA resource name and any Multus network.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from specserving.api.types import SpecServingSpec
from specserving.problems import Problem, Report


@dataclass(frozen=True)
class ServingPolicy:
    """What the serving pods may use on a node. None means "any" for the lists that allow everything by default."""

    # Node folders a model volume's hostPath may be (or lie below); empty: none.
    host_path_prefixes: tuple[str, ...] = ()
    # Namespaces whose SpecServings may use hostNetwork; None: every namespace, (): none.
    host_network_namespaces: tuple[str, ...] | None = None
    # Extended resource names spec.transfer.rdma.resourceName may ask for; None: any.
    rdma_resources: tuple[str, ...] | None = None
    # Multus NetworkAttachmentDefinitions spec.transfer.network.multusNetworks may attach; None: any.
    multus_networks: tuple[str, ...] | None = None


def _below(path: str, prefix: str) -> bool:
    path, prefix = posixpath.normpath(path), posixpath.normpath(prefix)
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


def check_policy(spec: SpecServingSpec, namespace: str, policy: ServingPolicy) -> Report:
    """Everything in `spec` the admin's policy does not allow, each naming the chart value that would."""
    report = Report()
    vol = spec.model.volume
    if vol is not None and vol.host_path is not None:
        path = vol.host_path.path
        if not any(_below(path, prefix) for prefix in policy.host_path_prefixes):
            allowed = ", ".join(policy.host_path_prefixes) or "none"
            report.errors.append(Problem("spec.model.volume.hostPath.path", (
                f'Forbidden: "{path}": the serving-pod policy allows hostPath model volumes only below: {allowed}; a '
                "cluster admin allows a folder with the chart value servingPolicy.hostPathPrefixes (operator flag "
                "--allow-host-path), or use a persistentVolumeClaim or nfs volume")))
    if spec.transfer.network.mode == "HostNetwork" and policy.host_network_namespaces is not None \
            and namespace not in policy.host_network_namespaces:
        where = ", ".join(policy.host_network_namespaces) or "no namespace"
        report.errors.append(Problem("spec.transfer.network.mode", (
            f'Forbidden: "HostNetwork": the serving-pod policy allows host networking only in {where}, not in '
            f'"{namespace}"; a cluster admin allows it with the chart value servingPolicy.hostNetwork.namespaces '
            "(operator flag --allow-host-network-in), or use network.mode Multus")))
    rdma = spec.transfer.rdma.resource_name
    uses_rdma = spec.transfer.backend != "mooncake_tcp"
    if uses_rdma and policy.rdma_resources is not None and rdma not in policy.rdma_resources:
        report.errors.append(Problem("spec.transfer.rdma.resourceName", (
            f'Forbidden: "{rdma}": the serving-pod policy allows the RDMA resources '
            f"{', '.join(policy.rdma_resources) or 'none'}; a cluster admin allows another with the chart value "
            "servingPolicy.rdmaResources (operator flag --allow-rdma-resource)")))
    if spec.transfer.network.mode == "Multus" and policy.multus_networks is not None:
        for i, network in enumerate(spec.transfer.network.multus_networks or []):
            if network not in policy.multus_networks:
                report.errors.append(Problem(f"spec.transfer.network.multusNetworks[{i}]", (
                    f'Forbidden: "{network}": the serving-pod policy allows the Multus networks '
                    f"{', '.join(policy.multus_networks) or 'none'}; a cluster admin allows another with the chart "
                    "value servingPolicy.multusNetworks (operator flag --allow-multus-network)")))
    return report
