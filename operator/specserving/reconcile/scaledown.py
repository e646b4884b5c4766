"""Scale-down of a pool's workload (a `kubectl scale`, or a rollout giving replicas back): which pod goes first.
Before the Deployment loses replicas, each of its pods gets a pod-deletion-cost from its running requests
(annotated by the user, or read from SGLang's /metrics), so the ReplicaSet controller removes the idlest first."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from specserving.kube import Kube, Resource
from specserving.reconcile.calls import call
from specserving.reconcile import costs
from specserving.reconcile import reasons as R
from specserving.reconcile.events import post
from specserving.reconcile.observed import DELETION_COST, Pod, Workload
from specserving.reconcile.state import Key

PODS = Resource("v1", "Pod", "pods", True)
LOAD_PROBE_TIMEOUT = 1.0
LOAD_PROBE_PODS = 32
COST_SETTLE_SECONDS = 2.0


class ScaleDown:
    """Sets pod-deletion-cost on a pool's pods when its Deployment is about to lose replicas."""

    def __init__(self, kube: Kube, pods_of: Callable[[Key], list[Pod]], probe_load: bool) -> None:
        self.kube, self.pods_of, self.probe_load = kube, pods_of, probe_load

    async def prepare(self, key: Key, body: dict[str, Any], port: int, current: Workload | None,
                      wanted: int) -> None:
        """Before `current` (one revision's prefill or decode workload) goes down to `wanted` replicas."""
        if current is None or current.kind != "Deployment" or wanted >= current.spec_replicas:
            return
        pods = costs.candidates(p for p in self.pods_of(key)
                                if p.role == current.role and p.revision == current.revision)
        loads = {p.name: load for p in pods if (load := costs.annotated_load(p)) is not None}
        if self.probe_load:
            loads.update(await self._probe_loads([p for p in pods if p.name not in loads], port))
        changes = costs.costs(pods, loads)
        for name, cost in changes.items():
            await call(self.kube.merge_patch, PODS, key[0], name,
                                    {"metadata": {"annotations": {DELETION_COST: cost}}})
        if changes:
            await self._await_costs(key, changes)
            detail = ", ".join(f"{n}={c}" for n, c in sorted(changes.items(), key=lambda x: int(x[1])))
            post(self.kube, body, R.DELETION_COST_SET, f"{current.role} ({current.name}) scales from "
                       f"{current.spec_replicas} to {wanted} replicas; pod-deletion-cost from running requests "
                       f"(lowest goes first): {detail}")

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
