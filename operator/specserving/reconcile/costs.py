"""Which decode pod goes first on scale-down: controller.kubernetes.io/pod-deletion-cost from a load signal.

The ReplicaSet controller removes pods that are unscheduled, pending or not ready first, then the ready pods
with the lowest deletion cost. The operator sets the cost of each ready decode pod to its number of running
requests just before it lowers the decode replicas, so the least-loaded replica is drained (preStop) and
removed. The load signal, in order: the pod's `specserving.io/load` annotation (set by an autoscaler or a test),
then SGLang's own `sglang:num_running_reqs` from the pod's /metrics (summed over DP ranks). A pod with neither
keeps whatever cost it has.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

from specserving.reconcile.observed import Pod

_RUNNING = re.compile(r"^sglang:num_running_reqs(?:\{[^}]*\})?\s+(\S+)", re.M)
COST_MIN, COST_MAX = -(2**31), 2**31 - 1


def running_requests(metrics_text: str) -> float | None:
    """Total running requests in SGLang's Prometheus text, or None when the metric is absent."""
    values = [float(v) for v in _RUNNING.findall(metrics_text)]
    values = [v for v in values if math.isfinite(v)]
    return sum(values) if values else None


def annotated_load(pod: Pod) -> float | None:
    if pod.load is None:
        return None
    try:
        value = float(pod.load)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def candidates(pods: Iterable[Pod]) -> list[Pod]:
    """Pods whose cost matters: ready, running and not already being deleted."""
    return sorted((p for p in pods if p.ready and not p.deleting and p.phase == "Running"), key=lambda p: p.name)


def costs(pods: Iterable[Pod], loads: Mapping[str, float]) -> dict[str, str]:
    """The deletion-cost annotations to write: pod name -> cost, only where the value changes."""
    changes = {}
    for pod in pods:
        if pod.name not in loads:
            continue
        cost = str(int(min(max(round(loads[pod.name]), COST_MIN), COST_MAX)))
        if pod.deletion_cost != cost:
            changes[pod.name] = cost
    return changes
