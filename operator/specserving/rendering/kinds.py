"""The kinds of children the operator renders, watches and prunes: apiVersion/kind -> API resource.

The renderer owns the table, since it emits the kinds; the controller watches and prunes by it, and the rendered
children come out in its order (dependencies first). The table is data: adding a kind to the renderer means adding
a row here (a test checks that every kind the
renderer can emit has one). Kinds served by an optional CRD carry the message a user sees when it is missing;
the API server's discovery decides at apply time whether a kind is served.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ChildKind:
    """One kind of child object."""

    api_version: str
    kind: str
    plural: str
    # Set for kinds from CRDs that may not be installed: what needs the kind and how to get it.
    missing: str | None = None
    # Workloads carry replicas and pods; their status feeds the pool conditions.
    workload: bool = False
    # The order of a first apply, in waves: what a later wave needs must exist first. The API server's RBAC check of
    # a RoleBinding reads its Role (an operator that is not cluster-admin must hold the Role's permissions, and
    # the check looks them up: before the Role exists it answers 404), and a pod names its ServiceAccount.
    apply_wave: int = 0
    # Its content comes from free-form spec fields (resources, tolerations, affinity, args, env, volumes) that only
    # the API server can judge whole, so a new rendering is dry-run for these kinds before anything is applied. The
    # others are built from names and ports that admission has already checked, and are applied without one: a
    # dry run costs an API request each, and these are 8 of the 11 children of a SpecServing.
    spec_shaped: bool = False

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]

    @property
    def crd(self) -> str:
        return f"{self.plural}.{self.group}"


CHILD_KINDS: tuple[ChildKind, ...] = (
    ChildKind("v1", "ServiceAccount", "serviceaccounts"),
    ChildKind("rbac.authorization.k8s.io/v1", "Role", "roles"),
    ChildKind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings", apply_wave=1),
    ChildKind("v1", "Service", "services"),
    ChildKind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets"),
    ChildKind("apps/v1", "Deployment", "deployments", workload=True, apply_wave=2, spec_shaped=True),
    ChildKind("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "leaderworkersets", workload=True, apply_wave=2,
              spec_shaped=True,
              missing="a pool with nodesPerReplica > 1 runs as a LeaderWorkerSet; install LeaderWorkerSet "
                      "(https://lws.sigs.k8s.io) or set nodesPerReplica to 1"),
    ChildKind("monitoring.coreos.com/v1", "ServiceMonitor", "servicemonitors", spec_shaped=True,
              missing="spec.engine.metrics.serviceMonitor is true; install the Prometheus Operator CRDs or set "
                      "serviceMonitor to false"),
)

_BY_KIND = {(k.api_version, k.kind): k for k in CHILD_KINDS}


class UnknownKind(Exception):
    """The renderer emitted a kind this table lacks: a programming error."""


def kind_of(obj: dict[str, Any]) -> ChildKind:
    """The table row of a rendered or observed object."""
    try:
        return _BY_KIND[(obj["apiVersion"], obj["kind"])]
    except KeyError:
        raise UnknownKind(f"no child kind for apiVersion {obj.get('apiVersion')!r} kind {obj.get('kind')!r}; "
                          "add it to specserving.rendering.kinds.CHILD_KINDS") from None
