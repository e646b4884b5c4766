"""What the watches saw, boiled down: pure summaries of children, workloads and pods, built from plain dicts.

The kopf indexes store these summaries, so status and drift checks read memory, never the API.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from sys import intern
from typing import Any

from specserving.reconcile.compact import pack, unpack
from specserving.rendering.podsecurity import required_level
from specserving.rendering import labels as L

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
# A load figure for a pool pod, set by anything that knows better than the operator (an autoscaler, a test).
LOAD_ANNOTATION = "specserving.io/load"
TEMPLATE_HASH = "pod-template-hash"


@dataclass(frozen=True, slots=True)
class ChildRef:
    """Identity of a child: group, kind and name (the version may change without the object changing)."""

    group: str
    kind: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"


# The summaries below are kept for every watched object, and each decoded watch event brings its own copy of
# strings that thousands of objects share (kinds, groups, roles, phases, an owner's uid): interned, all the
# summaries hold one copy. A settled child took 790 bytes before, 480 after (tracemalloc, 3,300 bench children).
def ref_of(obj: dict[str, Any]) -> ChildRef:
    return ChildRef(intern(obj["apiVersion"].rpartition("/")[0]), intern(obj["kind"]), obj["metadata"]["name"])


def family_of(obj: dict[str, Any], source: str) -> tuple[str, str, str, str]:
    """The family a child packs with (compact.py): where it comes from (a rendering, a watch), its apiVersion and
    kind, and its pool role. Not its name: that carries the owner's name and the revision."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return source, str(obj.get("apiVersion", "")), str(obj.get("kind", "")), str(labels.get(L.ROLE, ""))


@dataclass(frozen=True, slots=True)
class Workload:
    """The replica counts of one pool's Deployment or LeaderWorkerSet."""

    kind: str
    name: str
    spec_replicas: int
    generation: int
    observed_generation: int
    replicas: int
    ready: int
    updated: int
    # The message of a Progressing=False/ProgressDeadlineExceeded condition, if the workload has one.
    deadline_exceeded: str | None = None
    # The message of a ReplicaFailure=True condition: the API server refused to create its pods (Pod Security
    # admission, a quota, a LimitRange).
    replica_failure: str | None = None
    # The Pod Security level its pod template needs, and what keeps it from the next stricter one (podsecurity.py).
    pod_level: str = ""
    pod_level_reasons: tuple[str, ...] = ()
    role: str = ""
    # The PD-contract revision of the workload ("" for workloads from before revisions), and the one its pod
    # template carries (what the router's pods pair).
    revision: str = ""
    template_revision: str = ""
    # Pods per replica: a LeaderWorkerSet's group size, 1 for a Deployment.
    group_size: int = 1

    @property
    def current(self) -> bool:
        """The workload controller has seen the latest spec, so the counts describe it."""
        return self.observed_generation >= self.generation

    @property
    def settled(self) -> bool:
        """Every replica runs the latest template and is Ready, and no older one is left."""
        return (self.current and self.updated >= self.spec_replicas and self.replicas == self.spec_replicas
                and self.ready >= self.spec_replicas)


def workload_of(body: dict[str, Any]) -> Workload:
    """Summarise a Deployment or LeaderWorkerSet (both report replicas, readyReplicas, updatedReplicas)."""
    meta, spec, status = body.get("metadata", {}), body.get("spec", {}), body.get("status") or {}
    labels = meta.get("labels") or {}
    template = spec.get("template") or (spec.get("leaderWorkerTemplate") or {}).get("leaderTemplate") or {}
    template_labels = (template.get("metadata") or {}).get("labels") or {}
    deadline = replica_failure = None
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Progressing" and cond.get("status") == "False" \
                and cond.get("reason") == "ProgressDeadlineExceeded":
            deadline = cond.get("message") or "progress deadline exceeded"
        if cond.get("type") == "ReplicaFailure" and cond.get("status") == "True":
            replica_failure = cond.get("message") or cond.get("reason") or "pods could not be created"
    level, reasons = required_level(template.get("spec") or {})
    return Workload(
        kind=intern(body.get("kind", "")),
        name=meta.get("name", ""),
        spec_replicas=int(spec.get("replicas", 1)),
        generation=int(meta.get("generation", 0)),
        observed_generation=int(status.get("observedGeneration", 0)),
        replicas=int(status.get("replicas", 0)),
        ready=int(status.get("readyReplicas", 0)),
        updated=int(status.get("updatedReplicas", 0)),
        deadline_exceeded=deadline,
        replica_failure=replica_failure,
        pod_level=intern(level),
        pod_level_reasons=tuple(intern(r) for r in reasons),
        role=intern(labels.get(L.ROLE, "")),
        revision=intern(labels.get(L.REVISION, "")),
        template_revision=intern(template_labels.get(L.REVISION, "")),
        group_size=int((spec.get("leaderWorkerTemplate") or {}).get("size", 1)),
    )


