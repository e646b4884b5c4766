"""The SpecServing status as a pure function of what the operator decided and what the watches saw.

`compute` builds the whole status (image, pools, conditions, phase, endpoint); `patch_for` turns old and new into
a JSON merge patch, or None when nothing changed, so an idle resync writes nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from specserving.api.naming import child_name
from specserving.reconcile import conditions as C
from specserving.reconcile import reasons as R
from specserving.reconcile.failures import pod_failures, summary
from specserving.reconcile.image import ImageVerdict
from specserving.reconcile.observed import Pod, Workload
from specserving.reconcile.serving import Result, condition_fields
from specserving.rendering import labels as L
from specserving.rollout import ROLES, Decision, shown

POOLS = (L.PREFILL, L.DECODE, L.ROUTER)
POOL_CONDITION = {L.PREFILL: R.PREFILL_READY, L.DECODE: R.DECODE_READY, L.ROUTER: R.ROUTER_READY}


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the reconciler decided about the current generation."""

    admitted: bool
    errors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    # DEPENDENCY_MISSING, APPLY_FAILED, IMAGE_LACKS_BUILDER, BUILD_FAILED or REGISTRY_MISSING when the children
    # were not all applied.
    blocked_reason: str | None = None
    blocked_message: str = ""
    # The serving image (ImageReady); None when it was not resolved (not admitted).
    image: ImageVerdict | None = None

    @property
    def building(self) -> bool:
        return self.image is not None and self.image.reason == R.BUILDING


@dataclass(frozen=True, slots=True)
class RolloutView:
    """The rollout between PD-contract revisions as the last pass decided it."""

    target: str
    decision: Decision
    strategy: str
    # The revision the pool conditions describe: the serving one until the router switches, then the target.
    shown: str
    new_ready: Mapping[str, int] = field(default_factory=dict)
    # The first new-revision pod the scheduler cannot place, with its message.
    unschedulable: str | None = None


@dataclass(frozen=True, slots=True)
class Observation:
    """Everything `compute` reads."""

    name: str
    namespace: str
    generation: int
    outcome: Outcome
    # Desired replicas per pool from the spec; None when the spec could not be read at all.
    desired: Mapping[str, int] | None
    workloads: Mapping[str, Workload | None]
    pods: Iterable[Pod] = ()
    router_port: int | None = None
    image: dict[str, Any] | None = None
    old: Mapping[str, Any] | None = field(default=None)
    # ServingVerified: whether the check is on for this SpecServing, and the latest result for its rollout.
    serving_check: bool = False
    serving: Result | None = None
    rollout: RolloutView | None = None


def _pool_status(name: str, role: str, desired: int | None, w: Workload | None,
                 pods: Iterable[Pod] = ()) -> dict[str, Any]:
    ready = w.ready if w else 0
    status: dict[str, Any] = {
        "replicas": w.replicas if w else 0,
        "readyReplicas": ready,
        "updatedReplicas": w.updated if w else 0,
        "selector": L.selector_string(name, role),
    }
    if desired is not None:
        status["desiredReplicas"] = desired
        status["readySummary"] = f"{ready}/{desired}"
    if w is not None and w.group_size > 1:
        # A group serves only when every pod of it is Ready; the pod count shows how far a group has come.
        ready_pods = len(_ready_pods(pods, role, w.revision))
        status.update(groupSize=w.group_size, readyPods=ready_pods)
        if desired is not None:
            status["readySummary"] = f"{ready}/{desired} groups ({ready_pods}/{desired * w.group_size} pods)"
    return status


def _ready_pods(pods: Iterable[Pod], role: str, revision: str) -> list[Pod]:
    """The Ready pods of one pool and revision that are not being deleted."""
    return [p for p in pods if p.role == role and p.revision == revision and p.ready and not p.deleting]


def whole_groups(w: Workload | None, pods: Iterable[Pod]) -> Workload | None:
    """`w` with a LeaderWorkerSet's ready groups capped by what its pods say. LWS updates readyReplicas in its own
    reconcile, after the pods change: measured on the real node, a group whose worker had just been deleted was
    still counted ready ("2/2 groups (2/4 pods)"). A group is ready only when all its pods are."""
    if w is None or w.group_size <= 1:
        return w
    ready_pods = Counter(p.group for p in _ready_pods(pods, w.role, w.revision) if p.group is not None)
    whole = sum(1 for n in ready_pods.values() if n >= w.group_size)
    return replace(w, ready=whole) if whole < w.ready else w


