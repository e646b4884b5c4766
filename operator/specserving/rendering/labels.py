"""Label and annotation keys on everything the operator renders, under one domain prefix."""

from __future__ import annotations

ROLE = "specserving.io/role"
INSTANCE = "specserving.io/instance"
# The PD-contract revision of a pool's workload and pods, and of the router pods that pair it (docs/rollouts.md).
REVISION = "specserving.io/revision"
BOOTSTRAP_PORT_ANNOTATION = "sglang.ai/bootstrap-port"
MULTUS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"
LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
FIELD_MANAGER = "specserving-operator"

# The role label's values, re-exported: rendering code says L.PREFILL.
from specserving.api.naming import DECODE as DECODE
from specserving.api.naming import PREFILL as PREFILL
from specserving.api.naming import ROUTER as ROUTER


def selector(instance: str, role: str) -> dict[str, str]:
    """The labels that select one role's pods of one SpecServing. They never change after creation."""
    return {INSTANCE: instance, ROLE: role}


def pool_selector(instance: str, role: str, revision: str) -> dict[str, str]:
    """The labels that select one role's pods of one revision: a workload's selector, and the router's."""
    return {**selector(instance, role), REVISION: revision}


def labels(instance: str, role: str) -> dict[str, str]:
    """All labels of one role's objects: the selector plus the app.kubernetes.io set."""
    return {
        "app.kubernetes.io/name": "sglang-router" if role == ROUTER else "sglang",
        "app.kubernetes.io/instance": instance,
        "app.kubernetes.io/component": role,
        "app.kubernetes.io/part-of": "specserving",
        "app.kubernetes.io/managed-by": FIELD_MANAGER,
        **selector(instance, role),
    }


def selector_string(instance: str, role: str) -> str:
    """The selector as `kubectl get -l` and the scale subresource want it."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector(instance, role).items()))