@dataclass(eq=False, slots=True)
class Child:
    """One observed child: identity, owner, and its body without status and managedFields (for drift checks).

    The body is kept packed (compact.py, as packed.py keeps renderings) until a pass compares it with
    the rendering, and dropped once it matched: `settle` keeps that verdict (the rendering's digest) instead.
    Decoded, the watch bodies of the children were the largest thing kept per SpecServing, and in a burst every
    child holds one until its SpecServing's pass runs: the 11 children of one bench SpecServing, as the API server
    returns them, take 108 KiB decoded and 9.0 KiB packed, for about 15 microseconds to pack a Deployment and 9 to
    unpack it. The next watch event for the child brings a whole body again."""

    ref: ChildRef
    api_version: str
    uid: str
    resource_version: str
    owner_uids: tuple[str, ...]
    raw: bytes | None = field(repr=False)
    # The preset dictionary raw was packed against (compact.py): shared by every child of the family.
    dictionary: bytes = field(repr=False)
    workload: Workload | None = None
    # The digest of the rendering this child's body matched, once settled (raw is then None).
    in_sync: str = ""

    @property
    def whole(self) -> bool:
        """The watch's body is still here (not settled yet)."""
        return self.raw is not None

    @property
    def body(self) -> dict[str, Any] | None:
        """The body, decoded afresh on each read; None once settled."""
        return unpack(self.raw, self.dictionary) if self.raw is not None else None

    def settle(self, digest: str) -> None:
        self.raw, self.in_sync = None, digest


def child_of(body: dict[str, Any], workload: bool = False) -> Child:
    meta = body.get("metadata", {})
    trimmed = {k: v for k, v in body.items() if k != "status"}
    trimmed["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    raw, dictionary = pack(trimmed, family_of(body, "watch"))
    return Child(
        ref=ref_of(body),
        api_version=intern(body["apiVersion"]),
        uid=meta.get("uid", ""),
        resource_version=meta.get("resourceVersion", ""),
        owner_uids=tuple(intern(o.get("uid", "")) for o in meta.get("ownerReferences") or []),
        raw=raw,
        dictionary=dictionary,
        workload=workload_of(body) if workload else None,
    )


@dataclass(frozen=True, slots=True)
class Termination:
    reason: str
    message: str
    exit_code: int


@dataclass(frozen=True, slots=True)
class ContainerState:
    """The parts of a container status that say whether it is failing."""

    name: str
    ready: bool
    restarts: int
    waiting_reason: str | None = None
    waiting_message: str | None = None
    terminated: Termination | None = None
    last_terminated: Termination | None = None


def _termination(state: dict[str, Any] | None) -> Termination | None:
    t = (state or {}).get("terminated")
    if not t:
        return None
    return Termination(reason=t.get("reason") or "", message=(t.get("message") or "").strip(),
                       exit_code=int(t.get("exitCode", 0)))


def container_of(cs: dict[str, Any]) -> ContainerState:
    waiting = (cs.get("state") or {}).get("waiting") or {}
    return ContainerState(
        name=intern(cs.get("name", "")),
        ready=bool(cs.get("ready")),
        restarts=int(cs.get("restartCount", 0)),
        waiting_reason=waiting.get("reason"),
        waiting_message=waiting.get("message"),
        terminated=_termination(cs.get("state")),
        last_terminated=_termination(cs.get("lastState")),
    )


@dataclass(frozen=True, slots=True)
class Pod:
    """One pool pod as the status and the deletion-cost logic need it."""

    name: str
    uid: str
    role: str
    phase: str
    ready: bool
    deleting: bool
    revision: str = ""
    ip: str | None = None
    template_hash: str | None = None
    deletion_cost: str | None = None
    load: str | None = None
    reason: str | None = None
    message: str | None = None
    containers: tuple[ContainerState, ...] = ()
    # The scheduler's message while the pod cannot be placed (PodScheduled False, Unschedulable).
    unschedulable: str | None = None
    # The LeaderWorkerSet group the pod belongs to (None for a Deployment's pod).
    group: str | None = None


def pod_of(body: dict[str, Any]) -> Pod:
    meta, status = body.get("metadata", {}), body.get("status") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    statuses = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    return Pod(
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        role=intern(labels.get(L.ROLE, "")),
        revision=intern(labels.get(L.REVISION, "")),
        phase=intern(status.get("phase") or "Pending"),
        ready=ready,
        deleting=bool(meta.get("deletionTimestamp")),
        ip=status.get("podIP"),
        template_hash=labels.get(TEMPLATE_HASH),
        deletion_cost=annotations.get(DELETION_COST),
        load=annotations.get(LOAD_ANNOTATION),
        reason=status.get("reason"),
        message=status.get("message"),
        containers=tuple(container_of(cs) for cs in statuses),
        unschedulable=next((c.get("message") or "unschedulable" for c in status.get("conditions") or []
                            if c.get("type") == "PodScheduled" and c.get("status") == "False"
                            and c.get("reason") == "Unschedulable"), None),
        group=labels.get(L.LWS_GROUP_INDEX),
    )