def _unplaced_groups(o: Observation, role: str, w: Workload) -> list[str]:
    """Groups the scheduler cannot place whole: a group runs only with all its pods, so one Pending pod keeps the
    rest of its group (placed, holding nodes) from serving."""
    stuck: dict[str, str] = {}
    for p in o.pods:
        if p.role == role and p.revision == w.revision and p.unschedulable and not p.deleting and p.group:
            stuck.setdefault(p.group, f"pod {p.name}: {p.unschedulable}")
    if not stuck:
        return []
    groups = sorted(stuck, key=lambda g: (len(g), g))
    return [f"{'group' if len(groups) == 1 else 'groups'} {', '.join(groups)} cannot be placed whole "
            f"({stuck[groups[0]]})"]


def _settled(w: Workload | None, desired: int) -> bool:
    return (w is not None and w.current and w.spec_replicas == desired and w.replicas == desired
            and w.updated >= desired and w.ready >= desired)


def _pool_condition(o: Observation, role: str, gen: int) -> dict[str, Any]:
    ctype = POOL_CONDITION[role]
    w = o.workloads.get(role)
    desired = o.desired[role] if o.desired is not None else None
    wname = child_name(o.name, role)
    if w is None and not o.outcome.admitted:
        return C.condition(ctype, C.UNKNOWN, R.NOT_ADMITTED,
                           f"the {role} pool was not created: the spec was not admitted", gen)
    if desired is None:
        return C.condition(ctype, C.UNKNOWN, R.NOT_ADMITTED, f"the {role} pool's replicas are unknown", gen)
    if w is None and o.outcome.image is not None and o.outcome.image.image is None:
        return C.condition(ctype, C.FALSE, R.WORKLOAD_MISSING,
                           f"0 of {desired} {role} replicas ready: the workload {wname} is not created until the "
                           f"image is ready (ImageReady is {o.outcome.image.reason})", gen)
    if w is None:
        return C.condition(ctype, C.FALSE, R.WORKLOAD_MISSING,
                           f"0 of {desired} {role} replicas ready: the workload {wname} does not exist yet", gen)
    if desired == 0 and w.replicas == 0:
        return C.condition(ctype, C.TRUE, R.SCALED_TO_ZERO, f"the {role} pool is scaled to 0 replicas", gen)
    unit = f"groups of {w.group_size} pods" if w.group_size > 1 else "replicas"
    counted = f"{w.ready} of {desired} {role} {unit} ready"
    if w.current and w.spec_replicas == desired and w.updated >= desired and w.ready >= desired:
        return C.condition(ctype, C.TRUE, R.REPLICAS_READY, f"{counted} ({w.kind} {w.name})", gen)
    details = []
    if not w.current:
        details.append(f"{w.kind} {w.name} has not yet observed its latest spec")
    elif w.spec_replicas != desired:
        details.append(f"{w.kind} {w.name} is set to {w.spec_replicas} replicas")
    elif w.updated < desired:
        details.append(f"{w.updated} of {desired} on the current template")
    if w.group_size > 1:
        details += _unplaced_groups(o, role, w)
    return C.condition(ctype, C.FALSE, R.REPLICAS_NOT_READY,
                       counted + (f" ({'; '.join(details)})" if details else f" ({w.kind} {w.name})"), gen)


