"""The converge loop of one SpecServing: plan, resolve the image (starting its build if needed), apply what
drifted, prune what is no longer rendered, write status.

Level-based: `converge` reads the latest SpecServing and what the watches saw (kopf indexes, in memory), so the
same function serves the create/update/resume handler, child and pod events, and the periodic resync. Work for one
SpecServing runs under its own lock; events that arrive meanwhile coalesce into one more pass (reconcile/queue.py).
A pass that finds nothing to change makes no API request at all. The image and its build (reconcile/building.py)
and the decode pool's scale-down order (reconcile/scaledown.py) have modules of their own.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeGuard

from specserving import API_VERSION, KIND, PLURAL
from specserving.api.naming import child_name
from specserving.kube import ApiError, Kube, Resource
from specserving.metrics import APPLIED, BLOCKED, ERROR, REJECTED, Metrics
from specserving.reconcile import conditions as C
from specserving.reconcile import reasons as R
from specserving.reconcile import status as S
from specserving.reconcile.accepted import Accepted, Shape
from specserving.reconcile.building import Builds
from specserving.reconcile.calls import DISPATCHER, Ticket, Urgency, call, running_at
from specserving.reconcile.compact import pack, unpack
from specserving.reconcile.drift import needs_apply, prunable
from specserving.reconcile.errors import Blocked, Gone, Rejected
from specserving.reconcile.events import post
from specserving.reconcile.image import BuildConfig, ImageVerdict
from specserving.rendering import labels as L
from specserving.rendering.kinds import kind_of
from specserving.reconcile import rollouts
from specserving.reconcile.observed import Child, ChildRef, Workload
from specserving.reconcile.packed import fingerprint
from specserving.reconcile.plan import Plan, make_plan, missing_builder
from specserving.reconcile.queue import WorkQueue
from specserving.reconcile.scaledown import ScaleDown
from specserving.reconcile.serving import ServingChecks, Target, rollout_of
from specserving.reconcile.state import Applied, Key, OwnerState, RolloutState
from specserving.rendering.image import ResolvedImage
from specserving.policy import ServingPolicy
from specserving.rollout import ROLES, Strategy, decide
from specserving.reconcile.watched import Watched

log = logging.getLogger("specserving.reconcile")

SPECSERVINGS = Resource(API_VERSION, KIND, PLURAL, True)

DEPENDENCY_RETRY_SECONDS = 30.0
APPLY_RETRY_SECONDS = 60.0


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())  # a third of datetime.now(UTC).strftime's cost


class Controller(Watched):
    """Converges SpecServings. One per operator process; kopf handlers call into it."""

    def __init__(self, kube: Kube, metrics: Metrics, *, probe_load: bool = True,
                 clock: Callable[[], str] = _now, build: BuildConfig | None = None,
                 serving_checks: bool = True, policy: ServingPolicy | None = None) -> None:
        super().__init__()
        self.kube, self.metrics, self.clock = kube, metrics, clock
        self.build = build or BuildConfig()
        self.policy = policy  # the cluster admin's serving-pod policy, checked again before anything is applied
        self.owners: dict[Key, OwnerState] = {}
        self.queue = WorkQueue(self.owner, self.state, self.converge, self.has_owner)
        self.builds = Builds(kube, self.build, metrics, self)
        self.scale_down = ScaleDown(kube, self.pods, probe_load)
        self.serving = ServingChecks(kube, self.poke, enabled=serving_checks)
        self.accepted = Accepted()
        for urgency in Urgency:
            metrics.calls_waiting.labels(urgency.name.lower()).set_function(functools.partial(DISPATCHER.waiting,
                                                                                              urgency))
        # Read by the scrape thread: list() copies the owners in one step, so the loop may change them meanwhile.
        metrics.passes_queued.set_function(lambda: WorkQueue.queued(list(self.owners.values())))

    # -- entry points -----------------------------------------------------------------------------------------

    def state(self, key: Key) -> OwnerState:
        return self.owners.setdefault(key, OwnerState())

    async def reconcile(self, key: Key, body: Mapping[str, Any]) -> str:
        """The create/update/resume path: converge now, ahead of follow-ups and resyncs (reconcile/calls.py);
        Rejected and Blocked propagate to the handler."""
        st = self.state(key)
        if st.ticket is not None:
            st.ticket.raise_to(Urgency.SPEC)  # the pass holding the lock is all that stands before this one
        async with st.lock:
            # Children already applied: a scale or a new spec of a running SpecServing, ahead of new ones.
            with running_at(Ticket(Urgency.SPEC, changes_running=bool(st.applied))):
                return await self.converge(key, dict(body))

    def poke(self, key: Key, urgency: Urgency = Urgency.FOLLOW_UP) -> None:
        """Something about this SpecServing changed (a child, a pod, a resync): converge soon, once."""
        self.queue.poke(key, urgency)

    def build_event(self, namespace: str, build_key: str, name: str, deleted: bool = False) -> None:
        """A build Job or its pod changed: converge every SpecServing waiting on (or built by) that build."""
        if deleted:
            self.builds.job_deleted(namespace, name)
        for key in list(self.owners):
            if self.builds.waits_on(key, namespace, build_key):
                self.poke(key)

    def child_event(self, key: Key, ref: ChildRef, deleted: bool, uid: str = "") -> None:
        # No state: no pass has applied anything for this owner (or it was deleted and forgotten, and the garbage
        # collector is removing its children), so there is nothing to record, and no state to make and keep.
        st = self.owners.get(key) if deleted else None
        if st is not None:
            st.applied.pop(ref, None)
            st.deleted[ref] = uid
        self.poke(key)

    def forget(self, key: Key) -> None:
        """The SpecServing is gone (its children go with it through owner references)."""
        st = self.owners.pop(key, None)
        self.builds.forget(key)
        self.serving.forget(key)
        if st:
            self.queue.cancel(st)
        self.metrics.set_state(key[0], key[1], None)

    async def resync(self) -> None:
        for key in self.known():
            self.poke(key, Urgency.RESYNC)

    # -- converge -----------------------------------------------------------------------------------------------

    async def converge(self, key: Key, body: dict[str, Any]) -> str:
        """One pass for the SpecServing `body`; returns the result label (see specserving.metrics)."""
        await self.watches_listed()
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
            st.plan = await call(make_plan, body, self.build, self.policy)
        plan = st.plan
        # The status this pass starts from: the image resolution reads its remembered digest, the report diffs it.
        old = self._old_status(st, body)
        outcome = S.Outcome(admitted=plan.admitted, errors=plan.errors, warnings=plan.warnings)
        problem: Exception | None = None
        verdict: ImageVerdict | None = None
        if not plan.admitted:
            problem = Rejected("; ".join(plan.errors))
        else:
            try:
                verdict = await self.builds.image(key, body, plan, old)
                outcome = S.Outcome(admitted=True, warnings=plan.warnings, image=verdict)
                if verdict.failed:
                    retry = APPLY_RETRY_SECONDS if verdict.reason in (R.APPLY_FAILED, R.BASE_UNRESOLVED) else None
                    problem = Blocked(verdict.reason, verdict.message, retry=retry)
                elif verdict.image is not None:  # None: building; no pool starts before the image is proven
                    assert plan.spec is not None
                    unrunnable = missing_builder(plan.spec, verdict.image, self.build.table)
                    if unrunnable:
                        raise Blocked(R.IMAGE_LACKS_BUILDER, unrunnable, retry=None)
                    await self._check_kinds(plan.children_for(verdict.image).kinds)
                    await self._apply(key, st, body, plan, verdict.image)
            except Blocked as exc:
                problem = exc
            except ApiError as exc:
                if exc.namespace_terminating:
                    raise Gone(f"{key[0]}/{key[1]}: its namespace is being deleted; no child is applied") from None
                if exc.transient:
                    raise  # retried with backoff, status untouched
                problem = Blocked(R.APPLY_FAILED, str(exc), retry=APPLY_RETRY_SECONDS)
                post(self.kube, body, R.CHILD_APPLY_FAILED, str(exc))
        if isinstance(problem, Blocked):
            outcome = S.Outcome(admitted=True, warnings=plan.warnings, blocked_reason=problem.reason,
                                blocked_message=problem.message, image=verdict)
        await self._report(key, st, body, plan, outcome, old)
        if problem is not None:
            raise problem
        return APPLIED

    async def _check_kinds(self, kinds: Iterable[tuple[str, str]]) -> None:
        missing = []
        for api_version, kind in sorted(set(kinds)):
            served = await self._resource(api_version, kind)
            if served is not None:
                self.kind_served(served.plural)
            else:
                row = kind_of({"apiVersion": api_version, "kind": kind})
                missing.append(f"{kind} ({api_version}) is not served by this cluster (CRD {row.crd}): "
                               f"{row.missing or 'install its CRD'}")
        if missing:
            raise Blocked(R.DEPENDENCY_MISSING, "; ".join(missing), retry=DEPENDENCY_RETRY_SECONDS)

    async def _apply(self, key: Key, st: OwnerState, body: dict[str, Any], plan: Plan, image: ResolvedImage,
                     ) -> None:
        assert plan.spec is not None
        observed = self.children(key)
        # Which revision the pools and the router are at, and the rollout's next step (rollout.decide).
        revisions = rollouts.observe(key, plan.uid, observed, self.pods(key))
        target = plan.revision_for(image)
        wanted = {role: plan.spec.pool(role).replicas for role in ROLES}
        strategy = Strategy.of(plan.spec.rollout)
        decision = decide(target, wanted, strategy, revisions.pools, revisions.router)
        st.rollout = RolloutState(target, decision, strategy.name)
        router_rendered = decision.router == target
        rendered = plan.children_for(image, decision.replicas.get(target), router_rendered)
        port = plan.spec.engine.port
        for role, child in revisions.workloads.get(target, {}).items():
            await self.scale_down.prepare(key, body, port, child.workload, decision.replicas[target][role])
        created, repaired = [], []
        pending: list[tuple[ChildRef, dict[str, Any], str, Child | None]] = []
        for index, (ref, dig) in enumerate(zip(rendered.refs, rendered.digests, strict=True)):
            seen, mine = observed.get(ref), st.applied.get(ref)
            if mine is not None and mine.digest == dig and (
                    seen.resource_version == mine.resource_version if seen is not None
                    else st.deleted.get(ref) != mine.uid):
                if seen is not None and seen.whole:
                    seen.settle(dig)  # what the API server made of our apply of this rendering
                if seen is not None and mine.uid is not seen.uid:
                    # The same version: hold the watch's copies of its strings rather than a second pair.
                    mine.resource_version, mine.uid = seen.resource_version, seen.uid
                continue  # applied by us and unchanged since (or the watch has not caught up yet)
            # A settled child is judged by its digest alone: nothing to decode.
            desired = None if seen is not None and not seen.whole else rendered.child(index)
            if not needs_apply(desired, seen, dig):
                assert seen is not None  # a missing child always needs applying
                seen.settle(dig)
                st.applied[ref] = Applied(dig, seen.resource_version, seen.uid)
                continue
            pending.append((ref, desired if desired is not None else rendered.child(index), dig, seen))
        # One changed child (a scale, most often) is taken by its apply whole or not at all: nothing can be
        # half-applied, so its dry run would only add a round trip; a refusal of its apply reads as one of the dry run.
        lone = len(pending) == 1
        if pending and not lone and st.dry_run_passed is not rendered:
            judged = [desired for _, desired, _, _ in pending if kind_of(desired).spec_shaped]
            if judged:
                # A new SpecServing (none of its workloads exists) is judged by its shape: the same spec, image,
                # replicas and namespace (accepted.py).
                shaped = [ref for ref, (api_version, kind) in zip(rendered.refs, rendered.kinds, strict=True)
                          if kind_of({"apiVersion": api_version, "kind": kind}).spec_shaped]
                creating = len(judged) == len(shaped) and not any(ref in observed for ref in shaped)
                shape = Shape(key[0], plan.spec_digest, image, tuple(sorted((decision.replicas.get(target) or {})
                                                                           .items())), router_rendered) \
                    if creating else None
                if shape is None or not self.accepted.holds(shape):
                    if await self._dry_run(judged) and shape is not None:
                        self.accepted.add(shape)
            st.dry_run_passed = rendered
        # The children of one wave go to the API server at once; a wave waits for the one before it (kinds.py:
        # RoleBindings after their Role, workloads after their ServiceAccount, whose absence would make their
        # ReplicaSet back off).
        for number in sorted({kind_of(item[1]).apply_wave for item in pending}):
            wave = [item for item in pending if kind_of(item[1]).apply_wave == number]
            answers = await asyncio.gather(*(call(self._apply_child, desired)
                                             for _, desired, _, _ in wave), return_exceptions=True)
            failure: BaseException | None = None
            for (ref, desired, dig, seen), out in zip(wave, answers, strict=True):
                if isinstance(out, BaseException):
                    if lone and _invalid(out) and kind_of(desired).spec_shaped:
                        out = _refused([_refusal(desired, out)])
                    failure = failure or out
                    continue
                rv, uid = out
                changed = seen is None or rv != seen.resource_version
                self.metrics.child_applies.labels(desired["kind"], "changed" if changed else "unchanged").inc()
                st.applied[ref] = Applied(dig, rv, uid)
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
                post(self.kube, body, R.CHILDREN_APPLIED, f"applied generation {plan.generation}: {names}")
            else:
                post(self.kube, body, R.DRIFT_REPAIRED, "restored children changed or deleted outside the "
                                  f"operator: {names}")
        await rollouts.move_others(self.kube, self.scale_down, key, body, port, revisions, target, decision)
        keep = rollouts.kept(revisions, target, router_rendered)
        for child in prunable(rendered.refs, observed.values(), plan.uid):
            if child.ref in keep:
                continue
            row = kind_of({"apiVersion": child.api_version, "kind": child.ref.kind})
            res = await self._resource(child.api_version, child.ref.kind)
            if res is None:
                continue
            await call(self.kube.delete, res, key[0], child.ref.name, child.uid)
            st.applied.pop(child.ref, None)
            post(self.kube, body, R.CHILD_PRUNED, f"deleted {child.ref} ({row.kind} no longer rendered by "
                              f"generation {plan.generation})")

    async def _resource(self, api_version: str, kind: str) -> Resource | None:
        """Discovery's answer, from its cache without a thread hop once it has one (every pass checks its kinds)."""
        known = self.kube.cached(api_version)
        if known is not None:
            return known.get(kind)
        return await call(self.kube.resource, api_version, kind)

    def _apply_child(self, desired: dict[str, Any], dry_run: bool = False) -> tuple[str, str]:
        """Server-side apply of one rendered child (in a worker thread); the resourceVersion and uid the API server
        answered, which is all a pass reads of the answer. Asked for as metadata only and cut down here, in the
        thread: a wave's answers wait for its slowest one, and in a burst thousands of whole children waited so."""
        res = self.kube.resource(desired["apiVersion"], desired["kind"])
        assert res is not None  # _check_kinds ran
        meta = self.kube.apply(res, desired, dry_run=dry_run, metadata_only=True).get("metadata") or {}
        return str(meta.get("resourceVersion", "")), str(meta.get("uid", ""))

    async def _dry_run(self, children: list[dict[str, Any]]) -> bool:
        """The API server's dry run of the spec-shaped children a new rendering changes (kinds.py), before any
        child is applied: a child it refuses as invalid (400, 422) blocks the whole rendering
        (InvalidRenderedConfig), so a spec the schema admits but Kubernetes would half-apply changes nothing.

        Any other answer is left to the real apply, which reports it as before: a dry run cannot judge a child that
        needs another one created first (the RBAC check of a RoleBinding looks up its Role, which a dry run has not
        created: 404 under the chart's ServiceAccount, measured), nor a transient failure. True when the API server
        accepted every child."""
        answers = await asyncio.gather(*(call(self._apply_child, child, True) for child in children),
                                       return_exceptions=True)
        refused, unjudged = [], 0
        for child, out in zip(children, answers, strict=True):
            if _invalid(out):
                refused.append(_refusal(child, out))
            elif isinstance(out, ApiError):
                unjudged += 1
                log.debug("dry run of %s %s/%s: %s; left to the apply", child["kind"],
                          child["metadata"].get("namespace"), child["metadata"]["name"], out)
            elif isinstance(out, BaseException):
                raise out
        if refused:
            raise _refused(refused)
        return unjudged == 0  # every child accepted

    # -- status ---------------------------------------------------------------------------------------------------

    def _rollout_view(self, key: Key, st: OwnerState, plan: Plan) -> tuple[dict[str, Workload | None],
                                                                          S.RolloutView | None]:
        """The workloads the pool conditions describe (the serving revision's, and the router), and the rollout
        as the status reports it."""
        pods = self.pods(key)
        revisions = rollouts.observe(key, plan.uid, self.children(key), pods)
        out: dict[str, Workload | None] = {role: None for role in S.POOLS}
        out[L.ROUTER] = revisions.router_workload
        if st.rollout is None:
            # Nothing was applied by this process yet: describe the revision the router pairs, or the only one.
            paired = revisions.router.revision
            only = revisions.workloads.get(paired, {}) if paired in revisions.workloads else \
                next(iter(revisions.workloads.values())) if len(revisions.workloads) == 1 else {}
            for role, child in only.items():
                out[role] = child.workload
            return out, None
        d, target = st.rollout.decision, st.rollout.target
        shown = d.serving if d.serving is not None and d.serving in revisions.workloads else target
        for role, child in revisions.workloads.get(shown, {}).items():
            out[role] = child.workload
        new = [p for p in pods if p.revision == target and p.role in ROLES]
        view = S.RolloutView(target=target, decision=d, strategy=st.rollout.strategy, shown=shown,
                             new_ready={role: sum(1 for p in new if p.role == role and p.ready) for role in ROLES},
                             unschedulable=next((f"pod {p.name}: {p.unschedulable}" for p in new
                                                 if p.unschedulable and not p.deleting), None))
        return out, view

    def _old_status(self, st: OwnerState, body: dict[str, Any]) -> dict[str, Any] | None:
        seen = body.get("status")
        if st.written is None:
            return seen
        if fingerprint(seen) == st.written[0]:
            return unpack(st.written[1], st.written[2])  # the watch still shows the status from before our write
        # The watch has caught up with the write (it only moves forward): later passes need neither the comparison
        # (a JSON dump of the status, a tenth of a pass's CPU in issue 21's N=200 profile) nor the copy.
        st.written = None
        return seen

    async def _report(self, key: Key, st: OwnerState, body: dict[str, Any], plan: Plan, outcome: S.Outcome,
                      old: dict[str, Any] | None) -> None:
        workloads, view = self._rollout_view(key, st, plan)
        pods = self.pods(key)
        rollout = rollout_of(plan.generation, pods)
        checking = self.serving.enabled and plan.spec is not None and plan.spec.router.serving_check == "Enabled"
        desired = plan.desired()
        if desired is not None and view is not None and view.shown != view.target:
            # The serving revision is what the pool conditions describe until the router switches: its replicas
            # are the ones the rollout left it.
            desired = {**desired, **{role: w.spec_replicas for role in ROLES if (w := workloads.get(role))}}
        obs = S.Observation(
            name=key[1], namespace=key[0], generation=plan.generation, outcome=outcome, desired=desired,
            workloads=workloads, pods=pods, old=old, rollout=view,
            image=outcome.image.status_image if outcome.image is not None else plan.image_status(),
            router_port=plan.spec.router.port if plan.spec else None,
            serving_check=checking, serving=self.serving.result(key, rollout))
        new = S.compute(obs, self.clock())
        ready = C.find(new["conditions"], R.READY)
        st.ready = ready is not None and ready["status"] == C.TRUE
        if checking and plan.spec is not None and st.ready:
            model = plan.spec.model.served_model_name or plan.spec.model.path
            self.serving.ensure(key, rollout, Target(key[0], child_name(key[1], L.ROUTER), plan.spec.router.port,
                                                     model))
        else:
            self.serving.stop(key)
        patch = S.patch_for(old, new)
        if patch is not None:
            try:
                await call(functools.partial(self.kube.merge_patch, metadata_only=True), SPECSERVINGS, key[0], key[1],
                           {"status": patch}, "status")
            except ApiError as exc:
                if exc.not_found:
                    raise Gone(f"{key[0]}/{key[1]} was deleted during the pass") from None
                raise
            self.metrics.status_writes.inc()
            st.written = (fingerprint(body.get("status")), *pack(new, "status"))
        if view is not None and view.decision.rolling:
            d = view.decision
            posted = (view.target, d.step or "", d.description)
            if st.rollout_posted != posted:
                st.rollout_posted = posted
                post(self.kube, body, d.step or "", f"rollout from revision {d.source} to {view.target} "
                           f"({view.strategy}): {d.description}")
        for t in C.transitions((old or {}).get("conditions"), new["conditions"]):
            if st.posted.get(t.type) != (t.status, t.reason):
                st.posted[t.type] = (t.status, t.reason)
                if not t.quiet:
                    post(self.kube, body, t.reason, f"{t.type} is {t.status}: {t.message}", warning=t.warning)
        desired = plan.desired() or {}
        self.metrics.set_state(key[0], key[1], new["phase"], {
            role: (w.ready if w else 0, desired.get(role)) for role, w in workloads.items()})


def _invalid(answer: object) -> TypeGuard[ApiError]:
    """The API server refused a child as invalid (400, 422): the spec is at fault, not the moment."""
    return isinstance(answer, ApiError) and answer.status in (400, 422)


def _refusal(child: dict[str, Any], error: ApiError) -> str:
    return f"{child['kind']} {child['metadata']['name']}: {error.message}"


def _refused(refusals: list[str]) -> Blocked:
    """InvalidRenderedConfig: the API server refused these children, and none of the rendering was applied."""
    return Blocked(R.INVALID_RENDERED_CONFIG, "the API server refuses the rendered " + "; ".join(refusals)
                   + "; nothing was applied: fix the spec (this is an operator bug when the spec passed "
                   "`specserving validate`)", retry=APPLY_RETRY_SECONDS)
