"""A rollout between PD-contract revisions as the controller runs it: what the watches show per revision, and the
writes for revisions the spec no longer renders (their replicas, their deletion). rollout.decide picks the step;
docs/rollouts.md describes the whole."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from specserving.api.naming import child_name
from specserving.kube import Kube
from specserving.reconcile.calls import call
from specserving.reconcile import reasons as R
from specserving.reconcile.events import post
from specserving.reconcile.observed import Child, ChildRef, Pod, Workload
from specserving.reconcile.scaledown import ScaleDown
from specserving.reconcile.state import Key
from specserving.rendering import labels as L
from specserving.rendering.kinds import kind_of
from specserving.rollout import ROLES, Decision, Pools, Router


@dataclass(frozen=True)
class Revisions:
    """The prefill and decode workloads of one SpecServing, per revision, and its router."""

    workloads: dict[str, dict[str, Child]] = field(default_factory=dict)  # revision -> role -> child
    pools: dict[str, Pools] = field(default_factory=dict)
    router: Router = field(default_factory=lambda: Router(None))
    router_workload: Workload | None = None


def observe(key: Key, owner_uid: str, children: Mapping[ChildRef, Child], pods: list[Pod]) -> Revisions:
    workloads: dict[str, dict[str, Child]] = {}
    router, router_workload = Router(None), None
    for child in children.values():
        w = child.workload
        if w is None or (owner_uid and owner_uid not in child.owner_uids):
            continue
        if w.role in ROLES:
            workloads.setdefault(w.revision, {})[w.role] = child
        elif child.ref.kind == "Deployment" and child.ref.name == child_name(key[1], L.ROUTER):
            # The Deployment's counts leave out terminating pods; a router pod of the old template still in its
            # preStop can get requests until kube-proxy drops it, so the switch ends only when it is gone.
            leaving = any(p.role == L.ROUTER and p.revision != w.template_revision for p in pods)
            router, router_workload = Router(w.template_revision, w.settled and not leaving), w
    pod_counts: dict[str, int] = {}
    for pod in pods:
        if pod.role in ROLES:
            pod_counts[pod.revision] = pod_counts.get(pod.revision, 0) + 1
    pools = {}
    for rev, by_role in workloads.items():
        ws = {role: c.workload for role, c in by_role.items() if c.workload is not None}
        pools[rev] = Pools({role: w.spec_replicas for role, w in ws.items()},
                           {role: w.ready for role, w in ws.items()}, pod_counts.get(rev, 0))
    return Revisions(workloads, pools, router, router_workload)


def kept(revisions: Revisions, target: str, router_rendered: bool) -> set[ChildRef]:
    """Children the rendering does not contain that pruning must leave alone: the workloads of other revisions
    (move_others scales and deletes them, in the rollout's order), and the router Deployment while it stays on
    the serving revision."""
    keep = {c.ref for rev, by_role in revisions.workloads.items() if rev != target for c in by_role.values()}
    if not router_rendered and revisions.router_workload is not None:
        keep.add(ChildRef("apps", "Deployment", revisions.router_workload.name))
    return keep


async def move_others(kube: Kube, scale_down: ScaleDown, key: Key, body: dict[str, Any], port: int,
                      revisions: Revisions, target: str, decision: Decision) -> None:
    """Scale the revisions other than `target` to what `decision` says (the least-loaded pods go first, as in a
    scale-down), and delete the workloads of drained ones."""
    for rev, counts in sorted(decision.replicas.items()):
        if rev == target:
            continue
        for role, child in sorted(revisions.workloads.get(rev, {}).items()):
            w = child.workload
            wanted = counts.get(role, 0)
            if w is None or w.spec_replicas == wanted:
                continue
            await scale_down.prepare(key, body, port, w, wanted)
            res = await call(kube.resource, child.api_version, child.ref.kind)
            if res is not None:
                await call(kube.merge_patch, res, key[0], child.ref.name,
                                        {"spec": {"replicas": wanted}})
    for rev in sorted(decision.delete):
        for role, child in sorted(revisions.workloads.get(rev, {}).items()):
            res = await call(kube.resource, child.api_version, child.ref.kind)
            if res is None:
                continue
            await call(kube.delete, res, key[0], child.ref.name, child.uid)
            row = kind_of({"apiVersion": child.api_version, "kind": child.ref.kind})
            post(kube, body, R.CHILD_PRUNED, f"deleted {row.kind} {child.ref.name}: revision {rev} is "
                       f"drained (the router pairs revision {decision.router})")
