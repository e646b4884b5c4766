"""The converge loop of one SpecServing: plan, resolve the image (starting its build if needed), apply what
drifted, prune what is no longer rendered, write status.

Level-based: `converge` reads the latest SpecServing and what the watches saw (kopf indexes, in memory), so the
same function serves the create/update/resume handler, child and pod events, and the periodic resync. Work for one
SpecServing runs under its own lock; events that arrive meanwhile coalesce into one more pass. A pass that finds
nothing to change makes no API request at all.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from specserving import API_VERSION, KIND, PLURAL
from specserving.api.naming import child_name
from specserving.imagebuild.job import build_objects, owned_by
from specserving.imagebuild.planning import BUILD
from specserving.kube import ApiError, Kube, Resource
from specserving.metrics import APPLIED, BLOCKED, ERROR, REJECTED, Metrics
from specserving.reconcile import conditions as C
from specserving.reconcile import costs
from specserving.reconcile import reasons as R
from specserving.reconcile import status as S
from specserving.reconcile.drift import needs_apply, prunable
from specserving.reconcile.image import BuildConfig, ImageVerdict, remembered, resolve
from specserving.reconcile.kinds import CHILD_KINDS, ChildKind, kind_of
from specserving.reconcile.observed import DELETION_COST, Child, ChildRef, Pod, Workload, ref_of
from specserving.reconcile.plan import Plan, make_plan, missing_builder
from specserving.rendering import labels as L

log = logging.getLogger("specserving.reconcile")

Key = tuple[str, str]  # (namespace, name)
SPECSERVINGS = Resource(API_VERSION, KIND, PLURAL, True)
PODS = Resource("v1", "Pod", "pods", True)

# kopf index ids: handlers register them, the controller reads them.
OWNER_INDEX = "specservings_by_name"
POD_INDEX = "pods_by_instance"
BUILD_JOB_INDEX = "build_jobs_by_key"  # (namespace, build key) -> BuildJob
BUILD_POD_INDEX = "build_pods_by_key"  # (namespace, build key) -> BuildPod


def child_index(kind: ChildKind) -> str:
    return f"{kind.plural}_by_instance"


DEPENDENCY_RETRY_SECONDS = 30.0
APPLY_RETRY_SECONDS = 60.0
MAX_BACKOFF_SECONDS = 60.0
LOAD_PROBE_TIMEOUT = 1.0
LOAD_PROBE_PODS = 32
COST_SETTLE_SECONDS = 2.0
# A build Job this process created is not created again while the watch has not shown it yet.
BUILD_SETTLE_SECONDS = 30.0


class Rejected(Exception):
    """The spec is invalid: no children. Retrying cannot help until the spec changes."""


class Gone(Exception):
    """The SpecServing was deleted while a pass ran (its status write found no object), or its namespace is being
    deleted (the API server refuses new children there): nothing is left to do; the watch's DELETED event forgets
    it."""


class Blocked(Exception):
    """The children cannot be applied now (a missing CRD, an image that cannot run the spec, a refused child)."""

    def __init__(self, reason: str, message: str, retry: float | None) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason, self.message, self.retry = reason, message, retry


@dataclass
class _Applied:
    digest: str
    resource_version: str
    uid: str = ""


@dataclass
class OwnerState:
    """What the operator remembers about one SpecServing between passes (per process; rebuilt on restart)."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    dirty: bool = False
    draining: bool = False
    plan: Plan | None = None
    applied: dict[ChildRef, _Applied] = field(default_factory=dict)
    # The uid of the last deletion the watch showed per child: an object we applied that is already gone must be
    # applied again, even when its DELETED event came before our apply call returned.
    deleted: dict[ChildRef, str] = field(default_factory=dict)
    applied_generation: int | None = None
    # The status before and after our last write, to tell a stale watch view from a fresh one.
    written: tuple[Any, dict[str, Any]] | None = None
    # The last (status, reason) posted as an event per condition type, so no transition is posted twice.
    posted: dict[str, tuple[str, str]] = field(default_factory=dict)
    retry: asyncio.TimerHandle | None = None
    failures: int = 0
    # The digests of a rendering (renderings are cached per plan), so a pass does not hash every child again.
    digests: tuple[tuple[dict[str, Any], ...], tuple[str, ...]] | None = None


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def digest(obj: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Controller:
    """Converges SpecServings. One per operator process; kopf handlers call into it."""

    def __init__(self, kube: Kube, metrics: Metrics, *, probe_load: bool = True,
                 clock: Callable[[], str] = _now, build: BuildConfig | None = None) -> None:
        self.kube, self.metrics, self.probe_load, self.clock = kube, metrics, probe_load, clock
        self.build = build or BuildConfig()
        self.indices: Mapping[str, Any] = {}
        self.owners: dict[Key, OwnerState] = {}
        # Build Jobs this process created, (namespace, name) -> monotonic time, until the watch shows them.
        self.started: dict[Key, float] = {}

    # -- what the watches saw -------------------------------------------------------------------------------

    def _store(self, index_id: str, key: Key) -> list[Any]:
        index = self.indices.get(index_id)
        return list(index[key]) if index is not None and key in index else []

    def owner(self, key: Key) -> dict[str, Any] | None:
        found = self._store(OWNER_INDEX, key)
        return found[0] if found else None

    def children(self, key: Key) -> dict[ChildRef, Child]:
        found: dict[ChildRef, Child] = {}
        for kind in CHILD_KINDS:
            for child in self._store(child_index(kind), key):
                found[child.ref] = child
        return found

    def pods(self, key: Key) -> list[Pod]:
        return self._store(POD_INDEX, key)

    def known(self) -> list[Key]:
        index = self.indices.get(OWNER_INDEX)
        return list(index) if index is not None else []

    def build_job(self, namespace: str, build_key: str) -> Any:
        found = self._store(BUILD_JOB_INDEX, (namespace, build_key))
        return found[0] if found else None

    # -- entry points -----------------------------------------------------------------------------------------

    def state(self, key: Key) -> OwnerState:
        return self.owners.setdefault(key, OwnerState())

    async def reconcile(self, key: Key, body: Mapping[str, Any]) -> str:
        """The create/update/resume path: converge now; Rejected and Blocked propagate to the handler."""
        st = self.state(key)
        async with st.lock:
            return await self.converge(key, dict(body))

    def poke(self, key: Key) -> None:
        """Something about this SpecServing changed (a child, a pod, a resync): converge soon, once."""
        if self.owner(key) is None:
            return
        st = self.state(key)
        st.dirty = True
        if not st.draining:
            st.draining = True
            asyncio.get_running_loop().create_task(self._drain(key, st))

    async def _drain(self, key: Key, st: OwnerState) -> None:
        try:
            while st.dirty:
                # The lock is taken per pass, not across the loop: the kopf handler of this SpecServing waits on
                # it, and kopf updates this SpecServing's index entry (a new generation, its deletion) only after
                # that handler returns. Held across passes that pokes keep renewing (resyncs, pod and child events),
                # it starved the handler, so passes went on with a stale body, or for an owner already deleted.
                async with st.lock:
                    st.dirty = False
                    body = self.owner(key)
                    if body is None:
                        return
                    try:
                        await self.converge(key, body)
                        st.failures = 0
                    except Rejected:
                        pass
                    except Blocked as exc:
                        if exc.retry:
                            self._retry_later(key, st, exc.retry)
                    except Exception as exc:  # noqa: BLE001 - retried with backoff, never lost
                        st.failures += 1
                        delay = min(MAX_BACKOFF_SECONDS, 2.0 ** st.failures)
                        log.warning("%s/%s: converge failed (retry in %.0fs): %s", *key, delay, exc)
                        self._retry_later(key, st, delay)
        finally:
            st.draining = False

    def _retry_later(self, key: Key, st: OwnerState, delay: float) -> None:
        if st.retry is not None:
            st.retry.cancel()
        st.retry = asyncio.get_running_loop().call_later(delay, self.poke, key)

    def build_event(self, namespace: str, build_key: str, name: str, deleted: bool = False) -> None:
        """A build Job or its pod changed: converge every SpecServing waiting on (or built by) that build."""
        if deleted:
            self.started.pop((namespace, name), None)
        for key, st in list(self.owners.items()):
            ip = st.plan.image_plan if st.plan is not None else None
            if key[0] == namespace and ip is not None and ip.build_key == build_key:
                self.poke(key)

    def child_event(self, key: Key, ref: ChildRef, deleted: bool, uid: str = "") -> None:
        if deleted:
            st = self.state(key)
            st.applied.pop(ref, None)
            st.deleted[ref] = uid
        self.poke(key)

    def forget(self, key: Key) -> None:
        """The SpecServing is gone (its children go with it through owner references)."""
        st = self.owners.pop(key, None)
        if st and st.retry:
            st.retry.cancel()
        self.metrics.set_state(key[0], key[1], None)

    async def resync(self) -> None:
        for key in self.known():
            self.poke(key)

    # -- converge -----------------------------------------------------------------------------------------------

    async def converge(self, key: Key, body: dict[str, Any]) -> str:
        """One pass for the SpecServing `body`; returns the result label (see specserving.metrics)."""
        started = time.monotonic()
        result, reason = ERROR, None
        try:
            result = await self._converge(key, body)
            return result
        except Gone as exc:
            log.info("%s", exc)
            result = APPLIED
            return result
        except Rejected:
            result, reason = REJECTED, R.INVALID_SPEC
            raise
        except Blocked as exc:
            result, reason = BLOCKED, exc.reason
            raise
        except Exception as exc:
            reason = type(exc).__name__
            raise
        finally:
            self.metrics.observe_reconcile(result, time.monotonic() - started, reason)

    async def _converge(self, key: Key, body: dict[str, Any]) -> str:
        meta = body["metadata"]
        if meta.get("deletionTimestamp"):
            return APPLIED  # the garbage collector is removing the children; restoring them would fight it
        st = self.state(key)
        uid, generation = meta.get("uid", ""), int(meta.get("generation") or 0)
        if st.plan is None or (st.plan.uid, st.plan.generation) != (uid, generation):
            if st.plan is not None and st.plan.uid != uid:
                st.applied.clear()
                st.posted.clear()
            st.plan = await asyncio.to_thread(make_plan, body, self.build)
        plan = st.plan
        outcome = S.Outcome(admitted=plan.admitted, errors=plan.errors, warnings=plan.warnings)
        problem: Exception | None = None
        verdict: ImageVerdict | None = None
        if not plan.admitted:
            problem = Rejected("; ".join(plan.errors))
        else:
            try:
                verdict = await self._image(key, st, body, plan)
                outcome = S.Outcome(admitted=True, warnings=plan.warnings, image=verdict)
                if verdict.failed:
                    retry = APPLY_RETRY_SECONDS if verdict.reason == R.APPLY_FAILED else None
                    problem = Blocked(verdict.reason, verdict.message, retry=retry)
                elif verdict.image is not None:  # None: building; no pool starts before the image is proven
                    assert plan.spec is not None
                    unrunnable = missing_builder(plan.spec, verdict.image, self.build.table)
                    if unrunnable:
                        raise Blocked(R.IMAGE_LACKS_BUILDER, unrunnable, retry=None)
                    children = plan.children_for(verdict.image)
                    await self._check_kinds(children)
                    await self._apply(key, st, body, plan, children)
            except Blocked as exc:
                problem = exc
            except ApiError as exc:
                if exc.namespace_terminating:
                    raise Gone(f"{key[0]}/{key[1]}: its namespace is being deleted; no child is applied") from None
                if exc.status in (0, 409, 429) or exc.status >= 500:
                    raise  # transient: retried with backoff, status untouched
                problem = Blocked(R.APPLY_FAILED, str(exc), retry=APPLY_RETRY_SECONDS)
                await self._event(body, R.CHILD_APPLY_FAILED, str(exc))
        if isinstance(problem, Blocked):
            outcome = S.Outcome(admitted=True, warnings=plan.warnings, blocked_reason=problem.reason,
                                blocked_message=problem.message, image=verdict)
        await self._report(key, st, body, plan, outcome)
        if problem is not None:
            raise problem
        return APPLIED

    async def _check_kinds(self, children: Iterable[dict[str, Any]]) -> None:
        missing = []
        for api_version, kind in sorted({(c["apiVersion"], c["kind"]) for c in children}):
            if await asyncio.to_thread(self.kube.resource, api_version, kind) is None:
                row = kind_of({"apiVersion": api_version, "kind": kind})
                missing.append(f"{kind} ({api_version}) is not served by this cluster (CRD {row.crd}): "
                               f"{row.missing or 'install its CRD'}")
        if missing:
            raise Blocked(R.DEPENDENCY_MISSING, "; ".join(missing), retry=DEPENDENCY_RETRY_SECONDS)

    async def _apply(self, key: Key, st: OwnerState, body: dict[str, Any], plan: Plan,
                     rendered: tuple[dict[str, Any], ...]) -> None:
        observed = self.children(key)
        await self._prepare_scale_down(key, body, plan, observed)
        created, repaired = [], []
        if st.digests is None or st.digests[0] is not rendered:
            st.digests = (rendered, tuple(digest(d) for d in rendered))
        pending: list[tuple[ChildRef, dict[str, Any], str, Child | None]] = []
        for desired, dig in zip(rendered, st.digests[1], strict=True):
            ref = ref_of(desired)
            seen, mine = observed.get(ref), st.applied.get(ref)
            if mine is not None and mine.digest == dig and (
                    seen.resource_version == mine.resource_version if seen is not None
                    else st.deleted.get(ref) != mine.uid):
                continue  # applied by us and unchanged since (or the watch has not caught up yet)
            if not needs_apply(desired, seen):
                st.applied[ref] = _Applied(dig, seen.resource_version if seen else "", seen.uid if seen else "")
                continue
            pending.append((ref, desired, dig, seen))
        # The children of one wave go to the API server at once. Workloads wait for the wave before them: a pod
        # that names a ServiceAccount not created yet is refused, and its ReplicaSet then backs off.
        for workloads in (False, True):
            wave = [item for item in pending if kind_of(item[1]).workload is workloads]
            answers = await asyncio.gather(*(asyncio.to_thread(self._apply_child, desired)
                                             for _, desired, _, _ in wave), return_exceptions=True)
            failure: BaseException | None = None
            for (ref, desired, dig, seen), out in zip(wave, answers, strict=True):
                if isinstance(out, BaseException):
                    failure = failure or out
                    continue
                rv = out.get("metadata", {}).get("resourceVersion", "")
                changed = seen is None or rv != seen.resource_version
                self.metrics.child_applies.labels(desired["kind"], "changed" if changed else "unchanged").inc()
                st.applied[ref] = _Applied(dig, rv, out.get("metadata", {}).get("uid", ""))
                if seen is None:
                    created.append(str(ref))
                elif changed:
                    repaired.append(str(ref))
            if failure is not None:
                raise failure
        new_generation = st.applied_generation != plan.generation
        st.applied_generation = plan.generation
        if created or repaired:
            names = ", ".join(created + repaired)
            if new_generation:
                await self._event(body, R.CHILDREN_APPLIED, f"applied generation {plan.generation}: {names}")
            else:
                await self._event(body, R.DRIFT_REPAIRED, "restored children changed or deleted outside the "
                                  f"operator: {names}")
        for child in prunable(rendered, observed.values(), plan.uid):
            row = kind_of({"apiVersion": child.api_version, "kind": child.ref.kind})
            res = await asyncio.to_thread(self.kube.resource, child.api_version, child.ref.kind)
            if res is None:
                continue
            await asyncio.to_thread(self.kube.delete, res, key[0], child.ref.name, child.uid)
            st.applied.pop(child.ref, None)
            await self._event(body, R.CHILD_PRUNED, f"deleted {child.ref} ({row.kind} no longer rendered by "
                              f"generation {plan.generation})")

    def _apply_child(self, desired: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply of one rendered child (in a worker thread); the API server's answer."""
        res = self.kube.resource(desired["apiVersion"], desired["kind"])
        assert res is not None  # _check_kinds ran
        out: dict[str, Any] = self.kube.apply(res, desired)
        return out

    # -- the image: base, build in progress, or built -----------------------------------------------------------

    async def _image(self, key: Key, st: OwnerState, body: dict[str, Any], plan: Plan) -> ImageVerdict:
        """Resolve the image of an admitted plan; create the build Job when one is needed and none exists."""
        ip = plan.image_plan
        assert ip is not None
        namespace = key[0]
        if ip.decision != BUILD or not ip.build_key or not ip.build_name:
            return resolve(ip, self.build.table)
        mine = self._old_status(st, body)
        others = (b.get("status") for k in self.known() if k[0] == namespace and k != key
                  if (b := self.owner(k)) is not None)
        verdict = resolve(ip, self.build.table, remembered_ref=remembered([mine, *others], ip),
                          job=self.build_job(namespace, ip.build_key),
                          pods=self._store(BUILD_POD_INDEX, (namespace, ip.build_key)))
        if not verdict.start_build:
            return verdict
        since = self.started.get((namespace, ip.build_name))
        if since is not None and time.monotonic() - since < BUILD_SETTLE_SECONDS:
            return verdict  # created by this process a moment ago; the watch has not shown it yet
        try:
            await self._start_build(namespace, body, plan)
        except ApiError as exc:
            if exc.status in (0, 409, 429) or exc.status >= 500:
                raise
            await self._event(body, R.CHILD_APPLY_FAILED, f"cannot create the build Job {ip.build_name}: {exc}")
            return ImageVerdict(C.FALSE, R.APPLY_FAILED, f"cannot create the build Job {ip.build_name}: {exc}; "
                                "no pool is started", status_image=verdict.status_image)
        return verdict

    async def _start_build(self, namespace: str, body: dict[str, Any], plan: Plan) -> None:
        """Create the shared build Job, then its context ConfigMap owned by the Job (the Job's TTL takes both).
        Neither is owned by a SpecServing: every SpecServing on the same base waits on the same Job."""
        ip, spec = plan.image_plan, plan.spec
        assert ip is not None and spec is not None and ip.build_name
        if self.build.context is None:
            raise Blocked(R.BUILD_FAILED, "the operator was started without a build context", retry=None)
        ref = spec.image.build.push_secret_ref
        config_map, job = build_objects(ip, self.build.context, namespace=namespace,
                                        push_secret=ref.name if ref else self.build.push_secret,
                                        settings=self.build.settings)
        jobs = await asyncio.to_thread(self.kube.resource, "batch/v1", "Job")
        config_maps = await asyncio.to_thread(self.kube.resource, "v1", "ConfigMap")
        assert jobs is not None and config_maps is not None  # built-in kinds
        created = await asyncio.to_thread(self.kube.apply, jobs, job)
        await asyncio.to_thread(self.kube.apply, config_maps, owned_by(config_map, created))
        self.started[(namespace, ip.build_name)] = time.monotonic()
        self.metrics.child_applies.labels("Job", "changed").inc()
        log.info("%s/%s: started build Job %s: %s -> %s", namespace, body["metadata"]["name"], ip.build_name,
                 ip.base, ip.target)
        await self._event(body, R.BUILD_STARTED, f"created build Job {ip.build_name}: {ip.base} -> {ip.target} "
                          f"(the probe requires a PD-decode builder for {ip.algorithm})")

    # -- scale-down: which decode pod goes first ------------------------------------------------------------------

    async def _prepare_scale_down(self, key: Key, body: dict[str, Any], plan: Plan,
                                  observed: Mapping[ChildRef, Child]) -> None:
        assert plan.spec is not None
        wanted = plan.spec.decode.replicas
        current = next((c.workload for c in observed.values() if c.workload and c.ref.kind == "Deployment"
                        and c.ref.name == child_name(key[1], L.DECODE)), None)
        if current is None or wanted >= current.spec_replicas:
            return
        pods = costs.candidates(p for p in self.pods(key) if p.role == L.DECODE)
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
            await self._event(body, R.DELETION_COST_SET, f"decode scales from {current.spec_replicas} to {wanted} "
                              f"replicas; pod-deletion-cost from running requests (lowest goes first): {detail}")

    async def _await_costs(self, key: Key, changes: Mapping[str, str]) -> None:
        """Give the watches (ours, and so the ReplicaSet controller's) a moment to see the new costs."""
        deadline = time.monotonic() + COST_SETTLE_SECONDS
        while time.monotonic() < deadline:
            seen = {p.name: p.deletion_cost for p in self.pods(key)}
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

    # -- status ---------------------------------------------------------------------------------------------------

    def _workloads(self, key: Key) -> dict[str, Workload | None]:
        observed = self.children(key)
        out: dict[str, Workload | None] = {}
        for role in S.POOLS:
            name = child_name(key[1], role)
            out[role] = next((c.workload for c in observed.values() if c.workload and c.ref.name == name), None)
        return out

    def _old_status(self, st: OwnerState, body: dict[str, Any]) -> dict[str, Any] | None:
        seen = body.get("status")
        if st.written is not None and seen == st.written[0]:
            return st.written[1]  # the watch still shows the status from before our last write
        return seen

    async def _report(self, key: Key, st: OwnerState, body: dict[str, Any], plan: Plan, outcome: S.Outcome) -> None:
        old = self._old_status(st, body)
        workloads = self._workloads(key)
        obs = S.Observation(
            name=key[1], namespace=key[0], generation=plan.generation, outcome=outcome, desired=plan.desired(),
            workloads=workloads, pods=self.pods(key), old=old,
            image=outcome.image.status_image if outcome.image is not None else plan.image_status(),
            router_port=plan.spec.router.port if plan.spec else None)
        new = S.compute(obs, self.clock())
        patch = S.patch_for(old, new)
        if patch is not None:
            try:
                await asyncio.to_thread(self.kube.merge_patch, SPECSERVINGS, key[0], key[1], {"status": patch},
                                        "status")
            except ApiError as exc:
                if exc.not_found:
                    raise Gone(f"{key[0]}/{key[1]} was deleted during the pass") from None
                raise
            self.metrics.status_writes.inc()
            st.written = (body.get("status"), new)
        for t in C.transitions((old or {}).get("conditions"), new["conditions"]):
            if st.posted.get(t.type) != (t.status, t.reason):
                st.posted[t.type] = (t.status, t.reason)
                await self._event(body, t.reason, f"{t.type} is {t.status}: {t.message}", warning=t.warning)
        desired = plan.desired() or {}
        self.metrics.set_state(key[0], key[1], new["phase"], {
            role: (w.ready if w else 0, desired.get(role)) for role, w in workloads.items()})

    async def _event(self, body: dict[str, Any], reason: str, message: str, warning: bool | None = None) -> None:
        warn = reason in R.WARNING_REASONS if warning is None else warning
        try:
            await asyncio.to_thread(self.kube.create_event, body, "Warning" if warn else "Normal", reason, message)
        except ApiError as exc:
            # A namespace being deleted refuses new Events while its SpecServings are still being removed.
            (log.debug if exc.namespace_terminating else log.warning)(
                "cannot post event %s on %s: %s", reason, body["metadata"]["name"], exc)