def _progress(o: Observation, gen: int) -> dict[str, Any]:
    if not o.outcome.admitted:
        return C.condition(R.PROGRESSING, C.FALSE, R.INVALID_SPEC, "nothing is rolled out: the spec was refused",
                           gen)
    if o.outcome.blocked_reason:
        return C.condition(R.PROGRESSING, C.FALSE, o.outcome.blocked_reason, o.outcome.blocked_message, gen)
    if o.outcome.image is not None and o.outcome.building:
        return C.condition(R.PROGRESSING, C.TRUE, R.BUILDING, o.outcome.image.message, gen)
    for role in POOLS:
        w = o.workloads.get(role)
        if w is not None and w.deadline_exceeded:
            return C.condition(R.PROGRESSING, C.FALSE, R.PROGRESS_DEADLINE_EXCEEDED,
                               f"{w.kind} {w.name}: {w.deadline_exceeded}", gen)
    assert o.desired is not None  # an admitted spec always has replicas
    r = o.rollout
    if r is not None and r.decision.rolling:
        d = r.decision
        new = ", ".join(f"{role} {r.new_ready.get(role, 0)}" for role in ROLES)
        head = f"rollout from revision {d.source} to {shown(r.target)} ({r.strategy})"
        if r.unschedulable and d.step != "DrainingOld":
            return C.condition(R.PROGRESSING, C.FALSE, R.NEW_REVISION_UNSCHEDULABLE,
                               f"{head} cannot place the new revision: {r.unschedulable}; revision "
                               f"{shown(d.serving)} keeps serving", gen)
        return C.condition(R.PROGRESSING, C.TRUE, d.step or R.ROLLING_OUT,
                           f"{head}, step {d.step}: {d.description}; Ready in revision {shown(r.target)}: {new}",
                           gen)
    moving = []
    for role in POOLS:
        w, desired = o.workloads.get(role), o.desired[role]
        if w is None:
            moving.append(f"{role}: {child_name(o.name, role)} is being created")
        elif not _settled(w, desired):
            moving.append(f"{role}: {w.updated} of {desired} replicas updated, {w.ready} ready"
                          + (f", {w.replicas} exist" if w.replicas != desired else ""))
    if moving:
        return C.condition(R.PROGRESSING, C.TRUE, R.ROLLING_OUT, "; ".join(moving), gen)
    counts = ", ".join(f"{role} {o.desired[role]}/{o.desired[role]}" for role in POOLS)
    return C.condition(R.PROGRESSING, C.FALSE, R.ROLLOUT_COMPLETE,
                       f"generation {gen} is rolled out: {counts} replicas ready", gen)


def _ready(o: Observation, pools: list[dict[str, Any]], gen: int, endpoint: str | None) -> dict[str, Any]:
    if not o.outcome.admitted:
        return C.condition(R.READY, C.FALSE, R.INVALID_SPEC, "not serving: the spec was refused (see Admitted)", gen)
    if o.outcome.blocked_reason:
        return C.condition(R.READY, C.FALSE, o.outcome.blocked_reason, o.outcome.blocked_message, gen)
    if o.outcome.image is not None and o.outcome.building:
        return C.condition(R.READY, C.FALSE, R.BUILDING, "not serving: " + o.outcome.image.message, gen)
    waiting = [c["message"] for c in pools if c["status"] != C.TRUE]
    if waiting:
        return C.condition(R.READY, C.FALSE, R.POOLS_NOT_READY, "not ready: " + "; ".join(waiting), gen)
    return C.condition(R.READY, C.TRUE, R.ALL_POOLS_READY,
                       "every pool is ready" + (f"; serving at {endpoint}" if endpoint else ""), gen)


def _refused_pods(o: Observation) -> tuple[str, str] | None:
    """(reason, message) when the API server refuses to create a workload's pods, naming the Pod Security level
    the pods need when that is what refuses them."""
    for role, w in sorted(o.workloads.items()):
        if w is None or not w.replica_failure:
            continue
        if "PodSecurity" in w.replica_failure:
            why = "; ".join(w.pod_level_reasons[:4]) or "see the API server's message"
            return R.POD_SECURITY_REFUSED, (
                f"{w.kind} {w.name}: the namespace's Pod Security admission refuses the {role} pods, which need the "
                f"{w.pod_level} level ({why}): label the namespace pod-security.kubernetes.io/enforce={w.pod_level}, "
                f"or change the spec (docs/security.md); the API server says: {w.replica_failure}")
        return R.PODS_NOT_CREATED, f"{w.kind} {w.name}: the API server refuses its {role} pods: {w.replica_failure}"
    return None


def _degraded(o: Observation, gen: int) -> dict[str, Any]:
    refused = _refused_pods(o)
    if refused is not None:
        return C.condition(R.DEGRADED, C.TRUE, *refused, gen)
    failures = pod_failures(o.pods)
    if failures:
        return C.condition(R.DEGRADED, C.TRUE, failures[0].reason, summary(failures), gen)
    return C.condition(R.DEGRADED, C.FALSE, R.NO_FAILURES, "no prefill, decode or router pod is failing", gen)


def _image_ready(o: Observation, gen: int) -> dict[str, Any]:
    if not o.outcome.admitted:
        return C.condition(R.IMAGE_READY, C.UNKNOWN, R.NOT_ADMITTED,
                           "the image is resolved once the spec is admitted", gen)
    v = o.outcome.image
    if v is None:
        return C.condition(R.IMAGE_READY, C.UNKNOWN, R.NOT_ADMITTED, "the image is not resolved yet", gen)
    return C.condition(R.IMAGE_READY, v.status, v.reason, v.message, gen)


