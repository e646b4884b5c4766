"""Scale-down of the decode pool: which pod goes first. Before the Deployment loses replicas, each decode pod gets a
pod-deletion-cost from its running requests (annotated by the user, or read from SGLang's /metrics), so the
ReplicaSet controller removes the idlest first."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from specserving.api.naming import child_name
from specserving.kube import Kube, Resource
from specserving.reconcile import costs
from specserving.reconcile import reasons as R
from specserving.reconcile.events import post
from specserving.reconcile.observed import DELETION_COST, Child, ChildRef, Pod
from specserving.reconcile.plan import Plan
from specserving.reconcile.state import Key
from specserving.rendering import labels as L

PODS = Resource("v1", "Pod", "pods", True)
LOAD_PROBE_TIMEOUT = 1.0
LOAD_PROBE_PODS = 32
COST_SETTLE_SECONDS = 2.0


class ScaleDown:
    """Sets pod-deletion-cost on decode pods when the decode Deployment is about to lose replicas."""

    def __init__(self, kube: Kube, pods_of: Callable[[Key], list[Pod]], probe_load: bool) -> None:
        self.kube, self.pods_of, self.probe_load = kube, pods_of, probe_load

    async def prepare(self, key: Key, body: dict[str, Any], plan: Plan,
                      observed: Mapping[ChildRef, Child]) -> None:
        assert plan.spec is not None
        wanted = plan.spec.decode.replicas
        current = next((c.workload for c in observed.values() if c.workload and c.ref.kind == "Deployment"
                        and c.ref.name == child_name(key[1], L.DECODE)), None)
        if current is None or wanted >= current.spec_replicas:
            return
        pods = costs.candidates(p for p in self.pods_of(key) if p.role == L.DECODE)
        loads = {p.name: load for p in pods if (load := costs.annotated_load(p)) is not None}
        if self.probe_load:
            loads.update(await self._probe_loads([p for p in pods if p.name not in loads], plan.spec.engine.port))
        changes = costs.costs(pods, loads)
        for name, cost in changes.items():
            await asyncio.to_thread(self.kube.merge_patch, PODS, key[0], name,
                                    {"metadata": {"annotations": {DELETION_COST: cost}}})
        if changes:
            await self._await_costs(key, changes)
            detail = ", ".join(f"{n}={c}" for n, c in sorted(changes.items(), key=lambda x: int(x[1])))
            await post(self.kube, body, R.DELETION_COST_SET, f"decode scales from {current.spec_replicas} to "
                       f"{wanted} replicas; pod-deletion-cost from running requests (lowest goes first): {detail}")

    async def _await_costs(self, key: Key, changes: Mapping[str, str]) -> None:
        """Give the watches (ours, and so the ReplicaSet controller's) a moment to see the new costs."""
        deadline = time.monotonic() + COST_SETTLE_SECONDS
        while time.monotonic() < deadline:
            seen = {p.name: p.deletion_cost for p in self.pods_of(key)}
            if all(seen.get(n) == c for n, c in changes.items()):
                return
            await asyncio.sleep(0.05)

    async def _probe_loads(self, pods: list[Pod], port: int) -> dict[str, float]:
        """Running requests from SGLang's /metrics, a bounded number of pods, one short timeout each."""
        targets = [p for p in pods if p.ip][:LOAD_PROBE_PODS]

        def fetch(pod: Pod) -> tuple[str, float | None]:
            try:
                with urllib.request.urlopen(f"http://{pod.ip}:{port}/metrics",  # noqa: S310 - pod IPs only
                                            timeout=LOAD_PROBE_TIMEOUT) as resp:
                    return pod.name, costs.running_requests(resp.read(1 << 20).decode(errors="replace"))
            except (OSError, ValueError):
                return pod.name, None

        try:
            found = await asyncio.wait_for(asyncio.gather(*(asyncio.to_thread(fetch, p) for p in targets)),
                                           timeout=LOAD_PROBE_TIMEOUT * 2)
        except TimeoutError:
            return {}
        return {name: load for name, load in found if load is not None}