def _admitted(o: Observation, gen: int) -> dict[str, Any]:
    if not o.outcome.admitted:
        return C.condition(R.ADMITTED, C.FALSE, R.INVALID_SPEC, "; ".join(o.outcome.errors) or "invalid spec", gen)
    message = "the spec passed validation"
    if o.outcome.warnings:
        message += "; warnings: " + "; ".join(o.outcome.warnings)
    return C.condition(R.ADMITTED, C.TRUE, R.ACCEPTED, message, gen)


def _phase(o: Observation, by_type: dict[str, dict[str, Any]]) -> str:
    if not o.outcome.admitted:
        return "Rejected"
    if by_type[R.DEGRADED]["status"] == C.TRUE:
        return "Degraded"
    if by_type[R.READY]["status"] == C.TRUE:
        return "Ready"
    if o.outcome.building:
        return "Building"
    if o.outcome.blocked_reason and o.outcome.blocked_reason != R.DEPENDENCY_MISSING:
        return "Failed"
    if o.outcome.blocked_reason or not any(o.workloads.get(r) for r in POOLS):
        return "Pending"
    return "Progressing"


def compute(o: Observation, now: str) -> dict[str, Any]:
    """The complete status for observation `o`; lastTransitionTime comes from o.old where status is unchanged."""
    gen = o.generation
    pods = tuple(o.pods)
    o = replace(o, pods=pods, workloads={role: whole_groups(w, pods) for role, w in o.workloads.items()})
    endpoint = None
    if o.outcome.admitted and o.router_port:
        endpoint = f"http://{child_name(o.name, L.ROUTER)}.{o.namespace}.svc:{o.router_port}"
    pools = [_pool_condition(o, role, gen) for role in POOLS]
    ready = _ready(o, pools, gen, endpoint)
    conds = [_admitted(o, gen), _image_ready(o, gen), _progress(o, gen), *pools, ready, _degraded(o, gen)]
    serving = condition_fields(o.serving_check and o.outcome.admitted, ready["status"] == C.TRUE, o.serving)
    if serving is not None:
        conds.append(C.condition(R.SERVING_VERIFIED, *serving, gen))
    merged = C.merge((o.old or {}).get("conditions"), conds, now)
    status: dict[str, Any] = {"observedGeneration": gen, "phase": _phase(o, {c["type"]: c for c in merged})}
    if endpoint:
        status["endpoint"] = endpoint
    status["conditions"] = merged
    for role in POOLS:
        status[role] = _pool_status(o.name, role, o.desired[role] if o.desired is not None else None,
                                    o.workloads.get(role), pods)
    if o.image:
        status["image"] = o.image
    if o.rollout is not None:
        d = o.rollout.decision
        status["revision"] = o.rollout.target
        if d.serving is not None:
            status["servingRevision"] = shown(d.serving)
        if d.rolling:
            status["rollout"] = {"fromRevision": d.source, "toRevision": o.rollout.target,
                                 "strategy": o.rollout.strategy, "step": d.step, "description": d.description,
                                 "servingRevision": shown(d.serving) if d.serving is not None else "switching"}
    elif o.old is not None:
        # A pass that decided nothing about revisions (the spec is refused, the image is building) keeps them.
        for k in ("revision", "servingRevision", "rollout"):
            if k in o.old:
                status[k] = o.old[k]
    return status


def _diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    patch: dict[str, Any] = {k: None for k in old if k not in new}
    for k, v in new.items():
        before = old.get(k)
        if before == v:
            continue
        patch[k] = _diff(before, v) if isinstance(before, Mapping) and isinstance(v, Mapping) else v
    return patch


def _whole(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    patch: dict[str, Any] = {k: None for k in old if k not in new}
    for k, v in new.items():
        before = old.get(k)
        patch[k] = _whole(before, v) if isinstance(before, Mapping) and isinstance(v, Mapping) else v
    return patch


def patch_for(old: Mapping[str, Any] | None, new: dict[str, Any]) -> dict[str, Any] | None:
    """None when `old` already is `new`; otherwise a JSON merge patch that sets every field of `new` (and removes
    the keys of `old` we no longer write). The whole status, not only what differs from `old`: `old` is the
    operator's best knowledge of the stored status (the watch's view, or our last write while the watch lags), and
    a patch of the difference alone would leave a field stale on the server whenever that knowledge was behind,
    as Ready True beside a pool's "1/2" after two quick passes on a lagging watch."""
    if not _diff(old or {}, new):
        return None
    return _whole(old or {}, new)
